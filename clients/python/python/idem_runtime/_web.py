"""What the ASGI and WSGI middleware share: the HTTP core's configuration, and the request
target as the client sent it.

The configuration is ``idem serve``'s: a TOML file (``config=``) and top-level settings given
in code (``routes=``, ``anonymous=``, ``scope_headers=``, ``limits=``, ``problems=``, ...), which
win over the file's. Both go to the Rust core as they are, so a setting means the same thing,
and a mistake is refused in the same words, in a file, in code and in ``idem serve``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from typing import Any, Mapping, Optional, Union
from urllib.parse import quote

from . import _native
from .errors import ConfigurationError

log = logging.getLogger("idem_runtime")

PathLike = Union[str, "os.PathLike[str]"]


def _plain(value: Any) -> Any:
    """Settings as the file writes them: a ``timedelta`` becomes a duration (``"1500ms"``)."""
    if isinstance(value, datetime.timedelta):
        return f"{round(value.total_seconds() * 1000)}ms"
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def front(config: Optional[PathLike], store: Optional[str], settings: Mapping[str, Any]) -> _native.HttpFront:
    """The HTTP core over the file at ``config`` (if any) with ``settings`` on top, keeping
    records in ``store`` (else the file's ``store``, else ``$IDEM_STORE``, else the default)."""
    text = None
    if config is not None:
        try:
            with open(os.fspath(config), encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ConfigurationError(f"the config file {os.fspath(config)!r} cannot be read: {e.strerror or e}") from e
    overrides = json.dumps(_plain(dict(settings))) if settings else None
    made = _native.HttpFront(text, overrides, store or os.environ.get("IDEM_STORE"))
    if made.store == "memory:":
        log.warning(MEMORY_WARNING)
    return made


#: Said once per middleware made on ``memory:`` (the ``idem_runtime`` logger; Node says the
#: same as a process warning, code ``IDEM_MEMORY_STORE``).
MEMORY_WARNING = (
    "idem-runtime: the memory: store keeps every record in this process until its retention ends "
    "(about 2 KB a key, not bounded by cache_bytes) and loses them all on a restart, when a retry "
    "would run again; it is for tests. A service wants sqlite:PATH or a shared store "
    "(docs/middleware.md)"
)


def asgi_target(scope: Mapping[str, Any]) -> str:
    """The path and query as the client sent them: ``raw_path`` (uvicorn, hypercorn, daphne),
    else the decoded path quoted back."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope.get("root_path", "") + scope.get("path", ""), safe="/%;=:@!$&'()*+,")
    query = scope.get("query_string") or b""
    return f"{path}?{query.decode('latin-1')}" if query else path


def wsgi_target(environ: Mapping[str, Any]) -> str:
    """The path and query as the client sent them: ``RAW_URI`` (gunicorn, werkzeug) or
    ``REQUEST_URI`` (uwsgi, werkzeug), else ``SCRIPT_NAME`` + ``PATH_INFO`` quoted back."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return raw
    path = quote((environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1"), safe="/%;=:@!$&'()*+,")
    query = environ.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path


def wsgi_headers(environ: Mapping[str, Any]) -> list:
    """The request's headers from a WSGI environ (``HTTP_*``, ``CONTENT_TYPE``,
    ``CONTENT_LENGTH``), names in lower case, values as bytes."""
    out = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            out.append((name[5:].replace("_", "-").lower(), value.encode("latin-1")))
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            out.append((name.replace("_", "-").lower(), value.encode("latin-1")))
    return out


def with_length(headers: list, body: bytes) -> list:
    """A reply's headers with its ``Content-Length``."""
    return [(n, v) for n, v in headers if n != "content-length"] + [("content-length", str(len(body)).encode())]
