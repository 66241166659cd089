"""The CrewAI adapter (idem_runtime.adapters.crewai) under the real framework, in a virtualenv of
its own (crewai and the mcp pinned in tests/requirements.txt cannot be installed together):

    python -m venv /tmp/crew && /tmp/crew/bin/pip install ./clients/python -r clients/python/tests_own_venv/requirements.txt
    cd clients/python && IDEM_BIN=target/debug/idem /tmp/crew/bin/python -m unittest discover -s tests_own_venv -v

A crew's agent runs on a scripted ``BaseLLM`` (no model is called) that asks for ``charge_card``
twice, as a model does after its tool reported an error. Between idem and CrewAI a lossy layer
raises once after the tool ran (its answer lost on the way back), so CrewAI tells the model the
call failed. With idem: one charge, and ``idem inspect`` (the CLI) shows the record; without:
two, so the scenario is real. Then what CrewAI would hide: idem not configured (no scope, a
store that cannot be opened) and a call in flight come back as CrewAI ``ToolFailure``s, logged at
ERROR where nothing can fix them, and a crew whose policy is to raise on a tool failure stops.
Without crewai the tests skip, or fail under IDEM_REQUIRE_SERVICES=1.
"""

import asyncio
import json
import os
import pathlib
import sys
import threading
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from own_support import StoreTest, missing_for  # noqa: E402

import idem_runtime  # noqa: E402

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

WHY = missing_for(["crewai"], "pip install -r clients/python/tests_own_venv/requirements.txt")

if not WHY:
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import BaseTool, tool
    from crewai.tools.tool_failure import ToolExecutionFailedError, ToolFailure, ToolFailurePolicy

    from idem_runtime.adapters.crewai import idempotent_tool

    class ScriptedLLM(BaseLLM):
        """Answers from its script, in CrewAI's text protocol (Action / Action Input)."""

        script: list = []
        seen: list = []

        def call(self, messages, tools=None, callbacks=None, available_functions=None,
                 from_task=None, from_agent=None, response_model=None, **kwargs):
            self.seen.append(messages)
            return self.script.pop(0)

        def supports_function_calling(self):
            return False

        def supports_stop_words(self):
            return False

        def get_context_window_size(self):
            return 8192

    class ChargeTool(BaseTool):
        """A tool written as a BaseTool subclass, as CrewAI's docs show them."""

        name: str = "charge_card_sub"
        description: str = "Charge a customer's card."

        def _run(self, customer: str, amount_cents: int) -> str:
            SUBCLASS_CHARGES.append((customer, amount_cents))
            return f"charged {customer} {amount_cents}"


ARGS = {"customer": "cus_1", "amount_cents": 4900}
SUBCLASS_CHARGES: list = []


def act(name="charge_card", args=ARGS):
    return f"Thought: charge the card\nAction: {name}\nAction Input: {json.dumps(args)}"


DONE = "Thought: I now know the final answer\nFinal Answer: charged"


def lossy(t):
    """The tool's answer lost on its way back once, after it ran (a timeout CrewAI reports)."""
    lost = []

    def lose(result):
        if not lost:
            lost.append(True)
            raise TimeoutError("the tool's answer was lost on the way back")
        return result

    if hasattr(t, "func"):
        inner = t.func
        return t.model_copy(update={"func": lambda **kw: lose(inner(**kw))})
    inner_run = t._run
    copy = t.model_copy()
    object.__setattr__(copy, "_run", lambda **kw: lose(inner_run(**kw)))
    return copy


def lossy_async(t):
    """``lossy`` for a tool whose function is async."""
    lost = []
    inner = t.func

    async def func(**kw):
        result = await inner(**kw)
        if not lost:
            lost.append(True)
            raise TimeoutError("the tool's answer was lost on the way back")
        return result

    return t.model_copy(update={"func": func})


@unittest.skipIf(WHY, WHY or "")
class CrewAITest(StoreTest):
    def setUp(self):
        super().setUp()
        self.charges = []
        charges = self.charges

        @tool("charge_card")
        def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            charges.append((customer, amount_cents))
            return f"charged {customer} {amount_cents}"

        self.tool = charge_card

    def kickoff(self, tools, script, **crew):
        llm = ScriptedLLM(model="scripted", script=list(script), seen=[])
        agent = Agent(role="billing", goal="charge the order", backstory="a billing clerk", llm=llm,
                      tools=tools, verbose=False)
        task = Task(description="charge order 7: cus_1, 4900 cents", expected_output="a confirmation", agent=agent)
        return Crew(agents=[agent], tasks=[task], verbose=False, **crew).kickoff(), llm

    def test_a_lost_answer_retried_by_the_agent_charges_once(self):
        from crewai.execution import get_execution_uuid

        scopes = []
        inner = self.tool.func
        self.tool = self.tool.model_copy(update={"func": lambda **kw: (scopes.append(get_execution_uuid()), inner(**kw))[1]})
        result, llm = self.kickoff([lossy(idempotent_tool(self.tool, store=self.store))], [act(), act(), DONE])
        self.assertEqual(self.charges, [("cus_1", 4900)], "one charge, however many calls")
        self.assertEqual(result.raw, "charged")
        # The scope is the kickoff's execution id; the record is in the store, completed.
        self.assertEqual(len(scopes), 1)
        key = idem_runtime.derive_key(scopes[0], "charge_card", ARGS)
        record = self.inspect_cli(key)
        self.assertEqual(record["state"], "completed", record)

    def test_without_idem_the_same_retry_charges_twice(self):
        self.kickoff([lossy(self.tool)], [act(), act(), DONE])
        self.assertEqual(self.charges, [("cus_1", 4900), ("cus_1", 4900)])

    def test_a_base_tool_subclass_is_wrapped_too(self):
        SUBCLASS_CHARGES.clear()
        wrapped = idempotent_tool(ChargeTool(), store=self.store)
        self.kickoff([lossy(wrapped)], [act("charge_card_sub"), act("charge_card_sub"), DONE])
        self.assertEqual(SUBCLASS_CHARGES, [("cus_1", 4900)])
        # The class and its other instances are untouched: they run every time.
        plain = ChargeTool()
        plain._run(customer="cus_1", amount_cents=4900)
        plain._run(customer="cus_1", amount_cents=4900)
        self.assertEqual(len(SUBCLASS_CHARGES), 3)

    def test_an_async_tool_and_an_async_kickoff(self):
        charges = self.charges

        @tool("charge_card")
        async def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            charges.append((customer, amount_cents))
            return f"charged {customer} {amount_cents}"

        wrapped = lossy_async(idempotent_tool(charge_card, store=self.store))
        llm = ScriptedLLM(model="scripted", script=[act(), act(), DONE], seen=[])
        agent = Agent(role="billing", goal="charge the order", backstory="a billing clerk", llm=llm,
                      tools=[wrapped], verbose=False)
        task = Task(description="charge order 7", expected_output="a confirmation", agent=agent)
        result = asyncio.run(Crew(agents=[agent], tasks=[task], verbose=False).kickoff_async())
        self.assertEqual(result.raw, "charged")
        self.assertEqual(self.charges, [("cus_1", 4900)])

    def test_a_returned_tool_failure_is_not_stored_and_a_returned_coroutine_is_run(self):
        runs = []

        @tool("charge_card")
        def flaky(customer: str, amount_cents: int):
            """Charge a customer's card."""
            runs.append(1)
            if len(runs) == 1:  # CrewAI's way to report a failure without raising
                return ToolFailure(message="payment gateway unavailable", retryable=True)

            async def charge():
                return "charged"

            return charge()  # a plain function answering a coroutine: CrewAI's Tool.run awaits it

        wrapped = idempotent_tool(flaky, store=self.store)
        with idem_runtime.scope("order-9"):
            first = wrapped.run(**ARGS)
            second = wrapped.run(**ARGS)
            third = wrapped.run(**ARGS)
        self.assertIsInstance(first, ToolFailure, "the failure is the tool's, given as it was")
        self.assertEqual((second, third), ("charged", "charged"), "released: the retry ran; then replayed")
        self.assertEqual(len(runs), 2)

    def test_an_idem_refusal_inside_the_tool_is_the_tools_own_error(self):
        @idem_runtime.idempotent(store=self.store)
        def notify(order_id: str, text: str) -> str:
            return "sent"

        with idem_runtime.scope("job-1"):
            notify(order_id="o-7", text="another text", idempotency_key="job-1-notify-o-7")

        @tool("checkout")
        def checkout(order_id: str) -> str:
            """Ship an order and notify the customer."""
            return notify(order_id=order_id, text="shipped", idempotency_key=f"job-1-notify-{order_id}")

        wrapped = idempotent_tool(checkout, store=self.store)
        # Not "checkout was not run": it ran, and its own call was refused; CrewAI reports the error.
        with idem_runtime.scope("job-1"), self.assertRaises(idem_runtime.KeyMismatchError):
            wrapped.run(order_id="o-7")

    def test_a_store_that_cannot_be_opened_fails_the_run_it_would_have_hidden(self):
        broken = idempotent_tool(self.tool, store="postgres://idem@127.0.0.1:1/none?connect_timeout=1")
        # CrewAI's default: the failure is recorded and reported, and logged at ERROR by idem.
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            _, llm = self.kickoff([broken], [act(), DONE])
        self.assertIn("store cannot be used", "\n".join(logs.output))
        self.assertIn("charge_card was not run: its idempotency store cannot be used right now", json.dumps(llm.seen[-1]))
        # Under a policy that raises on a tool failure, the run stops instead of reporting "charged".
        with self.assertLogs("idem_runtime", "ERROR"), self.assertRaises(ToolExecutionFailedError):
            self.kickoff([broken], [act(), DONE], tool_failure_policy=ToolFailurePolicy.RAISE)
        self.assertEqual(self.charges, [])

    def test_outside_a_kickoff_there_is_no_scope_and_nothing_runs(self):
        wrapped = idempotent_tool(self.tool, store=self.store)
        with self.assertLogs("idem_runtime", "ERROR"):
            answer = wrapped.run(**ARGS)
        self.assertIsInstance(answer, ToolFailure)
        self.assertEqual(answer.code, "ScopeMissingError")
        self.assertIn("outside a crew or flow kickoff", answer.message)
        with idem_runtime.scope("order-7"):
            self.assertEqual(wrapped.run(**ARGS), "charged cus_1 4900")
        self.assertEqual(self.charges, [("cus_1", 4900)])

    def test_a_call_in_flight_tells_the_model_to_wait(self):
        started, release = threading.Event(), threading.Event()

        @tool("charge_card")
        def slow(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            started.set()
            release.wait(30)
            return "charged"

        wrapped = idempotent_tool(slow, store=self.store, wait=0)
        runner = threading.Thread(target=_in_scope, args=("order-8", lambda: wrapped.run(**ARGS)))
        runner.start()
        self.assertTrue(started.wait(30))
        with idem_runtime.scope("order-8"):
            answer = wrapped.run(**ARGS)
        release.set()
        runner.join(30)
        self.assertIsInstance(answer, ToolFailure)
        self.assertEqual(answer.code, "InFlightError")
        self.assertIn("still running; do not call it again yet", answer.message)
        self.assertTrue(answer.retryable)


def _in_scope(name, fn):
    with idem_runtime.scope(name):
        return fn()


if __name__ == "__main__":
    unittest.main()
