"""LlamaIndex (llama-index-core, pinned in tests/requirements.txt) with its own
``MockFunctionCallingLLM`` driven by a script, no LLM: a ``FunctionAgent`` calls ``charge_card``;
the first answer is lost on its way back (the tool ran and idem stored its result, then the
agent is told it timed out), so the model asks again (a new tool-call id) -> one row in the
payments table, the second answer a replay marked in the ``ToolOutput``'s ``raw_input``;
without idem, two rows. Then the scope (the run id, the Context's ``idem_scope`` across runs
and agents of an ``AgentWorkflow``), and what LlamaIndex would turn into model text: the
tool's own error, idem not configured (logged at ERROR), a store that cannot be used, a call
in flight.

Run: cd clients/python/tests && python -m unittest test_llamaindex (IDEM_BIN for the CLI).
"""

import asyncio
import threading
import unittest
import uuid

import cli_support
from agent_effects import Payments, run_example
from cli_support import need


def missing():
    try:
        import llama_index.core  # noqa: F401
    except ImportError as e:
        return f"llama-index-core is not installed ({e}); see tests/requirements.txt for the pinned version"
    return cli_support.cli_missing()


WHY = missing()
ARGS = {"customer": "cus_1", "amount_cents": 4900}


def scripted_llm(answers=None):
    """LlamaIndex's ``MockFunctionCallingLLM`` with a response generator that asks for the
    charge, asks again (a new tool-call id) while the last tool answer is an error, up to three
    calls, then answers (an answer without a charge id is an error). ``seen`` holds the tool messages it was shown."""
    from llama_index.core.base.llms.types import ToolCallBlock
    from llama_index.core.llms import ChatMessage, MessageRole
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    asked = []

    def respond(messages, **kwargs):
        tool_messages = [m for m in messages if m.role == MessageRole.TOOL]
        # Only this run's answers: a later run on the same Context starts with the history.
        since = [m for m in messages[max(i for i, m in enumerate(messages) if m.role == MessageRole.USER):]
                 if m.role == MessageRole.TOOL]
        if tool_messages:
            llm.seen.append(tool_messages[-1].content)
        last_failed = since and "ch_" not in since[-1].content  # no charge id: an error of some kind
        if not since or (last_failed and len(since) < 3):
            asked.append(1)
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[
                ToolCallBlock(tool_call_id=f"call-{len(asked)}", tool_name="charge_card", tool_kwargs=dict(ARGS))])
        return ChatMessage(role=MessageRole.ASSISTANT, content=answers or "charged")

    class Scripted(MockFunctionCallingLLM):
        seen: list = []

    llm = Scripted(response_generator=respond)
    return llm


def loses_the_first_answer(tool):
    """``tool`` behind one that, once, lets it run and then tells the agent it timed out (the
    answer lost on its way back). Passes the workflow's Context on where ``tool`` asks for it."""
    from llama_index.core.tools import FunctionTool, ToolOutput

    async def never(**_):
        raise AssertionError

    class LoseOnce(FunctionTool):
        def __init__(self):
            super().__init__(async_fn=never, metadata=tool.metadata)
            self.requires_context = getattr(tool, "requires_context", False)
            self.ctx_param_name = getattr(tool, "ctx_param_name", None)
            self.lost = []

        async def acall(self, *args, **kwargs):
            out = await tool.acall(*args, **kwargs)
            if not self.lost:
                self.lost.append(out)
                return ToolOutput(tool_name=tool.metadata.name, content="Error: timed out waiting for the tool's answer",
                                  raw_input={"kwargs": kwargs}, raw_output=None, is_error=True)
            return out

    return LoseOnce()


@need(WHY)
class LlamaIndexTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        from llama_index.core.tools import FunctionTool

        self.pay = Payments(self)
        pay = self.pay

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            return pay.charge(customer, amount_cents)

        self.plain = FunctionTool.from_defaults(charge_card)

    def idem(self, tool=None, **options):
        from idem_runtime.adapters.llamaindex import idempotent_tool

        options.setdefault("store", self.pay.store)
        return idempotent_tool(tool or self.plain, **options)

    async def run_agent(self, tools, llm=None, ctx=None, run_id=None, agent=None):
        """Runs a FunctionAgent; answers (the final text, the ToolCallResult events, the llm)."""
        from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

        llm = llm or scripted_llm()
        agent = agent or FunctionAgent(name="billing", description="Charges cards.", tools=tools, llm=llm)
        handler = agent.run("charge order 7", ctx=ctx, run_id=run_id)
        results = [ev async for ev in handler.stream_events() if isinstance(ev, ToolCallResult)]
        return str(await handler), results, llm

    async def test_the_readme_example_runs(self):
        """examples/agents/llamaindex_charge.py, run as a user runs it: one charge for two calls."""
        out = run_example("llamaindex_charge.py")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("1 charge for 2 tool calls", out.stdout)

    async def test_a_lost_answer_asked_again_by_the_model_charges_once(self):
        import idem_runtime

        # A run id of its own: LlamaIndex keeps every run id its process has started.
        run_id = f"run-{uuid.uuid4().hex}"
        final, results, llm = await self.run_agent([loses_the_first_answer(self.idem())], run_id=run_id)
        self.assertEqual(self.pay.rows(), 1, "one charge, however many calls")
        self.assertEqual(final, "charged")
        self.assertEqual([r.tool_id for r in results], ["call-1", "call-2"])
        # The second call was answered with the stored result, marked as a replay.
        second = results[1].tool_output
        self.assertFalse(second.is_error)
        self.assertIn("ch_1", second.content)
        self.assertEqual(second.raw_output, {"charge": "ch_1", "amount_cents": 4900})
        key = idem_runtime.derive_key(run_id, "charge_card", ARGS)
        self.assertEqual(second.raw_input["idem"], {"key": key, "replayed": True})
        self.assertIn("ch_1", llm.seen[-1])
        # The scope is the workflow run's id; idem inspect (the CLI) finds the record.
        self.assertIn("completed", self.pay.inspect(key))

    async def test_without_idem_the_same_retry_charges_twice(self):
        await self.run_agent([loses_the_first_answer(self.plain)], run_id=f"run-{uuid.uuid4().hex}")
        self.assertEqual(self.pay.rows(), 2)

    async def test_the_same_charge_twice_in_one_model_turn_runs_once(self):
        from llama_index.core.base.llms.types import ToolCallBlock
        from llama_index.core.llms import ChatMessage, MessageRole
        from llama_index.core.llms.mock import MockFunctionCallingLLM

        def two_at_once(messages, **kwargs):
            if messages[-1].role == MessageRole.TOOL:
                return ChatMessage(role=MessageRole.ASSISTANT, content="charged")
            calls = [ToolCallBlock(tool_call_id=f"p-{n}", tool_name="charge_card", tool_kwargs=dict(ARGS)) for n in (1, 2)]
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=calls)

        # The agent runs the two calls as two steps at once; the second waits for the first.
        _, results, _ = await self.run_agent([self.idem()], llm=MockFunctionCallingLLM(response_generator=two_at_once))
        self.assertEqual(self.pay.rows(), 1)
        self.assertEqual(sorted(r.tool_output.raw_input["idem"]["replayed"] for r in results), [False, True])
        await self.run_agent([self.plain], llm=MockFunctionCallingLLM(response_generator=two_at_once))
        self.assertEqual(self.pay.rows(), 3, "without idem: both run")

    async def test_each_run_is_a_scope_unless_the_context_names_one(self):
        from llama_index.core.agent.workflow import FunctionAgent
        from llama_index.core.workflow import Context

        # Two runs (a human sending the instruction again): two run ids, two charges.
        tool = self.idem()
        await self.run_agent([tool])
        await self.run_agent([tool])
        self.assertEqual(self.pay.rows(), 2)
        # The same two on one Context that names the order: one charge, the second replayed.
        agent = FunctionAgent(name="billing", description="Charges cards.", tools=[tool], llm=scripted_llm())
        ctx = Context(agent)
        await ctx.store.set("idem_scope", "order-7")
        _, first, _ = await self.run_agent([tool], ctx=ctx, agent=agent)
        _, again, _ = await self.run_agent([tool], ctx=ctx, agent=agent)
        self.assertEqual(self.pay.rows(), 3)
        self.assertEqual([first[0].tool_output.raw_input["idem"]["replayed"], again[0].tool_output.raw_input["idem"]["replayed"]],
                         [False, True])
        # A Context restored from its dict (a restart) keeps the scope.
        restored = Context.from_dict(agent, ctx.to_dict())
        await self.run_agent([tool], ctx=restored, agent=agent)
        self.assertEqual(self.pay.rows(), 3)

    async def test_agents_of_one_workflow_share_the_contexts_scope(self):
        from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
        from llama_index.core.workflow import Context

        tool = self.idem()
        workflow = AgentWorkflow(agents=[FunctionAgent(name="billing", description="Charges cards.", tools=[tool],
                                                       llm=scripted_llm())])
        ctx = Context(workflow)
        await ctx.store.set("idem_scope", "order-9")
        for _ in range(2):
            handler = workflow.run("charge order 9", ctx=ctx)
            await handler
        self.assertEqual(self.pay.rows(), 1)

    async def test_scope_from_the_arguments_and_with_scope(self):
        import idem_runtime

        by_customer = self.idem(scope=lambda args: f"order-of-{args['customer']}")
        await self.run_agent([by_customer])
        await self.run_agent([by_customer])
        self.assertEqual(self.pay.rows(), 1)
        # An enclosing scope around two runs (a job that runs the agent again after a crash).
        with idem_runtime.scope("job-4"):
            await self.run_agent([self.idem()])
            await self.run_agent([self.idem()])
        self.assertEqual(self.pay.rows(), 2, "one more charge for the two runs of the job")
        # Outside any workflow run: the enclosing scope, sync and async.
        tool = self.idem()
        with idem_runtime.scope("job-5"):
            out1 = tool.call(**ARGS)
            out2 = await tool.acall(**ARGS)
        self.assertEqual(self.pay.rows(), 3)
        self.assertEqual([out1.raw_input["idem"]["replayed"], out2.raw_input["idem"]["replayed"]], [False, True])
        self.assertEqual(out2.raw_output, out1.raw_output)

    async def test_the_tools_own_error_releases_the_key(self):
        from llama_index.core.tools import FunctionTool

        calls = []

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("card network down")
            return {"charge": "ch_9"}

        _, results, _ = await self.run_agent([self.idem(FunctionTool.from_defaults(charge_card))])
        self.assertEqual(len(calls), 2, "the error released the key: the model's retry ran")
        self.assertTrue(results[0].tool_output.is_error)
        self.assertIn("card network down", results[0].tool_output.content)
        self.assertFalse(results[1].tool_output.is_error)

    async def test_a_tool_asking_for_the_context_gets_it_and_odd_outputs(self):
        from llama_index.core.tools import FunctionTool, ToolOutput
        from llama_index.core.workflow import Context

        seen = []

        async def charge_card(ctx: Context, customer: str, amount_cents: int) -> object:
            """Charge a customer's card."""
            seen.append(await ctx.store.get("idem_scope", default=None))
            self.pay.charge(customer, amount_cents)
            return Receipt()

        class Receipt:
            def __str__(self):
                return "receipt for ch_1"

        tool = self.idem(FunctionTool.from_defaults(async_fn=charge_card))
        _, results, _ = await self.run_agent([loses_the_first_answer(tool)])
        self.assertEqual(self.pay.rows(), 1, [r.tool_output for r in results])
        self.assertEqual(seen, [None], "the Context reached the tool given, once")
        # An output JSON cannot hold is replayed as its text.
        self.assertEqual(results[1].tool_output.raw_output, "receipt for ch_1")
        self.assertEqual(results[1].tool_output.content, "receipt for ch_1")

        # A ToolOutput with is_error that the tool returns is given as it was and released.
        class Reporting(FunctionTool):
            async def acall(self, *args, **kwargs):
                calls.append(1)
                return ToolOutput(tool_name="charge_card", content="Error: declined, try later", raw_input=kwargs,
                                  raw_output=None, is_error=len(calls) == 1)

        calls = []
        reporting = Reporting(async_fn=charge_card, metadata=self.plain.metadata)
        reporting.requires_context = False
        _, results, _ = await self.run_agent([self.idem(reporting)])
        self.assertEqual(len(calls), 2, "the error output released the key: the retry ran")
        self.assertTrue(results[0].tool_output.is_error)

    async def test_not_configured_is_logged_at_error_and_told_to_the_model(self):
        tool = self.idem()
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            out = tool.call(**ARGS)  # no run, no scope
        self.assertTrue(out.is_error)
        self.assertIn("charge_card was not run, and calling it again will not help", out.content)
        self.assertIn("not configured", "\n".join(logs.output))
        # A store URL idem cannot use, inside an agent: the model is told, the log says it.
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            _, results, llm = await self.run_agent([self.idem(store="sqlite-typo:idem.db")])
        self.assertIn("charge_card was not run: idem is not configured for it", "\n".join(logs.output))
        self.assertTrue(results[0].tool_output.is_error)
        self.assertIn("unknown scheme", llm.seen[0])
        self.assertEqual(self.pay.rows(), 0)

    async def test_a_store_that_cannot_be_used_is_said_and_logged(self):
        broken = self.idem(store="postgres://idem@127.0.0.1:1/none?connect_timeout=1")
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            _, results, llm = await self.run_agent([broken])
        self.assertIn("store cannot be used", "\n".join(logs.output))
        self.assertTrue(results[0].tool_output.is_error)
        self.assertIn("charge_card was not run: its idempotency store cannot be used right now", llm.seen[0])
        self.assertEqual(self.pay.rows(), 0)

    async def test_a_call_in_flight_tells_the_model_to_wait(self):
        from llama_index.core.tools import FunctionTool

        started, release = threading.Event(), threading.Event()

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            started.set()
            release.wait(30)
            return self.pay.charge(customer, amount_cents)

        tool = self.idem(FunctionTool.from_defaults(charge_card), scope="order-8", wait=0)
        first = asyncio.ensure_future(tool.acall(**ARGS))  # a sync tool runs on a thread
        self.assertTrue(await asyncio.to_thread(started.wait, 30))
        _, results, llm = await self.run_agent([tool])
        release.set()
        await first
        self.assertTrue(results[0].tool_output.is_error)
        self.assertIn("still running; do not call it again yet", llm.seen[0])
        self.assertEqual(self.pay.rows(), 1)


if __name__ == "__main__":
    unittest.main()
