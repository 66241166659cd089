"""The example payment service on FastAPI, made idempotent by asgi-idempotency-header
(PyPI ``asgi-idempotency-header``), set up as its README's "Setup" section does: the
middleware with a RedisBackend (its README calls MemoryBackend "mainly here for local
development or testing").

    uvicorn asgi_idempotency_header_app:app --port 3000

What it cannot be told (the suite shows the difference): to require a key on a route, which
routes to cover (it covers every POST and PATCH that carries a key), who the caller is.
"""

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from idempotency_header_middleware import IdempotencyHeaderMiddleware
from idempotency_header_middleware.backends import RedisBackend
from redis.asyncio import Redis

import peer_env
from peer_env import ledger

backend = RedisBackend(
    redis=Redis.from_url(peer_env.redis_url()),
    keys_key=f"{peer_env.prefix()}:idempotency-key-keys",
    response_key=f"{peer_env.prefix()}:idempotency-key-responses",
)

app = FastAPI()
# Defaults otherwise: header Idempotency-Key, replay header Idempotent-Replayed, any key format,
# 24 h expiry, POST and PATCH.
app.add_middleware(IdempotencyHeaderMiddleware, backend=backend)


@app.post("/v1/charges")
@app.post("/v1/waits")
async def create_charge(request: Request):
    f = ledger.fields(await request.body(), request.headers.get("content-type"))
    # The charge blocks (a slow one sleeps): on a thread, not the event loop.
    status, body, headers = await run_in_threadpool(ledger.charge, f)
    return JSONResponse(body, status_code=status, headers=dict(headers))


@app.get("/v1/charges")
async def charges():
    return {"count": ledger.count()}


@app.post("/v1/echo")
async def echo(request: Request):
    return {"echo": (await request.body()).decode()}
