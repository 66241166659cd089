"""idem as WSGI middleware: a service's own keyed endpoints executed at most once per
``Idempotency-Key`` (Flask, Django under gunicorn, any WSGI app), with the same HTTP core as
``idem serve``, the Rust tower layer and the ASGI middleware (design §3).

    from flask import Flask
    from idem_runtime.wsgi import IdempotencyMiddleware

    app = Flask(__name__)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, config="idem.toml")

A WSGI worker is a thread: the store calls block it, as the app's own calls do, and a
duplicate of a request in flight that the route says to ``wait`` for holds its worker for
that long. The keyed request's body is buffered and handed to the app as ``wsgi.input``, under
the same rules as every other front end: a body shorter than its ``Content-Length`` (the client
half-closed) is 400 ``body-unreadable`` and a body not read within ``[timeouts] body_read`` is
408 ``body-timeout`` (a deadline where the server lends the socket: gunicorn, werkzeug), with
nothing run and the key left free. The app's response is buffered, stored, then returned. An exception out of the app marks the
outcome unknown, never a release; a response the framework made of an exception (Flask's and
Django's 500 pages) is a response, and is kept.
"""

from __future__ import annotations

import heapq
import io
import os
import socket
import threading
import time
from http import HTTPStatus
from typing import Any, Callable, Iterable, Optional

from . import _web

__all__ = ["IdempotencyMiddleware"]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Status"


class IdempotencyMiddleware:
    """Wraps a WSGI app; the same keywords as :class:`idem_runtime.asgi.IdempotencyMiddleware`."""

    def __init__(self, app: Callable, *, config: Optional[_web.PathLike] = None, store: Optional[str] = None, **settings: Any) -> None:
        self.app = app
        self.front = _web.front(config, store, settings)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        admitted = self.front.admit(environ["REQUEST_METHOD"], _web.wsgi_target(environ), _web.wsgi_headers(environ))
        if admitted is None:
            return self.app(environ, start_response)
        if isinstance(admitted, tuple):
            return _reply(start_response, admitted)
        keyed = admitted
        length = environ.get("CONTENT_LENGTH") or ""
        declared = int(length) if length.isdigit() else None
        if declared is not None and declared > keyed.max_body:
            return _reply(start_response, self.front.body_failed(keyed, "too_large"))
        bound = self.front.body_read
        with _Deadline(_socket_of(environ), bound) as deadline:
            body = _read(environ.get("wsgi.input"), declared, keyed.max_body)
        if deadline.fired:
            return _reply(start_response, self.front.body_failed(keyed, "timeout", seconds=bound or 0.0))
        if body is None:
            return _reply(start_response, self.front.body_failed(keyed, "too_large"))
        if isinstance(body, Exception):
            return _reply(start_response, self.front.body_failed(keyed, "unreadable", detail=str(body) or type(body).__name__))
        if declared is not None and len(body) < declared:
            # The client stopped sending (a half-close) before the length it declared: this is
            # not the request it meant, so nothing runs and the key stays free for its retry.
            detail = f"the body ended after {len(body)} of the {declared} bytes its Content-Length declared"
            return _reply(start_response, self.front.body_failed(keyed, "unreadable", detail=detail))
        begun = self.front.begin(keyed, body)
        if isinstance(begun, tuple):
            return _reply(start_response, begun)
        return self._execute(begun, environ, body, start_response)

    def _execute(self, execution: Any, environ: dict, body: bytes, start_response: Callable) -> Iterable[bytes]:
        environ = dict(environ, **{"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))})
        started: list = []

        def capture(status: str, headers: list, exc_info: Any = None) -> Callable[[bytes], None]:
            started[:] = [int(status.split(" ", 1)[0]), [(n.lower(), v.encode("latin-1")) for n, v in headers]]
            return parts.append

        parts: list = []
        limit = execution.max_response
        too_large = False
        close: Optional[Callable[[], Any]] = None
        try:
            result = self.app(environ, capture)
            close = getattr(result, "close", None)
            size = sum(len(p) for p in parts)
            for chunk in result:
                size += len(chunk)
                if size > limit:
                    too_large = True
                    break
                parts.append(chunk)
        except BaseException:
            # Whatever the handler did before raising is unknown: never released.
            execution.unknown()
            if close is not None:
                close()
            raise
        if not started or too_large:
            reply = execution.failed()
        else:
            status, headers = started
            reply = execution.finish(status, headers, b"".join(parts))
        # The app's close() (Flask's call_on_close, Django's request_finished) is work after
        # the response: the server calls it once the response is sent, so it neither delays
        # the response nor, if it raises, changes what was stored and sent.
        return _Closing(_reply(start_response, reply), close)


def _read(stream: Any, length: Optional[int], bound: int):
    """The body: ``None`` when it is over ``bound``, the exception when it cannot be read. It
    may be shorter than ``length``: the caller checks."""
    if stream is None:
        return b""
    try:
        if length is not None:
            return stream.read(length)
        data = stream.read(bound + 1)
        return None if len(data) > bound else data
    except Exception as e:  # a client that went away mid-body
        return e


def _socket_of(environ: dict) -> Any:
    """The client's socket, where the server lends it (gunicorn, werkzeug's server): what
    makes ``[timeouts] body_read`` a deadline. Servers that lend none either buffer the whole
    body before the app runs (waitress; uWSGI with ``post-buffering``), or are read without
    one (docs/middleware.md)."""
    return environ.get("gunicorn.socket") or environ.get("werkzeug.socket")


class _Deadline:
    """``[timeouts] body_read`` over a blocking read: when it passes, the socket's reading
    side is shut, so the blocked read returns what arrived (short) and the request is
    answered 408 ``body-timeout``; nothing ran. A WSGI server's input stream reads until it has
    the bytes asked for, so a client trickling a byte at a time would hold a worker for as
    long as it liked with a per-read socket timeout; this bounds the whole read. One watcher
    thread serves every request of the process (``_Watch``)."""

    def __init__(self, sock: Any, seconds: Optional[float]) -> None:
        self.sock = sock if seconds else None
        self.seconds = seconds
        self.fired = False
        self.entry: Optional[list] = None

    def __enter__(self) -> "_Deadline":
        if self.sock is not None:
            self.entry = _WATCH.add(time.monotonic() + (self.seconds or 0.0), self._fire)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.entry is not None:
            _WATCH.cancel(self.entry)

    def _fire(self) -> None:
        self.fired = True
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass


class _Watch:
    """Deadlines, on one daemon thread started at the first: a heap of ``[when, seq, fire]``
    entries; a cancelled entry's ``fire`` is set to ``None``. Safe to use from any thread and
    in a child forked after it started (a fork keeps no thread: the first deadline in the
    child starts its own)."""

    def __init__(self) -> None:
        self._forked()
        # A child forked while the watcher held the lock would never get it back.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Condition()
        self.heap: list = []
        self.seq = 0
        self.pid: Optional[int] = None

    def add(self, when: float, fire: Callable[[], None]) -> list:
        with self.lock:
            if self.pid != os.getpid():
                self.pid = os.getpid()
                self.heap = []
                threading.Thread(target=self._run, name="idem-body-deadline", daemon=True).start()
            self.seq += 1
            entry = [when, self.seq, fire]
            heapq.heappush(self.heap, entry)
            self.lock.notify()
            return entry

    def cancel(self, entry: list) -> None:
        with self.lock:
            entry[2] = None

    def _run(self) -> None:
        with self.lock:
            while True:
                while self.heap and self.heap[0][2] is None:
                    heapq.heappop(self.heap)
                if not self.heap:
                    self.lock.wait()
                    continue
                wait = self.heap[0][0] - time.monotonic()
                if wait > 0:
                    self.lock.wait(wait)
                    continue
                fire = heapq.heappop(self.heap)[2]
                if fire is not None:
                    fire()


_WATCH = _Watch()


class _Closing(list):
    """The reply's body parts, with the app's ``close`` for the server to call after sending
    them (PEP 3333)."""

    def __init__(self, parts: list, close: Optional[Callable[[], Any]]) -> None:
        super().__init__(parts)
        self._close = close

    def close(self) -> None:
        if self._close is not None:
            self._close()


def _reply(start_response: Callable, reply: tuple) -> list:
    status, headers, body = reply
    headers = _web.with_length(headers, body)
    start_response(_status_line(status), [(n, v.decode("latin-1")) for n, v in headers])
    return [body]
