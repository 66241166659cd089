"""`idem mcp` driven by a client nobody here wrote: the official MCP Python SDK (`pip install mcp`).

Spawns `idem mcp --store sqlite:... -- idem example-mcp --db ...` over stdio and checks [design §8](docs/design.md#8-mcp)
from the outside. Run: python3 -m unittest test_mcp_proxy (after `cargo build -p idem-cli`).

The idem binary is $IDEM_BIN, else target/debug/idem under $CARGO_TARGET_DIR or the repository.
Without the `mcp` package or the binary the tests skip with the reason, unless
IDEM_REQUIRE_SERVICES=1 (CI), where they fail.
"""

import importlib
import os
import pathlib
import sqlite3
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "tests"))
from cli_support import idem_binary  # noqa: E402  (shared with the package's tests)

REQUIRED = os.environ.get("IDEM_REQUIRE_SERVICES") == "1"


def missing_for(modules, hint):
    """Why tests that need these modules and the idem binary cannot run here, or None. Under
    IDEM_REQUIRE_SERVICES=1 (CI) a reason raises instead: a package left out must fail the run,
    not skip quietly."""
    why = None
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            why = f"{name} is not importable ({e}); {hint}"
            break
    if why is None and not idem_binary().is_file():
        why = f"no idem binary at {idem_binary()} (cargo build -p idem-cli, or set IDEM_BIN)"
    if why and REQUIRED:
        raise RuntimeError(f"IDEM_REQUIRE_SERVICES=1 but {why}")
    return why


def missing():
    """Why these tests cannot run here, or None."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return "the official MCP Python SDK is not installed (pip install mcp)"
    if not idem_binary().is_file():
        return f"no idem binary at {idem_binary()} (cargo build -p idem-cli, or set IDEM_BIN)"
    return None


WHY = missing()
if WHY and REQUIRED:
    raise RuntimeError(f"IDEM_REQUIRE_SERVICES=1 but {WHY}")
if WHY:
    print(f"skipping the MCP proxy tests: {WHY}")


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def idem_meta(result):
    return (result.meta or {}).get("idem") or {}


@unittest.skipIf(WHY is not None, WHY or "")
class PythonClientThroughStdioProxy(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="idem-mcp-py-")
        self.store = os.path.join(self.dir.name, "idem.db")
        self.charges = os.path.join(self.dir.name, "charges.db")

    def tearDown(self):
        self.dir.cleanup()

    def count_charges(self):
        with sqlite3.connect(self.charges) as db:
            return db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]

    def session(self):
        from contextlib import asynccontextmanager

        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        idem = str(idem_binary())
        params = StdioServerParameters(
            command=idem,
            args=["mcp", "--store", f"sqlite:{self.store}", "--", idem, "example-mcp", "--db", self.charges],
        )

        @asynccontextmanager
        async def connected():
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session

        return connected()

    async def test_tools_list_asks_for_a_key_on_effect_tools_only(self):
        async with self.session() as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
        for name in ("charge_card", "send_email"):
            schema = tools[name].input_schema
            self.assertEqual(schema["properties"]["idempotency_key"]["type"], "string")
            self.assertIn("idempotency_key", schema["required"])
            self.assertIn("same key", tools[name].description)
        self.assertNotIn("idempotency_key", tools["get_balance"].input_schema.get("properties", {}))

    async def test_same_key_twice_charges_once_and_replays(self):
        args = {"customer": "cus_py", "amount_cents": 4900, "idempotency_key": "py-turn-1-charge"}
        async with self.session() as s:
            first = await s.call_tool("charge_card", args)
            second = await s.call_tool("charge_card", dict(args))
        self.assertFalse(first.is_error, text(first))
        self.assertEqual(idem_meta(first), {})
        self.assertFalse(second.is_error)
        self.assertEqual(text(second), text(first))
        self.assertEqual(second.structured_content, first.structured_content)
        self.assertEqual(idem_meta(second), {"replayed": True, "key": "py-turn-1-charge"})
        self.assertEqual(self.count_charges(), 1)

    async def test_a_new_proxy_process_replays_the_key(self):
        # A runtime that restarted mid-turn reconnects through a new proxy ([design §8](docs/design.md#8-mcp)).
        args = {"customer": "cus_py", "amount_cents": 100, "idempotency_key": "py-restart"}
        async with self.session() as s:
            first = await s.call_tool("charge_card", args)
        async with self.session() as s:
            again = await s.call_tool("charge_card", args)
        self.assertEqual(text(again), text(first))
        self.assertTrue(idem_meta(again).get("replayed"))
        self.assertEqual(self.count_charges(), 1)

    async def test_refusals_are_tool_errors_and_charge_nothing(self):
        async with self.session() as s:
            await s.call_tool("charge_card", {"customer": "c", "amount_cents": 1, "idempotency_key": "k"})
            changed = await s.call_tool("charge_card", {"customer": "c", "amount_cents": 2, "idempotency_key": "k"})
            missing_key = await s.call_tool("charge_card", {"customer": "c", "amount_cents": 1})
            bad_key = await s.call_tool("charge_card", {"customer": "c", "amount_cents": 1, "idempotency_key": "a b"})
            balance = await s.call_tool("get_balance", {"customer": "c"})
        self.assertTrue(changed.is_error)
        self.assertEqual(idem_meta(changed).get("problem"), "key-reused")
        self.assertIn("different call", text(changed))
        self.assertTrue(missing_key.is_error)
        self.assertEqual(idem_meta(missing_key).get("problem"), "key-missing")
        self.assertIn("idempotency_key", text(missing_key))
        self.assertEqual(idem_meta(bad_key).get("problem"), "key-invalid")
        # The read tool passes straight through: no key, no marker, and it sees one charge.
        self.assertFalse(balance.is_error, text(balance))
        self.assertEqual(idem_meta(balance), {})
        self.assertEqual(balance.structured_content["charges"], 1)
        self.assertEqual(self.count_charges(), 1)


# An upstream MCP server scripted line by line, to change what it declares between listings.
# `flip` is read-only at the first tools/list and has side effects from then on; `own`
# declares `idempotency_key` itself. Every tools/call is appended to $UPLOG.
SCRIPTED_UPSTREAM = r"""
import json, os, sys
lists = 0
def out(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line); mid = m.get("id"); meth = m.get("method")
    if meth == "initialize":
        out({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": m["params"]["protocolVersion"],
             "capabilities": {"tools": {}}, "serverInfo": {"name": "scripted", "version": "1"}}})
    elif meth == "tools/list":
        lists += 1
        out({"jsonrpc": "2.0", "id": mid, "result": {"tools": [
            {"name": "flip", "inputSchema": {"type": "object"},
             "annotations": {"readOnlyHint": lists == 1}},
            {"name": "own", "inputSchema": {"type": "object",
             "properties": {"idempotency_key": {"type": "string"}}}}]}})
    elif meth == "tools/call":
        with open(os.environ["UPLOG"], "a") as f:
            f.write(json.dumps(m["params"]) + "\n")
        out({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "ran"}]}})
    elif mid is not None and meth is not None:
        out({"jsonrpc": "2.0", "id": mid, "result": {}})
"""


@unittest.skipIf(WHY is not None, WHY or "")
class ProxyInFrontOfAChangingUpstream(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="idem-mcp-up-")
        self.upstream = os.path.join(self.dir.name, "upstream.py")
        self.log = os.path.join(self.dir.name, "calls.log")
        pathlib.Path(self.upstream).write_text(SCRIPTED_UPSTREAM)

    def tearDown(self):
        self.dir.cleanup()

    def calls(self):
        if not os.path.exists(self.log):
            return []
        import json

        return [json.loads(line) for line in pathlib.Path(self.log).read_text().splitlines()]

    def session(self):
        import sys
        from contextlib import asynccontextmanager

        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=str(idem_binary()),
            args=["mcp", "--store", f"sqlite:{self.dir.name}/idem.db", "--", sys.executable, self.upstream],
            env={**os.environ, "UPLOG": self.log},
        )

        @asynccontextmanager
        async def connected():
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session

        return connected()

    async def test_a_key_in_meta_reaches_an_upstream_that_declares_it(self):
        async with self.session() as s:
            await s.list_tools()
            result = await s.call_tool("own", {"a": 1}, meta={"idempotency_key": "m1"})
        self.assertFalse(result.is_error, text(result))
        self.assertEqual([c["arguments"] for c in self.calls()], [{"a": 1, "idempotency_key": "m1"}])

    async def test_a_tool_that_gained_side_effects_needs_a_key_once_the_listing_is_old(self):
        import asyncio

        async with self.session() as s:
            listed = {t.name: t for t in (await s.list_tools()).tools}
            self.assertNotIn("idempotency_key", listed["flip"].input_schema.get("properties", {}))
            # The proxy trusts a listing for 10 s; after that it reads the list again before
            # passing a tool through, and now `flip` has side effects.
            await asyncio.sleep(10.5)
            result = await s.call_tool("flip", {})
        self.assertTrue(result.is_error, text(result))
        self.assertEqual(idem_meta(result).get("problem"), "key-missing")
        self.assertEqual(self.calls(), [])


if __name__ == "__main__":
    unittest.main()
