"""idem as WSGI middleware: a service's own keyed endpoints executed at most once per
``Idempotency-Key`` (Flask, Django under gunicorn, any WSGI app), with the same HTTP core as
``idem serve``, the Rust tower layer and the ASGI middleware (design §3).

    from flask import Flask
    from idem_runtime.wsgi import IdempotencyMiddleware

    app = Flask(__name__)
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, config="idem.toml")

A WSGI worker is a thread: the store calls block it, as the app's own calls do, and a
duplicate of a request in flight that the route says to ``wait`` for holds its worker for
that long. The keyed request's body is buffered and handed to the app as ``wsgi.input``; the
app's response is buffered, stored, then returned. An exception out of the app marks the
outcome unknown, never a release; a response the framework made of an exception (Flask's and
Django's 500 pages) is a response, and is kept.
"""

from __future__ import annotations

import io
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
        body = _read(environ.get("wsgi.input"), int(length) if length.isdigit() else None, keyed.max_body)
        if body is None:
            return _reply(start_response, self.front.body_failed(keyed, "too_large"))
        if isinstance(body, Exception):
            return _reply(start_response, self.front.body_failed(keyed, "unreadable", detail=str(body)))
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
        try:
            result = self.app(environ, capture)
            try:
                size = sum(len(p) for p in parts)
                for chunk in result:
                    size += len(chunk)
                    if size > limit:
                        too_large = True
                        break
                    parts.append(chunk)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except BaseException:
            # Whatever the handler did before raising is unknown: never released.
            execution.unknown()
            raise
        if not started or too_large:
            return _reply(start_response, execution.failed())
        status, headers = started
        return _reply(start_response, execution.finish(status, headers, b"".join(parts)))


def _read(stream: Any, length: Optional[int], bound: int):
    """The body: ``None`` when it is over ``bound``, the exception when it cannot be read."""
    if stream is None:
        return b""
    try:
        if length is not None:
            return stream.read(length) if length <= bound else None
        data = stream.read(bound + 1)
        return None if len(data) > bound else data
    except Exception as e:  # a client that went away mid-body
        return e


def _reply(start_response: Callable, reply: tuple) -> list:
    status, headers, body = reply
    headers = _web.with_length(headers, body)
    start_response(_status_line(status), [(n, v.decode("latin-1")) for n, v in headers])
    return [body]
