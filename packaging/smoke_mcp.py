"""An MCP host's view of the wheel: the official Python SDK's stdio client launches
`uvx --from idem-runtime idem mcp ...` as a client config line would ("command": "uvx"), from
the package index given, with the upstream given by --upstream-cmd; two calls with one key
make one charge (counted in the example server's database), the second marked replayed.

    python packaging/smoke_mcp.py INDEX_URL UVX IDEM_FOR_THE_UPSTREAM

Runs with the environment it is given (CI gives a PATH with no cargo or rustc on it).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import tempfile
from pathlib import Path


async def main(index: str, uvx: str, upstream_idem: str) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        charges = d / "charges.db"
        env = {**os.environ, "UV_CACHE_DIR": str(d / "uv-cache"), "UV_TOOL_DIR": str(d / "uv-tools")}
        params = StdioServerParameters(
            command=uvx,
            args=["--index-url", index, "--from", "idem-runtime", "idem", "mcp", "--store", f"sqlite:{d / 'idem.db'}",
                  "--upstream-cmd", f"{upstream_idem} example-mcp --db {charges}"],
            env=env,
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = {t.name: t for t in (await session.list_tools()).tools}
                schema = tools["charge_card"].model_dump(by_alias=True)["inputSchema"]
                assert "idempotency_key" in schema["required"], schema
                args = {"customer": "cus_1", "amount_cents": 4900, "idempotency_key": "intent-1"}
                first = (await session.call_tool("charge_card", args)).model_dump(by_alias=True)
                again = (await session.call_tool("charge_card", args)).model_dump(by_alias=True)
        assert not first.get("isError"), first
        assert again["content"] == first["content"], (first, again)
        assert (again.get("_meta") or {}).get("idem", {}).get("replayed") is True, again
        with sqlite3.connect(charges) as db:
            (n,) = db.execute("SELECT COUNT(*) FROM charges").fetchone()
        assert n == 1, f"{n} charges for one intent"
    print("uvx --from idem-runtime idem mcp: two calls with one key, one charge, the second marked replayed")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
