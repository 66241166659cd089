"""idem_runtime.mcp through `idem mcp` with runtime keys (`key = "runtime"` in its policy file)
in front of clients/python/upstream_server.py (the official SDK's server, which logs each
e-mail sent and each payment made), over stdio and streamable HTTP, with the official SDK's
ClientSession.

Run: cd clients/python && IDEM_BIN=target/debug/idem python -m unittest tests.test_mcp_helper -v
Without the mcp package or the binary the tests skip, unless IDEM_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import unittest
from contextlib import asynccontextmanager

from cli_support import HERE, cli_missing, idem_binary
from net_support import FlakyProxy, mcp_over_http, require

try:
    import mcp  # noqa: F401
except ImportError:  # pragma: no cover - reported by need()
    mcp = None

WHY = None if mcp is not None else "the official MCP Python SDK is not installed (pip install mcp)"
WHY = WHY or cli_missing()
UPSTREAM = HERE.parent / "upstream_server.py"
EMAIL = {"to": "ana@example.com", "subject": "Your order"}


class LosesOneAnswer:
    """Between the helper and the session: the first call reaches the proxy and the tool
    runs, then its answer is lost (the SDK's own timeout error, raised after the real call
    returned). Records the ``_meta`` each attempt sent."""

    def __init__(self, session):
        self.session = session
        self.metas = []

    async def call_tool(self, name, arguments=None, **kwargs):
        from mcp.shared.exceptions import MCPError

        self.metas.append(kwargs.get("meta"))
        result = await self.session.call_tool(name, arguments, **kwargs)
        if len(self.metas) == 1:
            raise MCPError(code=-32001, message=f"Request 'tools/call' timed out")
        return result


class RuntimeKeysThroughTheProxy(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        require(self, WHY)
        tmp = tempfile.TemporaryDirectory(prefix="idem-mcp-helper-")
        self.addCleanup(tmp.cleanup)
        self.dir = pathlib.Path(tmp.name)
        (self.dir / "state").mkdir()
        self.store = f"sqlite:{self.dir / 'idem.db'}"
        self.attempts = []

    def lines(self, name):
        p = self.dir / "state" / name
        return p.read_text().splitlines() if p.exists() else []

    @asynccontextmanager
    async def session(self, policy='[defaults]\nkey = "runtime"\n', **callbacks):
        import os

        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        (self.dir / "policy.toml").write_text(policy)
        params = StdioServerParameters(
            command=str(idem_binary()),
            args=["mcp", "--store", self.store, "--policy", str(self.dir / "policy.toml"), "--",
                  sys.executable, str(UPSTREAM), "stdio"],
            env={**os.environ, "UPSTREAM_STATE": str(self.dir / "state")},
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, **callbacks) as s:
                await s.initialize()
                yield s

    async def test_a_lost_answer_is_retried_with_the_key_in_meta_and_replayed(self):
        from mcp.types import TextContent  # noqa: F401 - the SDK is the one under test

        from idem_runtime import derive_key, scope
        from idem_runtime.mcp import call_tool, idem_meta, replayed

        async with self.session() as s:
            # Runtime mode: a call without the runtime's key is refused, and the tool not run.
            refused = await s.call_tool("send_email", dict(EMAIL))
            self.assertEqual(idem_meta(refused).get("problem"), "key-missing")
            lossy = LosesOneAnswer(s)
            with scope("run-31"):
                result = await call_tool(lossy, "send_email", dict(EMAIL), on_attempt=self.attempts.append,
                                         sleep=lambda d: _nothing())
        key = derive_key("run-31", "send_email", EMAIL)
        self.assertEqual(lossy.metas, [{"idempotency_key": key}] * 2, "the same key in _meta on every attempt")
        self.assertFalse(result.is_error, result)
        self.assertTrue(replayed(result))
        self.assertEqual(idem_meta(result), {"replayed": True, "key": key})
        self.assertEqual(self.lines("sent.log"), ["ana@example.com Your order"], "one e-mail")
        self.assertEqual([a.number for a in self.attempts], [1, 2])
        self.assertIsNotNone(self.attempts[0].retry_in)

    async def test_a_real_timeout_then_in_flight_then_the_replay(self):
        """The first attempt's answer really is late (the tool waits for the user's
        confirmation); the retry finds the key in flight (the proxy waits 0 s for it) and is
        retried again; only then does the user confirm: one payment, the last answer a replay."""
        import anyio
        from mcp.types import ElicitResult

        from idem_runtime.mcp import IdempotentSession, RetryPolicy, replayed

        in_flight_seen = anyio.Event()

        async def confirm(context, params):
            await in_flight_seen.wait()
            return ElicitResult(action="accept", content={"confirm": True})

        def on_attempt(a):
            self.attempts.append(a)
            if a.problem == "in-flight":
                in_flight_seen.set()

        policy = '[defaults]\nkey = "runtime"\nwait = "0s"\n'
        async with self.session(policy, elicitation_callback=confirm) as s:
            tools = IdempotentSession(s, scope="run-32", on_attempt=on_attempt,
                                      retry=RetryPolicy(max_attempts=10, base=0.05, cap=0.5))
            result = await tools.call_tool("pay", {"amount_cents": 1200}, read_timeout_seconds=1)
        self.assertEqual(self.attempts[0].error.error.code, -32001)
        self.assertIn("in-flight", [a.problem for a in self.attempts])
        self.assertFalse(result.is_error, result)
        self.assertTrue(replayed(result))
        self.assertEqual(self.lines("paid.log"), ["1200"], "one payment")

    async def test_a_closed_session_says_to_call_again_with_the_key(self):
        from idem_runtime.mcp import CallLostError, call_tool, replayed

        async with self.session() as s:
            pass
        with self.assertRaises(CallLostError) as lost:
            await call_tool(s, "send_email", dict(EMAIL), scope="run-33")
        async with self.session() as s:
            again = await call_tool(s, "send_email", dict(EMAIL), key=lost.exception.key)
            twice = await call_tool(s, "send_email", dict(EMAIL), scope="run-33")
        self.assertFalse(replayed(again))
        self.assertTrue(replayed(twice))
        self.assertEqual(len(self.lines("sent.log")), 1)

    async def test_over_http_a_cut_off_answer_ends_the_session_and_a_new_one_replays(self):
        """Over streamable HTTP a lost answer is a real one: a TCP proxy cuts the connection
        when the answer to tools/call starts. The SDK ends the session; the helper opens a
        new one and sends the same key: one e-mail, the answer a replay."""
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        from idem_runtime.mcp import call_tool_with_reconnect, replayed

        policy = self.dir / "policy.toml"
        policy.write_text('[defaults]\nkey = "runtime"\n')
        import anyio

        port = await anyio.to_thread.run_sync(lambda: mcp_over_http(self, self.dir / "state", self.store, policy))
        flaky = FlakyProxy(port, only=b'"tools/call"')
        self.addCleanup(flaky.close)
        flaky.drops = 1

        import httpx2

        @asynccontextmanager
        async def connect():
            # The caller names itself, as idem mcp requires of effect calls over HTTP.
            caller = httpx2.AsyncClient(headers={"Authorization": "Bearer agent-34"})
            async with caller, streamable_http_client(
                f"http://127.0.0.1:{flaky.port}/mcp", http_client=caller
            ) as (read, write, *_):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    yield s

        result = await call_tool_with_reconnect(connect, "send_email", dict(EMAIL), scope="run-34",
                                                on_attempt=self.attempts.append, sleep=lambda d: _nothing())
        self.assertEqual(flaky.dropped, 1)
        self.assertFalse(result.is_error, result)
        self.assertTrue(replayed(result))
        self.assertEqual(self.lines("sent.log"), ["ana@example.com Your order"], "one e-mail")
        self.assertIsNotNone(self.attempts[0].error, "the first session was lost")


async def _nothing():
    return None


if __name__ == "__main__":
    unittest.main()
