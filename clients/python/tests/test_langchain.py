"""The LangChain/LangGraph adapter (idem_runtime.adapters.langchain) under the real frameworks.

A tool adds a row to a SQLite table of the test (separate from idem's store file); a middleware
or interceptor between idem and the framework loses its result once (raises a timeout after
the tool ran and idem stored the result); the framework's own retry path (LangChain's
``ToolRetryMiddleware``, or a scripted model calling the tool again in a LangGraph graph) calls
it again -> exactly one row, the second answer marked as a replay, and ``idem inspect`` (the
CLI) shows the record. Control tests without idem show two rows, so the scenario is real.

Needs langchain, langgraph (pinned in docs/python.md) and the idem binary ($IDEM_BIN, else
target/debug/idem); without them the tests skip, or fail under IDEM_REQUIRE_SERVICES=1.
"""

import asyncio
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from test_mcp_proxy import idem_binary, missing_for  # noqa: E402  (one place finds the CLI)

import idem_runtime  # noqa: E402

WHY = missing_for(
    ["langchain.agents", "langgraph.prebuilt"], "pip install the versions pinned in docs/python.md"
)

if not WHY:
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware, ToolRetryMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, ToolRuntime, tools_condition

    from idem_runtime.adapters.langchain import IdempotencyMiddleware

    class ScriptedModel(GenericFakeChatModel):
        """GenericFakeChatModel answers from its script; agents bind tools to it first."""

        def bind_tools(self, tools, **kwargs):
            return self

    class LoseOnce(AgentMiddleware):
        """The result is lost on its way back, once: the tool ran and idem stored its result."""

        def __init__(self):
            super().__init__()
            self.lost = 0

        def wrap_tool_call(self, request, handler):
            result = handler(request)
            return self._lose(result)

        async def awrap_tool_call(self, request, handler):
            result = await handler(request)
            return self._lose(result)

        def _lose(self, result):
            if not self.lost:
                self.lost += 1
                raise TimeoutError("the tool's answer was lost on the way back")
            return result


def call(name, args, call_id):
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])


@unittest.skipIf(WHY, WHY or "")
class LangChainTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        d = pathlib.Path(self.dir.name)
        self.store = f"sqlite:{d / 'idem.db'}"
        self.effects = d / "effects.db"
        with sqlite3.connect(self.effects) as db:
            db.execute("CREATE TABLE charges (customer TEXT, amount_cents INTEGER, key TEXT)")
        self.keys_seen, self.scopes_seen = [], []
        effects, keys_seen, scopes_seen = self.effects, self.keys_seen, self.scopes_seen

        @tool
        def charge_card(customer: str, amount_cents: int, idempotency_key: str = "") -> str:
            """Charge a customer's card."""
            keys_seen.append(idempotency_key)
            scopes_seen.append(idem_runtime.current_scope())
            with sqlite3.connect(effects) as db:
                db.execute("INSERT INTO charges VALUES (?, ?, ?)", (customer, amount_cents, idempotency_key))
            return f"charged {customer} {amount_cents}"

        @tool
        def lookup(customer: str) -> str:
            """Read a customer's balance (no side effect)."""
            return f"{customer}: 0"

        self.tools = [charge_card, lookup]
        self.args = {"customer": "cus_1", "amount_cents": 4900}

    def rows(self):
        with sqlite3.connect(self.effects) as db:
            return db.execute("SELECT customer, amount_cents FROM charges").fetchall()

    def idem(self, **kw):
        return IdempotencyMiddleware(tools=["charge_card"], store=self.store, **kw)

    def key(self, scope):
        return idempotent_key(scope, self.args)

    def inspect_cli(self, key):
        out = subprocess.run(
            [str(idem_binary()), "inspect", key, "--store", self.store],
            capture_output=True, text=True, timeout=60,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def agent(self, script, middleware, checkpointer=True):
        return create_agent(
            ScriptedModel(messages=iter(script)),
            tools=self.tools,
            middleware=middleware,
            checkpointer=InMemorySaver() if checkpointer else None,
        )

    @staticmethod
    def retry():
        return ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)

    @staticmethod
    def tool_messages(result):
        return [m for m in result["messages"] if isinstance(m, ToolMessage)]

    def test_the_readme_example_runs_with_langchains_fake_model(self):
        """examples/agents/langchain_charge.py, run as a user runs it: one charge for two attempts."""
        example = pathlib.Path(__file__).resolve().parents[3] / "examples" / "agents" / "langchain_charge.py"
        out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("1 charge for 2 tool attempts", out.stdout)

    # -- LangChain agent: ToolRetryMiddleware retries after the loss -------------------------

    def test_tool_retry_middleware_after_a_lost_result_charges_once(self):
        script = [call("charge_card", self.args, "c1"), AIMessage("done")]
        agent = self.agent(script, [self.retry(), LoseOnce(), self.idem()])
        result = agent.invoke({"messages": [("user", "charge")]}, {"configurable": {"thread_id": "t1"}})
        self.assertEqual(self.rows(), [("cus_1", 4900)])
        (answer,) = self.tool_messages(result)
        key = self.key("t1")
        self.assertEqual(answer.response_metadata["idem"], {"replayed": True, "key": key})
        self.assertEqual(answer.content, "charged cus_1 4900")
        self.assertEqual(answer.tool_call_id, "c1")
        self.assertEqual(self.keys_seen, [key])  # the tool was handed the key
        shown = self.inspect_cli(key)
        self.assertIn(key, shown)
        self.assertIn("charged cus_1 4900", shown)

    def test_without_idem_the_same_retry_charges_twice(self):
        script = [call("charge_card", self.args, "c1"), AIMessage("done")]
        agent = self.agent(script, [self.retry(), LoseOnce()])
        agent.invoke({"messages": [("user", "charge")]}, {"configurable": {"thread_id": "t1"}})
        self.assertEqual(len(self.rows()), 2)

    def test_async_agent_retry_charges_once(self):
        script = [call("charge_card", self.args, "c1"), AIMessage("done")]
        agent = self.agent(script, [self.retry(), LoseOnce(), self.idem()])
        result = asyncio.run(
            agent.ainvoke({"messages": [("user", "charge")]}, {"configurable": {"thread_id": "t1"}})
        )
        self.assertEqual(self.rows(), [("cus_1", 4900)])
        (answer,) = self.tool_messages(result)
        self.assertTrue(answer.response_metadata["idem"]["replayed"])

    # -- the scope ------------------------------------------------------------------------------

    def test_the_scope_is_the_thread_id(self):
        idem = self.idem()
        for thread in ("t1", "t2", "t1"):
            agent = self.agent([call("charge_card", self.args, "c-" + thread), AIMessage("ok")], [idem])
            result = agent.invoke({"messages": [("user", "charge")]}, {"configurable": {"thread_id": thread}})
            meta = self.tool_messages(result)[0].response_metadata["idem"]
            self.assertEqual(meta["key"], self.key(thread))
        # t1 twice (a new invoke, a new tool-call id) is one charge; t2 is another.
        self.assertEqual(len(self.rows()), 2)
        self.assertNotEqual(self.key("t1"), self.key("t2"))
        self.assertEqual(self.keys_seen, [self.key("t1"), self.key("t2")])
        # The tool runs in its scope, so @idempotent functions it calls share it.
        self.assertEqual([s.id for s in self.scopes_seen], ["t1", "t2"])
        self.assertTrue(meta["replayed"])

    def test_no_thread_falls_back_to_the_scope_context_else_refuses(self):
        script = [call("charge_card", self.args, "c1"), AIMessage("ok")]
        with self.assertRaises(idem_runtime.ScopeMissingError) as e:
            self.agent(script, [self.idem()], checkpointer=False).invoke({"messages": [("user", "x")]})
        self.assertIn("thread_id", str(e.exception))
        self.assertEqual(self.rows(), [])  # refused before the tool ran
        with idem_runtime.scope("order-7"):
            script = [call("charge_card", self.args, "c1"), AIMessage("ok")]
            result = self.agent(script, [self.idem()], checkpointer=False).invoke({"messages": [("user", "x")]})
        self.assertEqual(self.tool_messages(result)[0].response_metadata["idem"]["key"], self.key("order-7"))

    def test_explicit_scope_function_and_key_fields(self):
        idem = self.idem(scope=lambda request: "order-9", key_fields={"charge_card": ["customer"]})
        script = [call("charge_card", self.args, "c1"), call("charge_card", {**self.args, "amount_cents": 1}, "c2"), AIMessage("ok")]
        # The customer makes the intent: another amount under the same key is a replay.
        result = self.agent(script, [idem]).invoke({"messages": [("user", "x")]}, {"configurable": {"thread_id": "t1"}})
        first, second = self.tool_messages(result)
        self.assertEqual((first.response_metadata["idem"]["replayed"], second.response_metadata["idem"]["replayed"]), (False, True))
        self.assertEqual(self.rows(), [("cus_1", 4900)])
        self.assertEqual(
            self.keys_seen, [idem_runtime.derive_key("order-9", "charge_card", self.args, key_fields=["customer"])]
        )

    # -- what is not stored -----------------------------------------------------------------

    def test_a_failing_tool_releases_the_key_and_other_tools_pass_through(self):
        failures = []
        effects = self.effects

        @tool
        def charge_card(customer: str, amount_cents: int) -> str:
            """Charge a customer's card; the first attempt fails before charging."""
            if not failures:
                failures.append(1)
                raise ConnectionError("card network down")
            with sqlite3.connect(effects) as db:
                db.execute("INSERT INTO charges VALUES (?, ?, '')", (customer, amount_cents))
            return "charged"

        self.tools = [charge_card, self.tools[1]]
        script = [call("lookup", {"customer": "cus_1"}, "c0"), call("charge_card", self.args, "c1"), AIMessage("ok")]
        result = self.agent(script, [self.retry(), self.idem()]).invoke(
            {"messages": [("user", "x")]}, {"configurable": {"thread_id": "t1"}}
        )
        self.assertEqual(self.rows(), [("cus_1", 4900)])  # the retry ran it
        read, charged = self.tool_messages(result)
        self.assertNotIn("idem", read.response_metadata)
        self.assertEqual(charged.response_metadata["idem"]["replayed"], False)

    def test_an_invalid_call_answered_as_an_error_message_is_not_stored(self):
        bad = {"customer": "cus_1", "amount_cents": "lots"}
        script = [call("charge_card", bad, "c1"), call("charge_card", bad, "c2"), AIMessage("ok")]
        result = self.agent(script, [self.idem()]).invoke(
            {"messages": [("user", "x")]}, {"configurable": {"thread_id": "t1"}}
        )
        first, second = self.tool_messages(result)
        self.assertEqual((first.status, second.status), ("error", "error"))
        self.assertNotIn("idem", second.response_metadata)  # asked again, not replayed
        self.assertEqual(self.rows(), [])
        self.assertIsNone(idem_runtime.inspect_key(idempotent_key("t1", bad), self.store))

    def test_a_command_result_ran_once_and_its_retry_is_refused(self):
        from langgraph.types import Command

        effects = self.effects

        @tool
        def charge_card(customer: str, amount_cents: int, runtime: ToolRuntime) -> Command:
            """Charge, and answer with a state update."""
            with sqlite3.connect(effects) as db:
                db.execute("INSERT INTO charges VALUES (?, ?, '')", (customer, amount_cents))
            message = ToolMessage("charged", tool_call_id=runtime.tool_call_id)
            return Command(update={"messages": [message]})

        self.tools = [charge_card]
        script = [call("charge_card", self.args, "c1"), call("charge_card", self.args, "c2"), AIMessage("ok")]
        with self.assertRaises(idem_runtime.OutcomeUnknownError):
            self.agent(script, [self.idem()]).invoke({"messages": [("user", "x")]}, {"configurable": {"thread_id": "t1"}})
        self.assertEqual(len(self.rows()), 1)

    # -- LangGraph: a graph of our own with the prebuilt ToolNode ---------------------------

    def graph(self, script, tool_node):
        model = ScriptedModel(messages=iter(script))
        g = StateGraph(MessagesState)
        g.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
        g.add_node("tools", tool_node)
        g.add_edge(START, "model")
        g.add_conditional_edges("model", tools_condition)
        g.add_edge("tools", "model")
        return g.compile(checkpointer=InMemorySaver())

    def langgraph_script(self):
        # The model sees the lost result as an error and asks again, with a new tool-call id.
        return [call("charge_card", self.args, "c1"), call("charge_card", self.args, "c2"), AIMessage("done")]

    def check_langgraph(self, result):
        self.assertEqual(self.rows(), [("cus_1", 4900)])
        lost, again = self.tool_messages(result)
        self.assertEqual(lost.status, "error")
        self.assertEqual(again.tool_call_id, "c2")
        self.assertEqual(again.content, "charged cus_1 4900")
        self.assertEqual(again.response_metadata["idem"], {"replayed": True, "key": self.key("g1")})
        self.assertIn(self.key("g1"), self.inspect_cli(self.key("g1")))

    def test_langgraph_tool_node_model_asks_again_after_a_loss(self):
        idem, lose = self.idem(), LoseOnce()
        node = ToolNode(
            self.tools,
            wrap_tool_call=lambda req, run: lose.wrap_tool_call(req, lambda r: idem.wrap_tool_call(r, run)),
            handle_tool_errors=True,
        )
        result = self.graph(self.langgraph_script(), node).invoke(
            {"messages": [("user", "charge")]}, {"configurable": {"thread_id": "g1"}}
        )
        self.check_langgraph(result)

    def test_langgraph_tool_node_async(self):
        idem, lose = self.idem(), LoseOnce()

        async def wrap(req, run):
            async def inner(r):
                return await idem.awrap_tool_call(r, run)

            return await lose.awrap_tool_call(req, inner)

        node = ToolNode(self.tools, awrap_tool_call=wrap, handle_tool_errors=True)
        result = asyncio.run(
            self.graph(self.langgraph_script(), node).ainvoke(
                {"messages": [("user", "charge")]}, {"configurable": {"thread_id": "g1"}}
            )
        )
        self.check_langgraph(result)

    def test_without_idem_the_graph_charges_twice(self):
        lose = LoseOnce()
        node = ToolNode(self.tools, wrap_tool_call=lose.wrap_tool_call, handle_tool_errors=True)
        self.graph(self.langgraph_script(), node).invoke(
            {"messages": [("user", "charge")]}, {"configurable": {"thread_id": "g1"}}
        )
        self.assertEqual(len(self.rows()), 2)


def idempotent_key(scope, args):
    return idem_runtime.derive_key(scope, "charge_card", args)


if __name__ == "__main__":
    unittest.main()
