"""The example payment service on Litestar, made idempotent by the ASGI middleware:

    uvicorn litestar_app:app --port 3000

$IDEM_CONFIG names idem's TOML file (``off``: the service runs bare); $LEDGER the file of
charges (ledger.py says what it serves).
"""

import os

from litestar import Litestar, Request, Response, get, post
from litestar.middleware import DefineMiddleware
from litestar.background_tasks import BackgroundTask
from litestar.concurrency import sync_to_thread

from idem_runtime.asgi import IdempotencyMiddleware

import ledger


@post(["/v1/charges", "/v1/waits"])
async def create_charge(request: Request) -> Response:
    f = ledger.fields(await request.body(), request.headers.get("content-type"))
    # The charge blocks (a slow one sleeps): on a thread, not the event loop.
    status, body, headers = await sync_to_thread(ledger.charge, f)
    return Response(body, status_code=status, headers=dict(headers), background=BackgroundTask(ledger.after, f))


@get("/v1/charges")
async def charges() -> dict:
    return {"count": ledger.count()}


@post("/v1/echo", status_code=200)
async def echo(request: Request) -> dict:
    return {"echo": (await request.body()).decode()}


CONFIG = os.environ.get("IDEM_CONFIG", "idem.toml")
middleware = [] if CONFIG == "off" else [DefineMiddleware(IdempotencyMiddleware, config=CONFIG)]
app = Litestar([create_charge, charges, echo], middleware=middleware)
