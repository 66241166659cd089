"""The Strands Agents adapter (idem_runtime.adapters.strands) under the real framework, in the
virtualenv of this directory (see test_crewai.py for how to make it).

An agent runs on a scripted ``Model`` (no model is called: it streams Bedrock-style events from
a script) that asks for ``charge_card`` twice, as a model does after its tool reported an
error. A hook after idem's (``AfterToolCallEvent``) replaces the first result with a timeout
once, after the tool ran and idem stored its result: the answer lost on the way back. With
idem: one charge, and ``idem inspect`` (the CLI) shows the record; without: two, so the scenario
is real. Strands' own retry (a hook setting ``AfterToolCallEvent.retry``) replays the same way.
Then what Strands would hide: the tool's own error result releases the key; idem not
configured, and a call in flight, reach the model as error results saying what to do, logged
at ERROR where no model can fix them. Without strands the tests skip, or fail under
IDEM_REQUIRE_SERVICES=1.
"""

import json
import pathlib
import sys
import threading
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from own_support import StoreTest, missing_for  # noqa: E402

import idem_runtime  # noqa: E402

WHY = missing_for(["strands"], "pip install -r clients/python/tests_own_venv/requirements.txt")

if not WHY:
    from strands import Agent, tool
    from strands.hooks import AfterToolCallEvent, HookProvider
    from strands.models.model import Model
    from strands.session.file_session_manager import FileSessionManager

    from idem_runtime.adapters.strands import IdempotencyHooks

    class ScriptedModel(Model):
        """Streams each step of its script as Strands' model events: a tool use, or text."""

        def __init__(self, script):
            self.script = list(script)
            self.seen = []

        def update_config(self, **config):
            pass

        def get_config(self):
            return {}

        async def structured_output(self, *args, **kwargs):
            raise NotImplementedError

        async def stream(self, messages, tool_specs=None, system_prompt=None, **kwargs):
            self.seen.append(messages[-1])
            step = self.script.pop(0)
            yield {"messageStart": {"role": "assistant"}}
            if "tool" in step:
                yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": step["id"], "name": step["tool"]}}}}
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(step["input"])}}}}
                yield {"contentBlockStop": {}}
                yield {"messageStop": {"stopReason": "tool_use"}}
            else:
                yield {"contentBlockDelta": {"delta": {"text": step["text"]}}}
                yield {"contentBlockStop": {}}
                yield {"messageStop": {"stopReason": "end_turn"}}

    class LoseOnce(HookProvider):
        """The first result is lost on its way back (``retry``: Strands runs the tool again)."""

        def __init__(self, retry=False):
            self.lost = False
            self.retry = retry

        def register_hooks(self, registry, **kwargs):
            registry.add_callback(AfterToolCallEvent, self.after)

        def after(self, event):
            if self.lost:
                return
            self.lost = True
            if self.retry:
                event.retry = True
            else:
                event.result = {"toolUseId": event.tool_use["toolUseId"], "status": "error",
                                "content": [{"text": "timed out: the answer was lost on the way back"}]}


ARGS = {"customer": "cus_1", "amount_cents": 4900}


def use(n, name="charge_card", args=ARGS):
    return {"tool": name, "id": f"tooluse_{n}", "input": args}


DONE = {"text": "charged"}


@unittest.skipIf(WHY, WHY or "")
class StrandsTest(StoreTest):
    def setUp(self):
        super().setUp()
        self.charges = []
        charges = self.charges

        @tool
        def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            charges.append((customer, amount_cents))
            return f"charged {customer} {amount_cents}"

        @tool
        def lookup(customer: str) -> str:
            """Read a customer's balance (no side effect)."""
            return f"{customer}: 0"

        self.tools = [charge_card, lookup]

    def run_agent(self, script, hooks, prompt="charge order 7", session=None, **kwargs):
        model = ScriptedModel(script)
        sessions = None if session is None else FileSessionManager(session_id=session, storage_dir=self.dir.name)
        agent = Agent(model=model, tools=self.tools, hooks=hooks, callback_handler=None, session_manager=sessions)
        result = agent(prompt, **kwargs)
        return agent, model, result

    def idem(self, **kw):
        return IdempotencyHooks(tools=["charge_card"], store=self.store, **kw)

    def test_a_lost_answer_asked_again_by_the_model_charges_once(self):
        agent, model, result = self.run_agent([use(1), use(2), DONE], [LoseOnce(), self.idem()], session="thread-7")
        self.assertEqual(self.charges, [("cus_1", 4900)], "one charge, however many calls")
        self.assertEqual(str(result).strip(), "charged")
        # The second call was answered with the stored result, under its own toolUseId.
        answer = model.seen[2]["content"][0]["toolResult"]
        self.assertEqual((answer["toolUseId"], answer["status"]), ("tooluse_2", "success"))
        self.assertEqual(answer["content"], [{"text": "charged cus_1 4900"}])
        # The scope is the session manager's session id; the record is in the store.
        self.assertEqual(agent.session_id, "thread-7")
        key = idem_runtime.derive_key("thread-7", "charge_card", ARGS)
        self.assertEqual(self.inspect_cli(key)["state"], "completed")
        # A new agent on the same session (a restart) replays; one without a session manager
        # is a scope of its own, idem's uuid4 (Strands' own id has only 32 random bits).
        self.run_agent([use(3), DONE], [self.idem()], session="thread-7")
        self.assertEqual(len(self.charges), 1)
        self.run_agent([use(4), DONE], [self.idem()])
        self.assertEqual(len(self.charges), 2)

    def test_without_idem_the_same_retry_charges_twice(self):
        self.run_agent([use(1), use(2), DONE], [LoseOnce()])
        self.assertEqual(self.charges, [("cus_1", 4900), ("cus_1", 4900)])

    def test_strands_own_retry_replays(self):
        self.run_agent([use(1), DONE], [LoseOnce(retry=True), self.idem()])
        self.assertEqual(self.charges, [("cus_1", 4900)])

    def test_the_scope_from_invocation_state_and_other_tools_untouched(self):
        # Two agents (two sessions) of one job share the scope the caller passed.
        for _ in range(2):
            self.run_agent([use(1), DONE], [self.idem()], invocation_state={"idem_scope": "job-42"})
        self.assertEqual(self.charges, [("cus_1", 4900)])
        self.assertEqual(self.inspect_cli(idem_runtime.derive_key("job-42", "charge_card", ARGS))["state"], "completed")
        # A tool not named runs every time (a read must not replay its first answer).
        _, model, _ = self.run_agent([use(1, "lookup", {"customer": "cus_1"}), DONE], [self.idem()])
        self.assertEqual(model.seen[1]["content"][0]["toolResult"]["content"], [{"text": "cus_1: 0"}])

    def test_keep_and_unknown_errors_decide_as_for_the_decorator(self):
        class Declined(Exception):
            pass

        class GatewayTimeout(Exception):
            pass

        calls = []

        @tool
        def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            calls.append(1)
            raise (Declined if amount_cents == 1 else GatewayTimeout)("card declined" if amount_cents == 1 else "timed out after sending")

        self.tools = [charge_card]
        hooks = self.idem(keep_errors=[Declined], unknown_errors=[GatewayTimeout])
        small = {"customer": "cus_1", "amount_cents": 1}
        _, model, _ = self.run_agent([use(1, args=small), use(2, args=small), use(3), use(4), DONE], [hooks])
        answers = [m["content"][0]["toolResult"] for m in model.seen[1:]]
        self.assertEqual(len(calls), 2, "a kept error is replayed, an unknown outcome refused: each ran once")
        self.assertEqual([a["status"] for a in answers], ["error"] * 4)
        self.assertIn("Declined - card declined", json.dumps(answers[1]))
        self.assertIn("outcome is unknown", json.dumps(answers[3]))

    def test_a_tool_yielding_plain_values_and_bytes_content(self):
        from strands.types.tools import AgentTool

        runs = []

        class Pdf(AgentTool):
            tool_name = "make_invoice"
            tool_type = "python"
            tool_spec = {"name": "make_invoice", "description": "Make an invoice.",
                         "inputSchema": {"json": {"type": "object", "properties": {"customer": {"type": "string"}}}}}

            async def stream(self, tool_use, invocation_state, **kwargs):
                runs.append(1)
                yield {"progress": "rendering"}
                yield {"toolUseId": tool_use["toolUseId"], "status": "success",
                       "content": [{"document": {"format": "pdf", "name": "invoice", "source": {"bytes": b"%PDF\x00\x01"}}}]}

        self.tools = [Pdf()]
        args = {"customer": "cus_1"}
        _, model, _ = self.run_agent([use(1, "make_invoice", args), use(2, "make_invoice", args), DONE],
                                     [IdempotencyHooks(tools=["make_invoice"], store=self.store)], session="t-9")
        self.assertEqual(len(runs), 1)
        for message in model.seen[1:]:
            block = message["content"][0]["toolResult"]["content"][0]
            self.assertEqual(block["document"]["source"]["bytes"], b"%PDF\x00\x01")

    def test_the_tools_own_error_releases_the_key(self):
        calls = []

        @tool
        def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("card network down")
            return "charged"

        self.tools = [charge_card]
        _, model, _ = self.run_agent([use(1), use(2), DONE], [self.idem()])
        self.assertEqual(len(calls), 2, "the error released the key: the second call ran")
        first = model.seen[1]["content"][0]["toolResult"]
        self.assertEqual(first["status"], "error")
        self.assertIn("card network down", json.dumps(first))

    def test_a_store_that_cannot_be_opened_is_said_and_logged(self):
        broken = IdempotencyHooks(tools=["charge_card"], store="postgres://idem@127.0.0.1:1/none?connect_timeout=1")
        with self.assertLogs("idem_runtime", "ERROR") as logs:
            _, model, _ = self.run_agent([use(1), DONE], [broken])
        self.assertIn("store cannot be used", "\n".join(logs.output))
        answer = model.seen[1]["content"][0]["toolResult"]
        self.assertEqual(answer["status"], "error")
        self.assertIn("charge_card was not run: its idempotency store cannot be used right now", json.dumps(answer))
        self.assertEqual(self.charges, [])

    def test_a_call_in_flight_tells_the_model_to_wait(self):
        started, release = threading.Event(), threading.Event()

        @tool
        def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card."""
            started.set()
            release.wait(30)
            return "charged"

        self.tools = [charge_card]
        hooks = self.idem(wait=0)
        state = {"idem_scope": "order-8"}
        first = threading.Thread(target=self.run_agent, args=([use(1), DONE], [hooks]), kwargs={"invocation_state": state})
        first.start()
        self.assertTrue(started.wait(30))
        _, model, _ = self.run_agent([use(2), DONE], [hooks], invocation_state=dict(state))
        release.set()
        first.join(30)
        answer = model.seen[1]["content"][0]["toolResult"]
        self.assertEqual(answer["status"], "error")
        self.assertIn("still running; do not call it again yet", json.dumps(answer))


if __name__ == "__main__":
    unittest.main()
