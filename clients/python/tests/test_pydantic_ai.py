"""Pydantic AI (pydantic-ai-slim, pinned in .ci/run) with a scripted ``FunctionModel``, no
LLM: the model calls a tool, its answer is lost after the payment landed, the model calls it
again (a new tool-call id) -> one payment, the second answer marked as a replay.

Run: cd clients/python && python -m unittest tests.test_pydantic_ai (IDEM_BIN for the CLI).
"""

from __future__ import annotations

import sys
import unittest

import cli_support
from agent_effects import Payments, lost_answer
from cli_support import need


def missing():
    try:
        import pydantic_ai  # noqa: F401
    except ImportError as e:
        return f"pydantic-ai-slim is not installed ({e}); see .ci/run for the pinned version"
    return cli_support.cli_missing()


WHY = missing()
ARGS = {"customer": "cus_1", "amount_cents": 4900}


def scripted_model(calls):
    """Asks for the charge, asks again (new tool-call id) after a retry prompt, then answers.
    Records each request it saw in ``calls``."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    def model(messages, info):
        calls.append(messages[-1])
        if len(calls) <= 2:
            return ModelResponse(parts=[ToolCallPart("charge_card", dict(ARGS), tool_call_id=f"call-{len(calls)}")])
        return ModelResponse(parts=[TextPart("charged")])

    return FunctionModel(model)


def tool_returns(result):
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    return {
        p.tool_call_id: p
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }


class PydanticAiTest(unittest.IsolatedAsyncioTestCase):
    def agent(self, pay, **toolset_options):
        """The payment tool through IdempotentToolset, with a wrapper outside it that loses
        the first answer (raises ModelRetry from a timeout after the tool returned)."""
        from pydantic_ai import Agent, ModelRetry
        from pydantic_ai.toolsets import FunctionToolset, WrapperToolset

        from idem_runtime.adapters.pydantic_ai import IdempotentToolset

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            return pay.charge(customer, amount_cents)

        class LosesTheFirstAnswer(WrapperToolset):
            lost = 0

            async def call_tool(self, name, tool_args, ctx, tool):
                result = await self.wrapped.call_tool(name, tool_args, ctx, tool)
                if LosesTheFirstAnswer.lost == 0:
                    LosesTheFirstAnswer.lost += 1
                    raise ModelRetry(str(lost_answer())) from lost_answer()
                return result

        idem = IdempotentToolset(FunctionToolset([charge_card]), store=pay.store, **toolset_options)
        self.calls = []
        return Agent(scripted_model(self.calls), toolsets=[LosesTheFirstAnswer(idem)])

    @need(WHY)
    async def test_the_model_asking_again_after_a_lost_answer_charges_once(self):
        from idem_runtime import derive_key

        pay = Payments(self)
        out = await self.agent(pay).run("charge cus_1 49 euros", run_id="run-7")
        self.assertEqual(out.output, "charged")
        self.assertEqual(len(self.calls), 3)
        self.assertEqual(pay.rows(), 1)

        returns = tool_returns(out)
        self.assertEqual(returns["call-2"].content, {"charge": "ch_1", "amount_cents": 4900})
        key = derive_key("run-7", "charge_card", ARGS)
        self.assertEqual(returns["call-2"].metadata, {"idem": {"key": key, "replayed": True}})
        shown = pay.inspect(key)
        self.assertIn("completed", shown)
        self.assertRegex(shown, r"replays\s+1")

    @need(WHY)
    async def test_scoped_by_the_tool_call_id_it_would_charge_twice(self):
        # Why the scope is the run: the model's second call has a new tool-call id.
        pay = Payments(self)
        out = await self.agent(pay, scope=lambda ctx: ctx.tool_call_id).run("charge", run_id="run-8")
        self.assertEqual(out.output, "charged")
        self.assertEqual(pay.rows(), 2)

    @need(WHY)
    async def test_an_enclosing_scope_wins_over_the_run_id(self):
        from idem_runtime import derive_key, scope

        pay = Payments(self)
        with scope("order-123"):
            out = await self.agent(pay).run("charge")
        self.assertEqual(pay.rows(), 1)
        key = derive_key("order-123", "charge_card", ARGS)
        self.assertEqual(tool_returns(out)["call-2"].metadata["idem"]["key"], key)

    @need(WHY)
    async def test_a_tool_that_raises_releases_the_key_and_the_retry_runs(self):
        from pydantic_ai import Agent, ModelRetry
        from pydantic_ai.toolsets import FunctionToolset

        from idem_runtime.adapters.pydantic_ai import IdempotentToolset

        pay = Payments(self)
        tries = []

        def charge_card(customer: str, amount_cents: int) -> dict:
            tries.append(1)
            if len(tries) == 1:
                raise ModelRetry("the card network is down; try again")  # did not charge
            return pay.charge(customer, amount_cents)

        calls = []
        agent = Agent(scripted_model(calls),
                      toolsets=[IdempotentToolset(FunctionToolset([charge_card]), store=pay.store)])
        out = await agent.run("charge", run_id="run-9")
        self.assertEqual(out.output, "charged")
        self.assertEqual(len(tries), 2)
        self.assertEqual(pay.rows(), 1)
        self.assertEqual(tool_returns(out)["call-2"].metadata["idem"]["replayed"], False)

    @need(WHY)
    async def test_only_the_named_tools_are_keyed(self):
        from pydantic_ai import RunContext
        from pydantic_ai.models.test import TestModel
        from pydantic_ai.toolsets import FunctionToolset

        from idem_runtime.adapters.pydantic_ai import IdempotentToolset

        pay = Payments(self)
        reads = []

        def balance(customer: str) -> int:
            reads.append(customer)
            return len(reads)

        toolset = IdempotentToolset(FunctionToolset([balance]), tools=["charge_card"], store=pay.store)
        ctx = RunContext(deps=None, model=TestModel(), usage=None, run_id="run-10")
        tools = await toolset.get_tools(ctx)
        first = await toolset.call_tool("balance", {"customer": "c"}, ctx, tools["balance"])
        second = await toolset.call_tool("balance", {"customer": "c"}, ctx, tools["balance"])
        self.assertEqual((first, second), (1, 2))


def mcp_missing():
    try:
        import fastmcp  # noqa: F401
    except ImportError as e:
        return f"fastmcp (MCPToolset's client) is not installed ({e}); see .ci/run"
    return WHY


class PydanticAiThroughIdemMcp(unittest.IsolatedAsyncioTestCase):
    """``process_tool_call`` sends the runtime's key in ``_meta`` to ``idem mcp`` (policy
    ``key = "runtime"``) in front of ``idem example-mcp``, whose charge_card is not
    idempotent: the model retries after a lost answer, inventing a new key of its own each
    time -> one charge, and the proxy's store shows the replay."""

    @need(mcp_missing())
    async def test_the_runtime_key_in_meta_charges_once_across_the_models_retry(self):
        import sqlite3

        from fastmcp.client.transports import StdioTransport
        from pydantic_ai import Agent, ModelRetry
        from pydantic_ai.mcp import MCPToolset
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel

        from idem_runtime import derive_key
        from idem_runtime.adapters.pydantic_ai import process_tool_call

        pay = Payments(self)
        policy = pay.dir / "policy.toml"
        policy.write_text('[tools.charge_card]\nkey = "runtime"\n')
        charges = pay.dir / "example-mcp.db"
        idem = str(cli_support.idem_binary())
        proxy = ["mcp", "--store", pay.store, "--policy", str(policy), "--",
                 idem, "example-mcp", "--db", str(charges)]
        requests = []

        def model(messages, info):
            requests.append(messages[-1])
            if len(requests) == 1:
                tool = next(t for t in info.function_tools if t.name == "charge_card")
                # runtime mode: the proxy does not ask the model for a key
                assert "idempotency_key" not in tool.parameters_json_schema.get("properties", {})
            if len(requests) <= 2:
                return ModelResponse(parts=[ToolCallPart(
                    "charge_card", {**ARGS, "idempotency_key": f"invented-{len(requests)}"},
                    tool_call_id=f"call-{len(requests)}")])
            return ModelResponse(parts=[TextPart("charged")])

        answers = []

        async def loses_the_first_answer(ctx, call_tool, name, args):
            answers.append(await process_tool_call(ctx, call_tool, name, args))
            if len(answers) == 1:
                raise ModelRetry(str(lost_answer())) from lost_answer()
            return answers[-1]

        toolset = MCPToolset(StdioTransport(idem, proxy), process_tool_call=loses_the_first_answer)
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        async with agent:
            out = await agent.run("charge cus_1 49 euros", run_id="run-mcp")
        self.assertEqual(out.output, "charged")
        self.assertEqual(len(answers), 2)
        self.assertEqual(answers[0], answers[1])
        with sqlite3.connect(charges) as db:
            self.assertEqual(db.execute("SELECT COUNT(*) FROM charges").fetchone()[0], 1)
        shown = cli_support.idem("inspect", derive_key("run-mcp", "charge_card", ARGS),
                                 "--store", pay.store, "--scope", "mcp").stdout
        self.assertRegex(shown, r"replays\s+1")


if __name__ == "__main__":
    sys.exit(unittest.main())
