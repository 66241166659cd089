"""The example payment service on FastAPI, made idempotent by the ASGI middleware:

    uvicorn fastapi_app:app --port 3000

$IDEM_CONFIG names idem's TOML file (``off``: the service runs bare, as the gateway and the
benchmarks' baseline take it); $LEDGER the file of charges (ledger.py says what it serves).
"""

import os

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from idem_runtime.asgi import IdempotencyMiddleware

import ledger

app = FastAPI()
if os.environ.get("IDEM_CONFIG") != "off":
    app.add_middleware(IdempotencyMiddleware, config=os.environ.get("IDEM_CONFIG", "idem.toml"))


@app.post("/v1/charges")
@app.post("/v1/waits")
async def create_charge(request: Request):
    f = ledger.fields(await request.body(), request.headers.get("content-type"))
    # The charge blocks (a slow one sleeps): on a thread, not the event loop.
    status, body, headers = await run_in_threadpool(ledger.charge, f)
    return JSONResponse(body, status_code=status, headers=dict(headers), background=BackgroundTask(ledger.after, f))


@app.get("/v1/charges")
async def charges():
    return {"count": ledger.count()}


@app.post("/v1/echo")
async def echo(request: Request):
    return {"echo": (await request.body()).decode()}
