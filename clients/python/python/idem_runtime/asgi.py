"""idem as ASGI middleware: a service's own keyed endpoints executed at most once per
``Idempotency-Key``, in the service itself (Starlette, FastAPI, Litestar, Django's ASGI app,
any ASGI 3 app). The same HTTP core as ``idem serve`` and the Rust tower layer decides every
answer (design §3): a repeated key gets the stored response with ``Idempotent-Replayed:
true``; another body with the key, 422 ``key-reused``; a duplicate while the first runs, 409
with ``Retry-After`` (or a wait, with the route's ``wait``); a store that is down, 503, and the
handler does not run.

    from fastapi import FastAPI
    from idem_runtime.asgi import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, config="idem.toml")   # or routes=[...] in code

Store calls run on the event loop's default executor, never on the loop itself (a ``memory:``
store, which waits on nothing, answers on the loop). The keyed
request's body is buffered (up to the route's ``max_body_bytes``) and handed to the app; its
response is buffered too (up to ``max_response_bytes``) and sent once it is stored, so a
streaming response on a keyed route arrives whole. An exception out of the app marks the
outcome unknown (409 ``outcome-unknown`` to retries until ``idem resolve``), never a release;
a response the framework made of an exception (a 500 page) is a response, and is kept. A
response is complete at its last body message: it is stored and sent then, so what the app
runs after it (Starlette's ``BackgroundTask``, Litestar's background) neither delays it nor,
if it raises, changes it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, MutableMapping, Optional

from . import _native, _web

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["IdempotencyMiddleware"]


class _BodyTooLarge(Exception):
    pass


class IdempotencyMiddleware:
    """Wraps an ASGI app. ``config``: the path of an ``idem serve`` TOML file; ``store``: a
    store URL (else the file's, else ``$IDEM_STORE``, else ``sqlite:idem.db``); any other
    keyword is a top-level setting of that file (``routes``, ``anonymous``, ``scope_headers``,
    ``scope_cookies``, ``defaults``, ``limits``, ``timeouts``, ``problems``), winning over
    the file's."""

    def __init__(self, app: ASGIApp, *, config: Optional[_web.PathLike] = None, store: Optional[str] = None, **settings: Any) -> None:
        self.app = app
        self.front = _web.front(config, store, settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(n.decode("latin-1"), v) for n, v in scope.get("headers", [])]
        target = _web.asgi_target(scope)
        # Also as the target the app routes, verbatim: uvicorn's h11 parser hands an absolute
        # form or a #fragment on as the path, which the app routes as no path of its own.
        admitted = self.front.admit(scope["method"], target, headers, target)
        if admitted is None:
            await self.app(scope, receive, send)
            return
        if isinstance(admitted, tuple):
            await _reply(send, admitted)
            return
        keyed = admitted
        body = await self._body(keyed, receive, send)
        if body is None:
            return
        # A memory: store waits on nothing: its claim runs here, where a hop to a thread
        # and back would cost more than the claim. Another store's claim goes to a thread,
        # unless the completed-record cache already holds the replay.
        if keyed.inline:
            begun = self.front.begin(keyed, body)
        else:
            begun = self.front.replay(keyed, body) or await _off_loop(self.front.begin, keyed, body, own_thread=keyed.waits)
        if isinstance(begun, tuple):
            await _reply(send, begun)
            return
        await self._execute(begun, scope, body, receive, send)

    async def _body(self, keyed: Any, receive: Receive, send: Send) -> Optional[bytes]:
        """The buffered body, or ``None`` once a refusal was sent (or the client left):
        nothing is claimed then."""
        bound = self.front.body_read
        chunks, size = [], 0
        try:
            async with _deadline(bound):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > keyed.max_body:
                        raise _BodyTooLarge
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except _BodyTooLarge:
            await _reply(send, self.front.body_failed(keyed, "too_large"))
        except asyncio.TimeoutError:
            await _reply(send, self.front.body_failed(keyed, "timeout", seconds=bound or 0.0))
        return None

    async def _execute(self, execution: Any, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        """Runs the app on the buffered body, buffers its response, stores it, sends it."""
        loop = asyncio.get_running_loop()
        delivered = False

        async def replayed_body() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        status: Optional[int] = None
        headers: list = []
        parts: list = []
        size = 0
        sent = False
        too_large = False
        limit = execution.max_response

        async def settle(complete: bool) -> None:
            """Stores the response (or, when it is not ``complete`` or over the bound, marks
            the outcome unknown) and sends what the core says: once."""
            nonlocal sent
            sent = True
            if status is None or not complete or too_large:
                reply = await loop.run_in_executor(None, execution.failed)
            elif execution.inline:
                reply = execution.finish(status, headers, b"".join(parts))
            else:
                reply = await asyncio.shield(loop.run_in_executor(None, execution.finish, status, headers, b"".join(parts)))
            await _reply(send, reply)

        async def captured(message: Message) -> None:
            nonlocal status, headers, size, too_large
            if sent:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(n.decode("latin-1"), bytes(v)) for n, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    too_large = True
                else:
                    parts.append(chunk)
                # The last body message completes the response: it is stored and sent now,
                # not when the app returns. Starlette runs a response's background tasks
                # (and Litestar its own) after that message, inside the app's call: the
                # client must not wait for them, and what they raise is not the request's.
                if not message.get("more_body", False):
                    await settle(True)

        try:
            await self.app(scope, replayed_body, captured)
        except BaseException:
            if sent:
                # The response was complete, stored and sent: what the app raised after it
                # (a background task) is the app's own error, for the server to log.
                raise
            # Whatever the handler did before raising is unknown: never released.
            sent = True
            await asyncio.shield(loop.run_in_executor(None, execution.unknown))
            raise
        if not sent:
            await settle(False)


async def _off_loop(fn: Callable, *args: Any, own_thread: bool = False) -> Any:
    """``fn(*args)`` off the event loop: on the loop's default executor, or, for a claim that
    may wait for a duplicate in flight, on a thread of its own. Waits must not hold the
    executor's few threads: the first request's store write, which would end them, would
    queue behind them until their wait ran out (16 duplicates on a 6-thread pool did)."""
    loop = asyncio.get_running_loop()
    if not own_thread:
        return await loop.run_in_executor(None, fn, *args)
    done: asyncio.Future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            (done.set_result if ok else done.set_exception)(value)

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as e:  # noqa: BLE001
            loop.call_soon_threadsafe(settle, False, e)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=run, name="idem-wait", daemon=True).start()
    return await done


class _deadline:
    """``asyncio.timeout`` where there is one (3.11), a task-cancelling timer otherwise."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.handle = None
        self.fired = False

    async def __aenter__(self) -> "_deadline":
        if self.seconds is not None:
            task = asyncio.current_task()
            loop = asyncio.get_running_loop()

            def fire() -> None:
                self.fired = True
                if task is not None:
                    task.cancel()

            self.handle = loop.call_later(self.seconds, fire)
        return self

    async def __aexit__(self, kind, error, tb) -> bool:
        if self.handle is not None:
            self.handle.cancel()
        if self.fired and kind is asyncio.CancelledError:
            raise asyncio.TimeoutError
        return False


async def _reply(send: Send, reply: tuple) -> None:
    status, headers, body = reply
    headers = _web.with_length(headers, body)
    await send({"type": "http.response.start", "status": status, "headers": [(n.encode("latin-1"), v) for n, v in headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
