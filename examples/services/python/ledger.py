"""The example payment service's one effect, shared by its FastAPI, Flask and Django versions:
a charge is a line appended to the ledger file ($LEDGER), so whoever counts lines counts
charges, across processes and restarts. The contract every example service follows
(conformance/http/README.md):

- ``POST /v1/charges`` (and ``/v1/waits``, the same handler on a route that waits for a
  duplicate in flight) charges once per call: JSON ``{"customer": ..., "amount_cents": ...}``
  or a form (``customer=...&amount=...``, as Stripe's SDKs send), answered 201 with the charge;
- ``simulate`` in the body asks for what a real service sometimes does: ``slow`` (charges,
  then sleeps ``delay_ms``), ``raise`` (charges, then raises), ``status`` (answers ``status``;
  charges unless it is 429 or 503), ``large`` (charges, answers ``size`` bytes), ``cookie``
  (charges, sets a session cookie), ``after`` (charges and answers, then the framework's
  after-response work sleeps ``delay_ms`` and raises, where the framework has such work);
- ``GET /v1/charges`` answers ``{"count": N}``; ``POST /v1/echo`` (no route requires a key)
  answers what it was sent.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Optional
from urllib.parse import parse_qs

LEDGER = os.environ.get("LEDGER", "ledger.jsonl")


class Raised(Exception):
    """What ``simulate=raise`` raises, after the charge."""


def fields(body: bytes, content_type: Optional[str]) -> dict:
    """The request's fields: JSON, or a form (Stripe's SDKs send forms)."""
    if content_type and content_type.startswith("application/x-www-form-urlencoded"):
        return {k: v[-1] for k, v in parse_qs(body.decode()).items()}
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        value = {}
    return value if isinstance(value, dict) else {}


def count() -> int:
    try:
        with open(LEDGER, encoding="utf-8") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _append(charge: dict) -> None:
    # One short O_APPEND write per charge: lines from many processes never interleave.
    with open(LEDGER, "a", encoding="utf-8") as f:
        f.write(json.dumps(charge) + "\n")


def after(f: dict) -> None:
    """The work ``simulate=after`` asks to run after the response (a receipt e-mail): sleeps
    ``delay_ms``, then raises. The framework runs it after the response's last byte
    (Starlette's and Litestar's background tasks, Flask's ``call_on_close``): neither the wait
    nor the exception is the request's."""
    if f.get("simulate") == "after":
        time.sleep(int(f.get("delay_ms", 2000)) / 1000)
        raise Raised("the work after the response failed")


def charge(f: dict) -> tuple:
    """Runs one request: ``(status, body, headers)``, or raises :class:`Raised`."""
    simulate = f.get("simulate", "")
    status = int(f.get("status", 201)) if simulate == "status" else 201
    amount = int(f.get("amount_cents", f.get("amount", 0)) or 0)
    charge = {"id": f"ch_{secrets.token_hex(6)}", "object": "charge", "customer": f.get("customer"), "amount": amount}
    if status not in (429, 503):
        _append(charge)
    headers = []
    if simulate == "slow":
        time.sleep(int(f.get("delay_ms", 1500)) / 1000)
    elif simulate == "raise":
        raise Raised(f"failed after charging {charge['id']}")
    elif simulate == "large":
        charge["padding"] = "x" * int(f.get("size", 2 * 1024 * 1024))
    elif simulate == "cookie":
        headers.append(("set-cookie", f"session={charge['id']}; Path=/; HttpOnly"))
    return status, charge, headers
