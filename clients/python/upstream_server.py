"""An MCP server written with the official Python SDK, for idem mcp's client tests.

`python3 upstream_server.py stdio` or `python3 upstream_server.py http PORT`. Its state is
files in $UPSTREAM_STATE: `sent.log` (one line per e-mail sent), `paid.log`, `big.log` (one
line per big_report run); while `smtp_down` exists, send_email fails without sending.
"""

import os
import pathlib
import sys

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

STATE = pathlib.Path(os.environ["UPSTREAM_STATE"])
server = MCPServer("upstream")


def log(name, line):
    with open(STATE / name, "a") as f:
        f.write(line + "\n")


@server.tool()
async def send_email(to: str, subject: str) -> str:
    """Sends an e-mail."""
    if (STATE / "smtp_down").exists():
        raise RuntimeError("the SMTP server is unreachable; nothing was sent")
    log("sent.log", f"{to} {subject}")
    return f"sent to {to}"


class Confirm(BaseModel):
    confirm: bool


@server.tool()
async def pay(amount_cents: int, ctx: Context) -> str:
    """Pays, after the user confirms."""
    await ctx.report_progress(1, 3, "checking")
    await ctx.info("asking the user to confirm")
    await ctx.session.send_tool_list_changed()
    answer = await ctx.elicit(f"Pay {amount_cents} cents?", Confirm)
    await ctx.report_progress(2, 3, "confirmed")
    if answer.action == "accept" and answer.data and answer.data.confirm:
        log("paid.log", str(amount_cents))
        return "paid"
    return "not paid"


@server.tool()
def big_report(size_mib: int) -> str:
    """Builds a report of size_mib MiB."""
    log("big.log", str(size_mib))
    return "x" * (size_mib << 20)


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
