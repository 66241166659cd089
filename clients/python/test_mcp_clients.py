"""`idem mcp` driven by today's clients, from their registries (pinned in .ci/run): the
official MCP Python SDK, the fastmcp 4 client, and Pydantic AI's MCPToolset with a scripted
FunctionModel (no LLM). Upstreams: `idem example-mcp`, and upstream_server.py (the Python
SDK's server: progress, logging, list_changed and elicitation inside a tool call; a
send_email whose SMTP can be down; a 20 MiB result).

Run: python3 -m unittest test_mcp_clients (after `cargo build -p idem-cli`).
"""

import asyncio
import os
import pathlib
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

import idem_key
from test_mcp_proxy import REQUIRED, idem_binary

HERE = pathlib.Path(__file__).resolve().parent


def missing():
    try:
        import fastmcp  # noqa: F401
        import mcp  # noqa: F401
        import pydantic_ai  # noqa: F401
    except ImportError as e:
        return f"a client package is missing ({e}); see .ci/run for the pinned versions"
    if not idem_binary().is_file():
        return f"no idem binary at {idem_binary()} (cargo build -p idem-cli, or set IDEM_BIN)"
    return None


WHY = missing()
if WHY and REQUIRED:
    raise RuntimeError(f"IDEM_REQUIRE_SERVICES=1 but {WHY}")


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


def idem_meta(result):
    return (result.meta or {}).get("idem") or {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


class Dir:
    def __init__(self, test, policy=""):
        self.tmp = tempfile.TemporaryDirectory(prefix="idem-mcp-clients-")
        test.addCleanup(self.tmp.cleanup)
        self.path = pathlib.Path(self.tmp.name)
        self.state = self.path / "state"
        self.state.mkdir()
        self.store = f"sqlite:{self.path / 'idem.db'}"
        self.charges = self.path / "charges.db"
        self.policy = self.path / "policy.toml"
        self.policy.write_text(policy)
        self.env = {**os.environ, "UPSTREAM_STATE": str(self.state)}

    def lines(self, name):
        p = self.state / name
        return p.read_text().splitlines() if p.exists() else []

    def count_charges(self):
        with sqlite3.connect(self.charges) as db:
            return db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]

    def proxy_args(self, *upstream):
        return ["mcp", "--store", self.store, "--policy", str(self.policy), "--", *upstream]

    def python_upstream(self):
        return self.proxy_args(sys.executable, str(HERE / "upstream_server.py"), "stdio")

    def example_upstream(self):
        idem = str(idem_binary())
        return self.proxy_args(idem, "example-mcp", "--db", str(self.charges))

    def http_proxy(self, test):
        """The Python upstream over HTTP, and `idem mcp --listen` in front of it: the proxy's URL."""
        port = free_port()
        up = subprocess.Popen(
            [sys.executable, str(HERE / "upstream_server.py"), "http", str(port)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        test.addCleanup(lambda: (up.kill(), up.wait()))
        wait_port(port)
        proxy = subprocess.Popen(
            [str(idem_binary()), "mcp", "--listen", "127.0.0.1:0", "--upstream-url",
             f"http://127.0.0.1:{port}/mcp", "--store", self.store, "--policy", str(self.policy)],
            stdout=subprocess.PIPE, text=True,
        )
        test.addCleanup(lambda: (proxy.kill(), proxy.wait()))
        line = proxy.stdout.readline()
        return next(w for w in line.split() if w.startswith("http://")).rstrip(";")


def sdk_session(d, args, **callbacks):
    from contextlib import asynccontextmanager

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=str(idem_binary()), args=args, env=d.env)

    @asynccontextmanager
    async def connected():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, **callbacks) as session:
                await session.initialize()
                yield session

    return connected()


@unittest.skipIf(WHY is not None, WHY or "")
class NotificationsAndServerRequests(unittest.IsolatedAsyncioTestCase):
    """Progress, a log message, list_changed and an elicitation in the middle of an effect
    call all reach the client through the proxy; the payment runs once."""

    async def check(self, seen, result, d):
        self.assertFalse(result.is_error, text(result))
        self.assertEqual(text(result), "paid")
        self.assertEqual(seen["progress"][:2], [1, 2])
        self.assertTrue(seen["log"], seen)
        self.assertTrue(seen["list_changed"], seen)
        self.assertEqual(seen["elicited"], ["Pay 700 cents?"])
        self.assertEqual(d.lines("paid.log"), ["700"])

    def callbacks(self, seen):
        from mcp import types

        async def elicit(context, params):
            seen["elicited"].append(params.message)
            return types.ElicitResult(action="accept", content={"confirm": True})

        async def logging(params):
            seen["log"].append(params.data)

        async def message(msg):
            if isinstance(msg, types.ToolListChangedNotification) or getattr(
                getattr(msg, "root", None), "method", None
            ) == "notifications/tools/list_changed":
                seen["list_changed"].append(True)

        return dict(elicitation_callback=elicit, logging_callback=logging, message_handler=message)

    async def test_over_stdio_with_the_official_sdk(self):
        d = Dir(self)
        seen = {"progress": [], "log": [], "list_changed": [], "elicited": []}

        async def progress(p, total, message):
            seen["progress"].append(p)

        async with sdk_session(d, d.python_upstream(), **self.callbacks(seen)) as s:
            result = await s.call_tool(
                "pay", {"amount_cents": 700}, progress_callback=progress, meta={"idempotency_key": "pay-1"}
            )
            await self.check(seen, result, d)
            again = await s.call_tool("pay", {"amount_cents": 700}, meta={"idempotency_key": "pay-1"})
        self.assertTrue(idem_meta(again).get("replayed"))
        self.assertEqual(d.lines("paid.log"), ["700"])

    async def test_over_http_with_fastmcp(self):
        from fastmcp import Client

        d = Dir(self)
        url = d.http_proxy(self)
        seen = {"progress": [], "log": [], "list_changed": [], "elicited": []}

        async def elicit(message, response_type, params, context):
            seen["elicited"].append(message)
            return response_type(confirm=True)

        async def log(message):
            seen["log"].append(message.data)

        async def progress(p, total, message):
            seen["progress"].append(p)

        async def on_message(msg):
            if type(msg).__name__ == "ToolListChangedNotification" or "list_changed" in repr(msg):
                seen["list_changed"].append(True)

        # auth: the caller's bearer token, which names it to idem mcp (a caller naming no one
        # is refused effect calls).
        client = Client(url, elicitation_handler=elicit, log_handler=log, progress_handler=progress,
                        message_handler=on_message, mode="legacy", auth="agent-h")
        async with client:
            result = await client.call_tool("pay", {"amount_cents": 700}, meta={"idempotency_key": "pay-h"})
        await self.check(seen, result, d)


@unittest.skipIf(WHY is not None, WHY or "")
class ToolErrors(unittest.IsolatedAsyncioTestCase):
    async def run_smtp_down(self, policy):
        d = Dir(self, policy)
        (d.state / "smtp_down").touch()
        args = {"to": "a@example.com", "subject": "receipt"}
        meta = {"idempotency_key": "turn-3-email"}
        async with sdk_session(d, d.python_upstream()) as s:
            failed = await s.call_tool("send_email", args, meta=meta)
            self.assertTrue(failed.is_error)
            self.assertEqual(d.lines("sent.log"), [])
            (d.state / "smtp_down").unlink()  # the cause is fixed
            retry = await s.call_tool("send_email", args, meta=meta)
            again = await s.call_tool("send_email", args, meta=meta)
        return d, failed, retry, again

    async def test_an_error_that_sent_nothing_lets_the_retry_send_once(self):
        d, _, retry, again = await self.run_smtp_down("")
        self.assertFalse(retry.is_error, text(retry))
        self.assertTrue(idem_meta(again).get("replayed"))
        self.assertEqual(d.lines("sent.log"), ["a@example.com receipt"])

    async def test_a_tool_that_keeps_errors_replays_them(self):
        d, failed, retry, _ = await self.run_smtp_down("[tools.send_email]\nkeep_errors = true\n")
        self.assertTrue(retry.is_error)
        self.assertEqual(text(retry), text(failed))
        self.assertTrue(idem_meta(retry).get("replayed"))
        self.assertEqual(d.lines("sent.log"), [])


@unittest.skipIf(WHY is not None, WHY or "")
class OversizedResults(unittest.IsolatedAsyncioTestCase):
    async def test_a_20_mib_result_is_refused_promptly_and_not_rerun(self):
        d = Dir(self)
        meta = {"idempotency_key": "big-1"}
        async with sdk_session(d, d.python_upstream()) as s:
            started = time.monotonic()
            first = await s.call_tool("big_report", {"size_mib": 20}, meta=meta, read_timeout_seconds=120)
            took = time.monotonic() - started
            retry = await s.call_tool("big_report", {"size_mib": 20}, meta=meta)
        self.assertEqual(idem_meta(first).get("problem"), "response-too-large", text(first))
        # Promptly: not after the upstream timeout (300 s).
        self.assertLess(took, 120)
        self.assertEqual(idem_meta(retry).get("problem"), "response-too-large")
        self.assertEqual(d.lines("big.log"), ["20"])


@unittest.skipIf(WHY is not None, WHY or "")
class Fastmcp4(unittest.IsolatedAsyncioTestCase):
    async def test_lists_tools_at_the_newest_protocol_and_a_runtime_key_charges_once(self):
        from fastmcp import Client
        from fastmcp.client.transports import StdioTransport

        d = Dir(self)
        client = Client(StdioTransport(str(idem_binary()), d.example_upstream()))
        async with client:
            tools = {t.name: t for t in await client.list_tools()}
            self.assertIn("idempotency_key", tools["charge_card"].inputSchema["properties"])
            self.assertNotIn("idempotency_key", tools["get_balance"].inputSchema.get("properties", {}))
            args = {"customer": "cus_f", "amount_cents": 4900}
            # The model invents a key each time; the runtime's key in _meta stays the same.
            first = await client.call_tool("charge_card", {**args, "idempotency_key": "llm-a"},
                                           meta={"idempotency_key": "turn-9-charge"})
            second = await client.call_tool("charge_card", {**args, "idempotency_key": "llm-b"},
                                            meta={"idempotency_key": "turn-9-charge"})
            version = getattr(client, "protocol_version", None)
        print(f"fastmcp {__import__('fastmcp').__version__} negotiated {version}")
        self.assertFalse(first.is_error)
        self.assertEqual(idem_meta(second), {"replayed": True, "key": "turn-9-charge"})
        self.assertEqual(d.count_charges(), 1)


@unittest.skipIf(WHY is not None, WHY or "")
class PydanticAi(unittest.IsolatedAsyncioTestCase):
    async def test_a_scripted_model_that_retries_after_a_lost_answer_charges_once(self):
        from fastmcp.client.transports import StdioTransport
        from pydantic_ai import Agent, ModelRetry
        from pydantic_ai.mcp import MCPToolset
        from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel

        d = Dir(self, "[tools.charge_card]\nkey = \"runtime\"\n")
        attempts = []

        def model(messages, info):
            retries = sum(isinstance(p, RetryPromptPart) for m in messages for p in getattr(m, "parts", []))
            if retries == 0 and len(messages) == 1:
                # The runtime's schema hides the key: the model is not asked for one.
                tool = next(t for t in info.function_tools if t.name == "charge_card")
                assert "idempotency_key" not in tool.parameters_json_schema.get("properties", {})
            if len(messages) <= 3:
                return ModelResponse(parts=[ToolCallPart("charge_card", {
                    "customer": "cus_pa", "amount_cents": 4900,
                    # a model that invents a key anyway, a new one on each retry
                    "idempotency_key": f"invented-{len(messages)}"})])
            return ModelResponse(parts=[TextPart("done")])

        async def process_tool_call(ctx, call_tool, name, args):
            # The runtime's key, derived at the point of intent (this turn, the tool, its
            # arguments without any idempotency_key), as README shows: the same on every
            # retry of the intent, whatever key the model invented.
            key = idem_key.derive(ctx.deps["turn"], name, args)
            result = await call_tool(name, args, metadata={"idempotency_key": key})
            attempts.append(result)
            if len(attempts) == 1:
                raise ModelRetry("the connection dropped before the answer came; try again")
            return result

        toolset = MCPToolset(StdioTransport(str(idem_binary()), d.example_upstream()),
                             process_tool_call=process_tool_call)
        agent = Agent(FunctionModel(model), toolsets=[toolset], deps_type=dict)
        async with agent:
            out = await agent.run("charge cus_pa 49 euros", deps={"turn": "turn-42"})
        self.assertEqual(out.output, "done")
        self.assertEqual(len(attempts), 2)
        self.assertEqual(d.count_charges(), 1)


if __name__ == "__main__":
    unittest.main()
