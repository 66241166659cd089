"""The OpenAI Agents SDK (openai-agents, pinned in .ci/run) with a scripted ``Model``, no LLM:
the model calls a tool, is told the call failed after the payment landed (its answer lost),
calls it again (a new call id) -> one payment, the second answer marked as a replay.

Run: cd clients/python/tests && python -m unittest test_openai_agents (IDEM_BIN for the CLI).
"""

from __future__ import annotations

import sys
import unittest

import cli_support
from agent_effects import Payments, lost_answer
from cli_support import need


def missing():
    try:
        import agents  # noqa: F401
    except ImportError as e:
        return f"openai-agents is not installed ({e}); see .ci/run for the pinned version"
    return cli_support.cli_missing()


WHY = missing()
ARGS = {"customer": "cus_1", "amount_cents": 4900}
TRACE = "trace_0123456789abcdef0123456789abcdef"


def retrying_model():
    """A ``Model`` that asks for the charge; when the tool's output is an error it asks again
    (a new call id, as a real model's retry has), up to three calls; otherwise it answers. Its ``inputs`` are the
    function-call outputs it was shown."""
    from agents import Model, ModelResponse, Usage
    from agents.testing import assistant_message, function_call

    class Retrying(Model):
        def __init__(self):
            self.inputs = []

        async def get_response(self, system_instructions, input, model_settings, tools,
                               output_schema, handoffs, tracing, **_):
            outputs = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
            self.inputs.append(outputs)
            if not outputs or ("error" in str(outputs[-1]["output"]).lower() and len(outputs) < 3):
                n = len(outputs) + 1
                item = function_call("charge_card", ARGS, call_id=f"call-{n}")
            else:
                item = assistant_message("charged")
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError("these tests do not stream")

    return Retrying()


def loses_the_first_answer(tool):
    """``tool`` behind a wrapper that, once, gets its result and then reports a timeout to the
    model instead (the SDK's own message for a tool that raised)."""
    import copy

    from agents import default_tool_error_function

    lossy = copy.copy(tool)
    lost = []

    async def on_invoke_tool(ctx, input):
        result = await tool.on_invoke_tool(ctx, input)
        if not lost:
            lost.append(result)
            return default_tool_error_function(ctx, lost_answer())
        return result

    lossy.on_invoke_tool = on_invoke_tool
    return lossy


def describe(ctx, error):
    """A failure_error_function that shows the model what went wrong (the SDK's default says
    only that an error occurred)."""
    return f"tool error: {type(error).__name__}: {error}"


def tool_outputs(result):
    from agents import ToolCallOutputItem

    return {i.raw_item["call_id"]: i for i in result.new_items if isinstance(i, ToolCallOutputItem)}


class OpenAiAgentsTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        if WHY is None:
            from agents import set_trace_processors

            set_trace_processors([])  # no exporter: traces stay in process

    async def run_agent(self, pay, run_config=None, *, body=None, **options):
        from agents import Agent, Runner

        from idem_runtime.adapters.openai_agents import idempotent_function_tool

        @idempotent_function_tool(store=pay.store, **options)
        async def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            return (body or pay.charge)(customer, amount_cents)

        self.model = retrying_model()
        agent = Agent(name="billing", model=self.model, tools=[loses_the_first_answer(charge_card)])
        return await Runner.run(agent, "charge cus_1 49 euros", run_config=run_config)

    @need(WHY)
    async def test_the_model_asking_again_after_a_lost_answer_charges_once(self):
        from agents import RunConfig

        from idem_runtime import derive_key

        pay = Payments(self)
        result = await self.run_agent(pay, RunConfig(trace_id=TRACE))
        self.assertEqual(result.final_output, "charged")
        self.assertEqual(pay.rows(), 1)
        self.assertEqual(len(self.model.inputs), 3)
        self.assertIn("error occurred", self.model.inputs[1][-1]["output"])  # the lost answer

        key = derive_key(TRACE, "charge_card", ARGS)
        out = tool_outputs(result)
        self.assertEqual(out["call-1"].custom_data, {"idem": {"key": key, "replayed": False}})
        self.assertEqual(out["call-2"].custom_data, {"idem": {"key": key, "replayed": True}})
        self.assertEqual(out["call-2"].output, {"charge": "ch_1", "amount_cents": 4900})
        shown = pay.inspect(key)
        self.assertIn("completed", shown)
        self.assertRegex(shown, r"replays\s+1")

    @need(WHY)
    async def test_without_a_run_config_the_scope_is_the_runs_trace(self):
        pay = Payments(self)
        result = await self.run_agent(pay)
        self.assertEqual(result.final_output, "charged")
        self.assertEqual(pay.rows(), 1)
        key = tool_outputs(result)["call-2"].custom_data["idem"]["key"]
        self.assertTrue(key.startswith("trace_"), key)

    @need(WHY)
    async def test_scoped_by_the_tool_call_id_it_would_charge_twice(self):
        # Why the scope is the run: the model's second call has a new call id.
        pay = Payments(self)
        result = await self.run_agent(pay, scope=lambda ctx: ctx.tool_call_id)
        self.assertEqual(result.final_output, "charged")
        self.assertEqual(pay.rows(), 2)

    @need(WHY)
    async def test_an_enclosing_scope_wins_over_the_trace(self):
        from idem_runtime import derive_key, scope

        pay = Payments(self)
        with scope("order-123"):
            result = await self.run_agent(pay)
        self.assertEqual(pay.rows(), 1)
        key = tool_outputs(result)["call-2"].custom_data["idem"]["key"]
        self.assertEqual(key, derive_key("order-123", "charge_card", ARGS))

    @need(WHY)
    async def test_with_tracing_disabled_and_no_scope_the_tool_does_not_run(self):
        from agents import RunConfig

        pay = Payments(self)
        result = await self.run_agent(pay, RunConfig(tracing_disabled=True), failure_error_function=describe)
        self.assertEqual(pay.rows(), 0)
        outputs = tool_outputs(result)
        self.assertEqual(sorted(outputs), ["call-1", "call-2", "call-3"])
        for call in ("call-2", "call-3"):  # call-1's answer was lost
            self.assertIn("ScopeMissingError: charge_card: no scope", outputs[call].output)

    @need(WHY)
    async def test_a_tool_error_releases_the_key_and_the_models_retry_runs(self):
        from agents import RunConfig

        pay = Payments(self)
        tries = []

        def flaky(customer, amount_cents):
            tries.append(1)
            if len(tries) == 1:
                raise ConnectionError("card network unreachable")  # before any charge
            return pay.charge(customer, amount_cents)

        result = await self.run_agent(pay, RunConfig(trace_id=TRACE), body=flaky)
        # call-1 raised before charging: the key was released, so call-2 ran
        self.assertEqual(len(tries), 2)
        self.assertEqual(pay.rows(), 1)
        self.assertEqual(result.final_output, "charged")
        self.assertFalse(tool_outputs(result)["call-2"].custom_data["idem"]["replayed"])

    @need(WHY)
    async def test_a_kept_error_is_replayed_to_the_model_without_running_again(self):
        from agents import RunConfig

        class Declined(Exception):
            pass

        pay = Payments(self)
        tries = []

        def declined(customer, amount_cents):
            tries.append(1)
            raise Declined("card declined")

        result = await self.run_agent(pay, RunConfig(trace_id=TRACE), body=declined,
                                      keep_errors=[Declined], failure_error_function=describe)
        self.assertEqual(len(tries), 1)
        outputs = tool_outputs(result)
        self.assertEqual(sorted(outputs), ["call-1", "call-2", "call-3"])
        for call in ("call-2", "call-3"):  # call-1's answer was lost
            self.assertEqual(outputs[call].output, "tool error: Declined: card declined")
            self.assertTrue(outputs[call].custom_data["idem"]["replayed"])

    @need(WHY)
    async def test_a_timeout_after_the_charge_is_an_unknown_outcome_the_retry_does_not_run(self):
        from agents import RunConfig

        from idem_runtime import derive_key

        pay = Payments(self)

        def charged_then_timed_out(customer, amount_cents):
            pay.charge(customer, amount_cents)
            raise TimeoutError("the payment API did not answer")  # it may have charged

        result = await self.run_agent(pay, RunConfig(trace_id=TRACE), body=charged_then_timed_out,
                                      unknown_errors=[TimeoutError], failure_error_function=describe)
        self.assertEqual(pay.rows(), 1)
        outputs = tool_outputs(result)
        for call in ("call-2", "call-3"):
            self.assertIn("OutcomeUnknownError", outputs[call].output)
            self.assertIn("idem resolve", outputs[call].output)
        shown = pay.inspect(derive_key(TRACE, "charge_card", ARGS))
        self.assertIn("abandoned", shown)


if __name__ == "__main__":
    sys.exit(unittest.main())
