"""The Google ADK adapter (idem_runtime.adapters.google_adk) under the real framework, in a
virtualenv of its own: google-adk 2.13.0 needs opentelemetry <= 1.44, while
tests/requirements.txt (opentelemetry 1.45.2) and CrewAI (>= 1.45.1, tests_own_venv) need newer.
Make it with::

    python -m venv /tmp/adk && /tmp/adk/bin/pip install ./clients/python -r clients/python/tests_adk/requirements.txt
    cd clients/python && /tmp/adk/bin/python -m unittest discover -s tests_adk -v

An ``LlmAgent`` runs on a scripted ``BaseLlm`` (no model is called: it answers from a script,
asking for ``charge_card`` again while the last answer is an error, as a model does). A plugin
after idem's replaces the first answer with a timeout once, after the tool ran and idem stored
its result: the answer lost on the way back. With idem: one row in the payments table, the
second answer a replay (the function-response event's ``custom_metadata``), and ``idem
inspect`` (the CLI) shows the record; without: two rows, so the scenario is real. Then ADK's
own retry (``ReflectAndRetryToolPlugin``) with a timeout the tool raises after charging
(``unknown_errors=``), the scope (the invocation id; a business id in the session state across
two messages), and what the run would hide or fail on: idem not configured fails the run and
is logged at ERROR, a store that cannot be used and a call in flight reach the model as error
results. Without google-adk the tests skip, or fail under IDEM_REQUIRE_SERVICES=1.
"""

import asyncio
import pathlib
import sys
import threading
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from agent_effects import Payments, run_example  # noqa: E402
from cli_support import cli_missing, need  # noqa: E402


def missing():
    try:
        import google.adk  # noqa: F401
    except ImportError as e:
        return f"google-adk is not installed ({e}): pip install -r clients/python/tests_adk/requirements.txt"
    return cli_missing()


WHY = missing()
ARGS = {"customer": "cus_1", "amount_cents": 4900}

if not WHY:
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    import idem_runtime
    from idem_runtime.adapters.google_adk import IdempotencyPlugin

    USAGE = types.GenerateContentResponseUsageMetadata(prompt_token_count=1, candidates_token_count=1, total_token_count=2)

    class ScriptedLlm(BaseLlm):
        """Asks for ``charge_card`` (a new function-call id each time) until an answer is not
        an error, at most three times in a turn, then says "charged". ``seen``: the function
        responses it was shown."""

        model: str = "scripted"
        tool: str = "charge_card"
        args: dict = ARGS
        seen: list = []
        asked: int = 0

        async def generate_content_async(self, llm_request, stream=False):
            last = llm_request.contents[-1]
            responses = [p.function_response for p in last.parts or [] if p.function_response]
            turn = []
            for content in reversed(llm_request.contents):
                if content.role == "user" and any(p.text for p in content.parts or []):
                    break
                turn += [p.function_response for p in content.parts or [] if p.function_response]
            if responses:
                self.seen.append(responses[-1].response)
            if not responses or ("error" in str(responses[-1].response).lower() and len(turn) < 3):
                self.asked += 1
                call = types.FunctionCall(id=f"{self.tool}-{self.asked}" if self.tool != "charge_card" else f"call-{self.asked}",
                                          name=self.tool, args=dict(self.args))
                yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]),
                                  usage_metadata=USAGE)
            else:
                yield LlmResponse(content=types.Content(role="model", parts=[types.Part.from_text(text="charged")]),
                                  usage_metadata=USAGE)

    class LoseOnce(BasePlugin):
        """The first answer is lost on its way back: the model is told the call timed out."""

        def __init__(self, tool="charge_card"):
            super().__init__(name="lose_once")
            self.tool = tool
            self.lost = []

        async def after_tool_callback(self, *, tool, tool_args, tool_context, result):
            if self.lost or tool.name != self.tool:
                return None
            self.lost.append(result)
            return {"error": "timed out waiting for the tool's answer"}


@need(WHY)
class GoogleAdkTest(unittest.TestCase):
    def setUp(self):
        self.pay = Payments(self)
        pay = self.pay

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            return pay.charge(customer, amount_cents)

        def lookup(customer: str) -> dict:
            """Read a customer's balance (no side effect)."""
            return {"customer": customer, "balance": 0}

        self.tools = [charge_card, lookup]

    def idem(self, **kw):
        kw.setdefault("store", self.pay.store)
        return IdempotencyPlugin(tools=["charge_card"], **kw)

    def run_agent(self, plugins, messages=("charge order 7",), state=None, llm=None, agent=None, run_config=None):
        """Runs the messages in one session; answers (events, llm, session id)."""
        llm = llm or ScriptedLlm()
        agent = agent or LlmAgent(name="billing", model=llm, tools=self.tools)
        runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=list(plugins)))

        async def go():
            session = await runner.session_service.create_session(app_name="shop", user_id="u1", state=state)
            events = []
            for text in messages:
                message = types.Content(role="user", parts=[types.Part.from_text(text=text)])
                async for event in runner.run_async(user_id="u1", session_id=session.id, new_message=message,
                                                    run_config=run_config):
                    events.append(event)
            await runner.close()
            return events, session.id

        events, session_id = asyncio.run(go())
        return events, llm, session_id

    @staticmethod
    def answers(events):
        """The function-response events, in order."""
        return [e for e in events if e.get_function_responses()]

    def test_the_readme_example_runs(self):
        """examples/agents/adk_charge.py, run as a user runs it: one charge for two calls."""
        out = run_example("adk_charge.py")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("1 charge for 2 tool calls (replayed: [False, True])", out.stdout)

    def test_a_lost_answer_asked_again_by_the_model_charges_once(self):
        events, llm, _ = self.run_agent([self.idem(), LoseOnce()])
        self.assertEqual(self.pay.rows(), 1, "one charge, however many calls")
        self.assertEqual(events[-1].content.parts[0].text, "charged")
        answers = self.answers(events)
        self.assertEqual([a.get_function_responses()[0].id for a in answers], ["call-1", "call-2"])
        self.assertEqual(llm.seen[-1], {"charge": "ch_1", "amount_cents": 4900})
        # Marked in ADK's own event metadata: the second answer is a replay, keyed on the invocation.
        key = idem_runtime.derive_key(answers[1].invocation_id, "charge_card", ARGS)
        self.assertEqual(answers[0].custom_metadata["idem"], {"key": key, "replayed": False})
        self.assertEqual(answers[1].custom_metadata["idem"], {"key": key, "replayed": True})
        self.assertIn("completed", self.pay.inspect(key))

    def test_the_same_charge_twice_in_one_model_turn_runs_once(self):
        class TwoAtOnce(ScriptedLlm):
            """Asks for the same charge twice in one response (parallel function calls)."""

            async def generate_content_async(self, llm_request, stream=False):
                if any(p.function_response for p in llm_request.contents[-1].parts or []):
                    yield LlmResponse(content=types.Content(role="model", parts=[types.Part.from_text(text="charged")]),
                                      usage_metadata=USAGE)
                    return
                calls = [types.Part(function_call=types.FunctionCall(id=f"p-{n}", name="charge_card", args=dict(ARGS)))
                         for n in (1, 2)]
                yield LlmResponse(content=types.Content(role="model", parts=calls), usage_metadata=USAGE)

        # ADK runs the two at once; the second waits for the first (wait=) and gets its result.
        self.run_agent([self.idem()], llm=TwoAtOnce())
        self.assertEqual(self.pay.rows(), 1)
        self.run_agent([], llm=TwoAtOnce())
        self.assertEqual(self.pay.rows(), 3, "without idem: both run")

    def test_a_lost_answer_with_tools_on_adks_thread_pool(self):
        from google.adk.agents.run_config import RunConfig, ToolThreadPoolConfig

        # A synchronous tool runs on ADK's tool thread pool (in an event loop of its own there).
        pool = RunConfig(tool_thread_pool_config=ToolThreadPoolConfig(max_workers=2))
        events, _, _ = self.run_agent([self.idem(), LoseOnce()], run_config=pool)
        self.assertEqual(self.pay.rows(), 1)
        self.assertTrue(self.answers(events)[1].custom_metadata["idem"]["replayed"])
        self.run_agent([LoseOnce()], run_config=pool)
        self.assertEqual(self.pay.rows(), 3, "without idem: two more")

    def test_a_resumed_invocation_keeps_its_scope(self):
        from google.adk.apps import ResumabilityConfig

        class DiesOnce(ScriptedLlm):
            """The process dies on the model call after the charge; resumed, the model asks
            for the charge again (a new function-call id), then answers."""

            died: bool = False

            async def generate_content_async(self, llm_request, stream=False):
                answered = any(p.function_response for c in llm_request.contents for p in c.parts or [])
                if answered and not self.died:
                    self.died = True
                    raise RuntimeError("the process died")
                if answered and self.asked < 2:
                    self.asked += 1
                    call = types.FunctionCall(id="call-after-resume", name="charge_card", args=dict(ARGS))
                    yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]),
                                      usage_metadata=USAGE)
                    return
                async for response in super().generate_content_async(llm_request, stream):
                    yield response

        def run(plugins):
            agent = LlmAgent(name="billing", model=DiesOnce(), tools=self.tools)
            app = App(name="shop", root_agent=agent, plugins=plugins,
                      resumability_config=ResumabilityConfig(is_resumable=True))
            runner = InMemoryRunner(app=app)

            async def go():
                session = await runner.session_service.create_session(app_name="shop", user_id="u1")
                message = types.Content(role="user", parts=[types.Part.from_text(text="charge order 7")])
                seen = []
                with self.assertRaises(RuntimeError):
                    async for event in runner.run_async(user_id="u1", session_id=session.id, new_message=message):
                        seen.append(event.invocation_id)
                async for event in runner.run_async(user_id="u1", session_id=session.id, invocation_id=seen[-1]):
                    seen.append(event)
                await runner.close()
                return seen

            return asyncio.run(go())

        resumed = run([self.idem()])
        self.assertEqual(self.pay.rows(), 1, "the resumed invocation's call replayed the one before the crash")
        marks = [e.custom_metadata["idem"] for e in resumed[1:] if not isinstance(e, str) and e.custom_metadata]
        self.assertEqual(marks, [{"key": idem_runtime.derive_key(resumed[0], "charge_card", ARGS), "replayed": True}])
        run([])
        self.assertEqual(self.pay.rows(), 3, "without idem: charged again after the resume")

    def test_without_idem_the_same_retry_charges_twice(self):
        self.run_agent([LoseOnce()])
        self.assertEqual(self.pay.rows(), 2)

    def test_reflect_and_retry_after_a_timeout_the_tool_raised(self):
        from google.adk.plugins.reflect_retry_tool_plugin import ReflectAndRetryToolPlugin

        pay = self.pay

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            pay.charge(customer, amount_cents)
            raise TimeoutError("the payment API did not answer in time (it may have charged)")

        self.tools = [charge_card]
        # Without idem ADK's own retry charges again on each attempt.
        self.run_agent([ReflectAndRetryToolPlugin(max_retries=2, throw_exception_if_retry_exceeded=False)])
        self.assertEqual(pay.rows(), 3)
        # With idem, a timeout is an unknown outcome: the retries are refused, the model told.
        events, llm, _ = self.run_agent([self.idem(unknown_errors=[TimeoutError]),
                                         ReflectAndRetryToolPlugin(max_retries=2, throw_exception_if_retry_exceeded=False)])
        self.assertEqual(pay.rows(), 4, "one more charge, not three")
        self.assertIn("outcome is unknown", str(llm.seen[-1]))
        self.assertIn("operator must check and resolve it", str(llm.seen[-1]))

    def test_each_message_is_an_invocation_unless_the_state_names_the_order(self):
        # A human sending the instruction again in a new message: a new invocation, a new charge.
        self.run_agent([self.idem()], messages=["charge order 7", "charge order 7 please"])
        self.assertEqual(self.pay.rows(), 2)
        # With the order as the scope in the session's state: one charge, the second replayed.
        events, _, _ = self.run_agent([self.idem()], messages=["charge order 8", "charge order 8 please"],
                                      state={"idem_scope": "order-8"})
        self.assertEqual(self.pay.rows(), 3)
        replayed = [a.custom_metadata["idem"]["replayed"] for a in self.answers(events)]
        self.assertEqual(replayed, [False, True])
        self.assertIn("completed", self.pay.inspect(idem_runtime.derive_key("order-8", "charge_card", ARGS)))

    def test_a_supervisor_re_delegating_to_an_agent_tool_hands_the_scope_down_in_the_state(self):
        from google.adk.tools.agent_tool import AgentTool

        def supervisor():
            worker = LlmAgent(name="billing_worker", description="Charges cards.", model=ScriptedLlm(), tools=self.tools)
            llm = ScriptedLlm(tool="billing_worker", args={"request": "charge cus_1 49.00 for order 7"})
            return LlmAgent(name="supervisor", model=llm, tools=[AgentTool(agent=worker)]), llm

        # The worker's answer is lost once; the supervisor asks it again. Each AgentTool run
        # is an invocation of its own, so without a scope handed down: two charges.
        agent, llm = supervisor()
        self.run_agent([self.idem(), LoseOnce("billing_worker")], agent=agent, llm=llm)
        self.assertEqual(self.pay.rows(), 2)
        # The order in the session state, which AgentTool copies into the worker's session: one.
        agent, llm = supervisor()
        events, _, _ = self.run_agent([self.idem(), LoseOnce("billing_worker")], agent=agent, llm=llm,
                                      state={"idem_scope": "order-7"})
        self.assertEqual(self.pay.rows(), 3)
        self.assertEqual(llm.seen[-1], {"result": "charged"})
        self.assertIn("completed", self.pay.inspect(idem_runtime.derive_key("order-7", "charge_card", ARGS)))

    def test_scope_function_and_other_tools_untouched(self):
        plugin = self.idem(scope=lambda ctx: f"session-{ctx.session.id}")
        events, _, session_id = self.run_agent([plugin], messages=["charge", "charge again"])
        self.assertEqual(self.pay.rows(), 1)
        key = idem_runtime.derive_key(f"session-{session_id}", "charge_card", ARGS)
        self.assertEqual(self.answers(events)[1].custom_metadata["idem"], {"key": key, "replayed": True})

    def test_a_callback_that_answers_the_call_leaves_idem_out(self):
        blocked = []

        def guard(tool, args, tool_context):
            """An agent's before_tool_callback that answers the first call itself."""
            if not blocked:
                blocked.append(tool_context.function_call_id)
                return {"error": "blocked by policy: ask again"}
            return None

        agent = LlmAgent(name="billing", model=ScriptedLlm(), tools=self.tools, before_tool_callback=guard)
        events, _, _ = self.run_agent([self.idem()], agent=agent, llm=agent.model)
        self.assertEqual(blocked, ["call-1"])
        self.assertEqual(self.pay.rows(), 1, "the guard's answer was not stored: the next call ran")
        answers = self.answers(events)
        self.assertIsNone(answers[0].custom_metadata)
        self.assertFalse(answers[1].custom_metadata["idem"]["replayed"])

    def test_the_tools_error_result_releases_the_key(self):
        calls = []

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            calls.append(1)
            if len(calls) == 1:
                return {"error": "card network down"}
            return {"charge": "ch_9"}

        self.tools = [charge_card]
        events, llm, _ = self.run_agent([self.idem()])
        self.assertEqual(len(calls), 2, "the error result released the key: the model's retry ran")
        self.assertEqual(llm.seen, [{"error": "card network down"}, {"charge": "ch_9"}])

    def test_not_configured_fails_the_run_and_is_logged(self):
        # A store URL idem cannot use, and a key field the model's arguments do not have (no
        # key): ADK's invocation id is never missing, so these are how "not configured" shows.
        for plugin, error, said in [
            (self.idem(store="sqlite-typo:idem.db"), idem_runtime.errors.ConfigurationError, "unknown scheme"),
            (self.idem(key_fields={"charge_card": ["order_id"]}), idem_runtime.errors.KeyDerivationError, "order_id"),
        ]:
            with self.subTest(error=error.__name__):
                with self.assertLogs("idem_runtime", "ERROR") as logs, self.assertRaises(error) as raised:
                    self.run_agent([plugin])
                self.assertIn(said, str(raised.exception))
                self.assertIn("charge_card was not run: idem is not configured for it", "\n".join(logs.output))
        self.assertEqual(self.pay.rows(), 0)

    def test_not_configured_under_reflect_and_retry_is_still_logged(self):
        from google.adk.plugins.reflect_retry_tool_plugin import ReflectAndRetryToolPlugin

        # A plugin that turns every tool exception into text for the model hides the failure
        # from the run; idem's ERROR log is then what an operator sees.
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            _, llm, _ = self.run_agent([self.idem(store="sqlite-typo:idem.db"),
                                        ReflectAndRetryToolPlugin(max_retries=1, throw_exception_if_retry_exceeded=False)])
        self.assertIn("idem is not configured", "\n".join(logs.output))
        self.assertIn("unknown scheme", str(llm.seen[0]))
        self.assertEqual(self.pay.rows(), 0)

    def test_a_store_that_cannot_be_used_is_said_and_logged(self):
        broken = self.idem(store="postgres://idem@127.0.0.1:1/none?connect_timeout=1")
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            _, llm, _ = self.run_agent([broken])
        self.assertIn("store cannot be used", "\n".join(logs.output))
        self.assertIn("charge_card was not run: its idempotency store cannot be used right now", llm.seen[0]["error"])
        self.assertEqual(self.pay.rows(), 0)

    def test_a_call_in_flight_tells_the_model_to_wait(self):
        started, release = threading.Event(), threading.Event()
        pay = self.pay

        def charge_card(customer: str, amount_cents: int) -> dict:
            """Charge a customer's card."""
            started.set()
            release.wait(30)
            return pay.charge(customer, amount_cents)

        self.tools = [charge_card]
        plugin = self.idem(wait=0)
        state = {"idem_scope": "order-8"}
        first = threading.Thread(target=self.run_agent, args=([plugin],), kwargs={"state": state})
        first.start()
        self.assertTrue(started.wait(30))
        try:
            _, llm, _ = self.run_agent([plugin], state=state)
        finally:
            release.set()
            first.join(30)
        self.assertIn("still running; do not call it again yet", llm.seen[0]["error"])
        self.assertEqual(pay.rows(), 1)


if __name__ == "__main__":
    unittest.main()
