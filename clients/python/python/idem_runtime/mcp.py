"""Tool calls through the official MCP SDK's ``ClientSession`` with the runtime's key in
``_meta`` (design §7, §8): for ``idem mcp`` with ``key = "runtime"`` in its policy file,
where only the runtime's key counts and the model is not asked for one.

    from idem_runtime.mcp import call_tool, replayed

    result = await call_tool(session, "send_email", {"to": "a@example.com", "subject": "Hi"},
                             scope=run_id)

The key is derived once, from the scope (given, else ``with idem_runtime.scope(...)``), the
tool's name and its arguments, and sent as ``_meta.idempotency_key`` on every attempt. An
attempt is repeated, with the same key and the HTTP transport's backoff (``RetryPolicy``),
when its answer was lost on a live session (the request timed out) or the proxy answered
that the key is still in flight, its store was unavailable or its upstream was down. Other
answers, errors included, are returned or raised as they came. A proxy's replay is marked in
the result's ``_meta.idem`` (:func:`replayed`).

A session that closed mid-call cannot carry a retry: :class:`CallLostError` says so and
carries the key, to call again on a new session (``call_tool(new, ..., key=e.key)``, or the
same scope and arguments); the proxy then replays the result instead of running it twice.
:func:`call_tool_with_reconnect` does that itself, given a way to open a session: over
streamable HTTP the SDK ends the whole session when an answer is cut off.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional, Sequence, Union

import anyio
from ._requires import requires

with requires("mcp", "mcp", "mcp 2.3.0"):
    from mcp import ClientSession

try:
    from mcp.shared.exceptions import MCPError
except ImportError:  # the SDK before 2.0
    from mcp.shared.exceptions import McpError as MCPError  # type: ignore[no-redef]

# JSON-RPC codes the SDK's session raises itself: its wait for the answer timed out, or the
# connection closed under it (mcp_types since 2.0; the values are the protocol's).
REQUEST_TIMEOUT = -32001
CONNECTION_CLOSED = -32000

from ._keys import derive_key
from ._retry import DEFAULT_RETRY, Attempt, Budget, RetryPolicy, observe
from ._scope import Scope, current_scope
from .errors import IdemError, ScopeMissingError

META_KEY = "idempotency_key"

# The proxy's answers that say "not now, same key later" (crates/idem-mcp, call.rs).
RETRIED_PROBLEMS = frozenset({"in-flight", "store-unavailable", "upstream-unavailable"})


class CallLostError(IdemError):
    """The session closed before the tool's answer came: the call may have run. Call again
    on a new session with the same key (``key=error.key``, or the same scope, tool and
    arguments): the proxy answers with the first call's result instead of running it
    twice."""


def idem_meta(result: Any) -> dict:
    """``_meta.idem`` of a result: ``{"replayed": True, "key": ...}`` on a replay,
    ``{"problem": ...}`` on the proxy's refusals, else empty."""
    meta = getattr(result, "meta", None) or {}
    found = meta.get("idem") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def replayed(result: Any) -> bool:
    """Whether the proxy answered with a stored result instead of running the tool."""
    return idem_meta(result).get("replayed") is True


def tool_key(
    name: str,
    arguments: Optional[dict],
    *,
    scope: Union[None, str, Scope] = None,
    ordinal: int = 0,
    secret: Union[None, str, bytes] = None,
    key_fields: Optional[Sequence[str]] = None,
) -> str:
    """The key of calling ``name`` with ``arguments`` in ``scope`` (else the current scope)."""
    chosen = scope or current_scope()
    if chosen is None:
        raise ScopeMissingError(
            f"a key for {name} needs a scope (the run, thread, task or business id of the call): "
            f"pass scope=, or call inside `with idem_runtime.scope(...)`; nothing was sent"
        )
    return derive_key(chosen, name, arguments or {}, ordinal=ordinal, secret=secret, key_fields=key_fields)


async def call_tool(
    session: ClientSession,
    name: str,
    arguments: Optional[dict] = None,
    *,
    scope: Union[None, str, Scope] = None,
    ordinal: int = 0,
    secret: Union[None, str, bytes] = None,
    key_fields: Optional[Sequence[str]] = None,
    key: Optional[str] = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    on_attempt: Optional[Callable[[Attempt], Any]] = None,
    sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
    meta: Optional[dict] = None,
    **kwargs: Any,
) -> Any:
    """``session.call_tool(name, arguments, ...)`` with the intent's key in ``_meta`` on
    every attempt, retried as the module says. ``key`` gives the key instead of deriving it;
    ``meta`` adds other ``_meta`` members; other keywords (``read_timeout_seconds``,
    ``progress_callback``) go to ``call_tool``. Returns the ``CallToolResult``."""
    if key is None:
        key = tool_key(name, arguments, scope=scope, ordinal=ordinal, secret=secret, key_fields=key_fields)
    sent_meta = {**(meta or {}), META_KEY: key}
    budget = Budget(retry)
    number = 0
    while True:
        number += 1
        try:
            result = await session.call_tool(name, arguments, meta=sent_meta, **kwargs)
        except MCPError as e:
            if e.error.code == CONNECTION_CLOSED:
                observe(on_attempt, Attempt(name, key, number, error=e))
                raise _lost(name, key, e) from e
            if e.error.code != REQUEST_TIMEOUT:
                observe(on_attempt, Attempt(name, key, number, error=e))
                raise
            # Timed out on a live session: the answer is lost, the call may be running.
            delay = budget.next_delay(number, None)
            observe(on_attempt, Attempt(name, key, number, error=e, retry_in=delay))
            if delay is None:
                raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as e:
            observe(on_attempt, Attempt(name, key, number, error=e))
            raise _lost(name, key, e) from e
        else:
            problem = idem_meta(result).get("problem")
            delay = budget.next_delay(number, None) if problem in RETRIED_PROBLEMS else None
            observe(on_attempt, Attempt(name, key, number, status=200, problem=problem, retry_in=delay))
            if delay is None:
                return result
        await sleep(delay)


def _lost(name: str, key: str, cause: BaseException) -> CallLostError:
    return CallLostError(
        f"the MCP session closed before the answer of {name} came ({cause}); it may have run. "
        f"Call again on a new session with key={key!r} (or the same scope and arguments): the "
        f"proxy replays its result instead of running it twice",
        key=key,
    )


def _lost_connection(error: BaseException) -> bool:
    """Whether ``error`` says the connection went away, not that the call was answered: the
    SDK's transports end a session with these (over streamable HTTP, an httpx error escapes
    the transport's task group as an exception group)."""
    if isinstance(error, (CallLostError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)):
        return True
    if isinstance(error, MCPError):
        return error.error.code == CONNECTION_CLOSED
    if type(error).__module__.split(".", 1)[0] in ("httpx", "httpx2", "httpcore") and "Error" in type(error).__name__:
        return not type(error).__name__.startswith(("HTTPStatus", "InvalidURL", "UnsupportedProtocol"))
    members = getattr(error, "exceptions", None)  # an exception group
    return isinstance(members, tuple) and bool(members) and all(_lost_connection(e) for e in members)


async def call_tool_with_reconnect(
    connect: Callable[[], Any], name: str, arguments: Optional[dict] = None, **options: Any
) -> Any:
    """:func:`call_tool` on a session ``connect()`` opens (an async context manager that
    yields an initialized ``ClientSession``), opening a new one when the connection is lost
    mid-call: over streamable HTTP the SDK ends the whole session when an answer is cut off,
    and over stdio a restarted proxy is a new process. ``options`` are :func:`call_tool`'s.
    The key is derived once and sent on every session; lost sessions count against the
    ``retry`` policy like attempts (and are reported to ``on_attempt`` with the error). When
    they run out, :class:`CallLostError` is raised."""
    if options.get("key") is None:
        intent = {k: options.pop(k) for k in ("scope", "ordinal", "secret", "key_fields") if k in options}
        options["key"] = tool_key(name, arguments, **intent)
    key = options["key"]
    retry = options.get("retry", DEFAULT_RETRY)
    on_attempt = options.get("on_attempt")
    sleep = options.get("sleep", anyio.sleep)
    budget = Budget(retry)
    number = 0
    while True:
        number += 1
        try:
            async with connect() as session:
                return await call_tool(session, name, arguments, **options)
        except Exception as e:  # noqa: BLE001 - only a lost connection is retried
            if not _lost_connection(e):
                raise
            delay = budget.next_delay(number, None)
            observe(on_attempt, Attempt(name, key, number, error=e, retry_in=delay))
            if delay is None:
                raise _lost(name, key, e) from e
        await sleep(delay)


class IdempotentSession:
    """A ``ClientSession`` whose ``call_tool`` is :func:`call_tool` with these defaults
    (scope, secret, retry policy); everything else is the session's. For code that takes
    a session and calls tools on it."""

    def __init__(self, session: ClientSession, *, scope: Union[None, str, Scope] = None, **defaults: Any) -> None:
        self.session = session
        self.defaults = {"scope": scope, **defaults}

    async def call_tool(self, name: str, arguments: Optional[dict] = None, **kwargs: Any) -> Any:
        return await call_tool(self.session, name, arguments, **{**self.defaults, **kwargs})

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.session, attr)


__all__ = [
    "call_tool",
    "call_tool_with_reconnect",
    "tool_key",
    "IdempotentSession",
    "CallLostError",
    "replayed",
    "idem_meta",
    "RETRIED_PROBLEMS",
    "RetryPolicy",
    "Attempt",
]
