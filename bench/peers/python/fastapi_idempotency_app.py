"""The example payment service on FastAPI, made idempotent by fastapi-idempotency (PyPI
``fastapi-idempotency``), set up as its README recommends beyond a try-out: the persistent
TortoiseStore (the README: "For anything beyond a single worker process, plug in a persistent
Store"), here on the SQLite file the suite hands out, and a ``scope`` that names the caller by
its credentials rather than its IP (the README: "for a logged-in API you almost always want to
group by session or user instead").

    uvicorn fastapi_idempotency_app:app --port 3000

What it cannot be told (the suite shows the difference): to require a key on a route. A
write without a key is not run as-is either: the library's "automatic" mode treats an
identical write from the same scope within 10 s as a duplicate.
"""

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi_idempotency import IdempotencyMiddleware
from fastapi_idempotency.stores.tortoise import TortoiseStore
from tortoise.contrib.fastapi import RegisterTortoise

import peer_env
from peer_env import ledger


def scope(request: Request) -> str:
    """The caller: its Authorization or X-API-Key credential, else its address (the README's
    fallback)."""
    for name in ("authorization", "x-api-key"):
        if request.headers.get(name):
            return f"{name}:{request.headers[name]}"
    return f"ip:{request.client.host}" if request.client else ""


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with RegisterTortoise(
        app,
        db_url=f"sqlite://{peer_env.sqlite_path()}",
        modules={"models": ["fastapi_idempotency.stores.tortoise"]},
        generate_schemas=True,
    ):
        yield


app = FastAPI(lifespan=lifespan)
# The suite's settings (conformance/http/idem.toml) where the library has them: 64 KiB request
# and stored-response bounds, a 2 s lease (renewed while the request runs), and the /v1/waits
# route's 10 s wait, which here is global (the library has no per-route wait, nor a route that
# answers a duplicate at once). Defaults otherwise: header Idempotency-Key, POST, PUT, PATCH and
# DELETE on every path.
app.add_middleware(
    IdempotencyMiddleware,
    store=TortoiseStore(),
    scope=scope,
    max_request_body_bytes=65536,
    max_response_body_bytes=65536,
    lease_seconds=2,
    heartbeat_seconds=0.5,
    wait_seconds=10,
)


@app.post("/v1/charges")
@app.post("/v1/waits")
async def create_charge(request: Request):
    f = ledger.fields(await request.body(), request.headers.get("content-type"))
    status, body, headers = await run_in_threadpool(ledger.charge, f)
    return JSONResponse(body, status_code=status, headers=dict(headers))


@app.get("/v1/charges")
async def charges():
    return {"count": ledger.count()}


@app.post("/v1/echo")
async def echo(request: Request):
    return {"echo": (await request.body()).decode()}
