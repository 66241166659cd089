"""A retrying httpx transport that keys side effects: the Rust ``ToolClient``'s semantics
(crates/idem-client; design §7 "Retry with the same key on every path") for httpx.

    import httpx
    from idem_runtime.http import IdempotentTransport, intent

    client = httpx.Client(transport=IdempotentTransport(scope=run_id))
    r = client.post(f"{api}/v1/charges", json={"customer": "cus_1", "amount_cents": 4900},
                    extensions=intent("charge_card"))

The key of a call is derived once, before the first attempt, from the scope (the transport's,
the intent's, or ``with idem_runtime.scope(...)``), the tool name and the JSON body, or given
(``intent(tool, key=...)``, an ``Idempotency-Key`` header, or the body's ``idempotency_key``).
Every attempt sends it as the ``Idempotency-Key`` header, an RFC 8941 sf-string
(``"run_...-charge_card-..."``, quoted, as the IETF draft writes it); a service that compares the
raw header value (many Stripe-style APIs) sees ``"k"`` and ``k`` as two keys, so
``key_header="bare"`` sends the key unquoted. The body is sent as given: ``key_in_body=True``
also adds the key to a JSON object body as ``idempotency_key``, for a service that reads it
there (one whose model forbids extra fields would refuse it). Then:

- 409, 429, 503, other 5xx and transport failures are retried with exponential backoff and
  full jitter (``RetryPolicy``: 5 attempts, 100 ms doubling to 10 s, none started after 60 s),
  never sooner than a ``Retry-After`` asks; every other 4xx (400, 422) is returned at once;
- reads (GET, HEAD, OPTIONS, TRACE) and PUT/DELETE (idempotent by HTTP's definition) retry
  the same way without a key;
- a side effect without a key (a POST or PATCH without an intent) is retried only when it
  surely was not sent (connection refused, no pooled connection) or on 429; once it may have
  been sent, a failure raises :class:`HTTPOutcomeUnknownError` instead of a blind second try.

The transport does not follow redirects (each hop is the client's), and httpx does not by
default; keep ``follow_redirects=False``: a failure on a redirect target must not look like
"not sent" for a request that executed. Answers are read whole inside the transport, so a
body cut off midway counts as no answer (a keyed retry replays it), not as a short success.
(A transport that hands back an answer already read, such as httpx's ``MockTransport``, is
taken as it is.)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence, Union

from ._requires import requires

with requires("http", "httpx", "httpx 0.28.1"):
    import httpx

from ._keys import KEY_ARGUMENT, derive_key
from ._retry import DEFAULT_RETRY, Attempt, Budget, RetryPolicy, observe, parse_retry_after
from ._scope import Scope, current_scope
from .errors import ConfigurationError, KeyDerivationError, OutcomeUnknownError, ScopeMissingError

EXTENSION = "idem"
HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"

#: How the key is written in the header: quoted (RFC 8941 sf-string), or as it is.
KEY_HEADER_FORMS = ("sf-string", "bare")

READS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
IDEMPOTENT = frozenset({"PUT", "DELETE"})

# A failure before the request left (nothing to repeat) versus one after it may have.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Mistakes in the request itself: another attempt would fail the same way.
_NEVER_RETRIED = (httpx.UnsupportedProtocol, httpx.LocalProtocolError)


@dataclass(frozen=True)
class Intent:
    """A decision to call one tool with the request's JSON body: what its key is made of.
    Build it with :func:`intent` and pass it as ``extensions=``."""

    tool: str
    scope: Union[None, str, Scope] = None
    ordinal: int = 0
    key_fields: Optional[Sequence[str]] = None
    key: Optional[str] = None


def intent(
    tool: str,
    *,
    scope: Union[None, str, Scope] = None,
    ordinal: int = 0,
    key_fields: Optional[Sequence[str]] = None,
    key: Optional[str] = None,
) -> dict:
    """The ``extensions`` of a keyed call of ``tool``: ``client.post(url, json=args,
    extensions=intent("charge_card"))``. The key is derived from the scope (this one, else
    the transport's, else the current ``with scope(...)``), ``tool`` and the JSON body (or
    the ``key_fields`` of it); ``ordinal`` separates deliberate identical calls; ``key``
    gives the key instead."""
    if not isinstance(tool, str) or not tool:
        raise ConfigurationError(f"intent() needs the tool's name, not {tool!r}")
    return {EXTENSION: Intent(tool, scope, ordinal, list(key_fields) if key_fields else None, key)}


@dataclass(frozen=True)
class CallInfo:
    """What a call through the transport came to, as ``response.extensions["idem"]``
    (read it with :func:`call_info`)."""

    key: Optional[str]
    attempts: int
    replayed: bool


def call_info(response: httpx.Response) -> Optional[CallInfo]:
    """The key sent, the attempts made and whether the answer was a replay
    (``Idempotent-Replayed: true``), for a response that came through the transport."""
    info = response.extensions.get(EXTENSION)
    return info if isinstance(info, CallInfo) else None


class HTTPOutcomeUnknownError(OutcomeUnknownError, httpx.TransportError):
    """A side-effecting request without a key may have been executed (it was sent and no
    answer came), so it was not retried. Check whether it happened before sending it again;
    to make such a call safe to retry, send it with a key (``extensions=intent(tool)``).
    Also an ``httpx.TransportError``, so existing handlers still catch it."""


def _quote(key: str) -> str:
    # An RFC 8941 sf-string, as the Rust client sends it.
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unquote(value: str) -> str:
    value = value.strip(" \t")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        out, escaped = [], False
        for c in value[1:-1]:
            if escaped or c != "\\":
                out.append(c)
                escaped = False
            else:
                escaped = True
        return "".join(out)
    return value


def _checked(key: Optional[str]) -> Optional[str]:
    """A key as idem accepts it: 1 to 255 visible ASCII characters (crates/idem-core)."""
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= 255 and all("!" <= c <= "~" for c in key)):
        raise ConfigurationError(
            f"{key!r} is not an idempotency key: use 1 to 255 visible ASCII characters (no spaces), "
            f"or let intent(tool) derive one; nothing was sent"
        )
    return key


def request_intent(method: str, url: str, args: Any) -> dict:
    """An HTTP call's intent (docs/key-derivation.md, "HTTP requests"): the method, the URL
    without its fragment, and the JSON body, ``{"method", "url", "args"}``, as Node's
    ``idemFetch`` keys it. Two customers' URLs with one body are two intents."""
    return {"method": method.upper(), "url": url.split("#", 1)[0], "args": args}


def request_key_fields(fields: Optional[Sequence[str]]) -> Optional[list]:
    """Key fields named over the body (``order.id``, ``/order/id``) as they stand in
    :func:`request_intent`'s object, with the method and the URL."""
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = [fields]
    return ["method", "url", *(f"/args{f}" if f.startswith("/") else f"args.{f}" for f in fields)]


def _is_json(request: httpx.Request) -> bool:
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


@dataclass
class _Config:
    scope: Union[None, str, Scope]
    secret: Union[None, str, bytes]
    retry: RetryPolicy
    on_attempt: Optional[Callable[[Attempt], Any]]
    key_in_body: bool
    key_header: str


@dataclass
class _Step:
    """What the loop does next: return ``response``, raise ``error``, or wait ``delay``."""

    response: Optional[httpx.Response] = None
    error: Optional[BaseException] = None
    delay: Optional[float] = None

    def final(self) -> httpx.Response:
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


@dataclass
class _Call:
    """One intent's attempts: the key, the request every attempt sends, and the verdict on
    each attempt. Shared by the sync and async transports, which only do the I/O."""

    config: _Config
    request: httpx.Request
    tool: Optional[str] = None
    key: Optional[str] = None
    repeatable: bool = True
    number: int = 0
    budget: Budget = field(init=False)

    def __post_init__(self) -> None:
        # The request's body was read by the caller: re-sendable, and parsed once here.
        self.budget = Budget(self.config.retry)
        body = self.request.content
        parsed = self._parse(body)
        self.key = _checked(self._key(parsed))
        method = self.request.method.upper()
        self.repeatable = self.key is not None or method in READS or method in IDEMPOTENT
        if self.key is not None:
            self.request = self._keyed(parsed, body)

    def _parse(self, body: bytes) -> Any:
        if not _is_json(self.request) or not body:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def _key(self, parsed: Any) -> Optional[str]:
        given_header = self.request.headers.get(HEADER)
        header = _unquote(given_header) if given_header is not None else None
        in_body = parsed.get(KEY_ARGUMENT) if isinstance(parsed, dict) else None
        wanted = self.request.extensions.get(EXTENSION)
        if isinstance(wanted, Intent):
            self.tool = wanted.tool
            key = wanted.key if wanted.key is not None else self._derive(wanted, parsed)
            if header is not None and header != key:
                raise ConfigurationError(
                    f"the request's {HEADER} header ({header}) differs from its intent's key ({key}); "
                    f"send one of them"
                )
            return key
        if header is not None and isinstance(in_body, str) and in_body != header:
            raise ConfigurationError(
                f"the {HEADER} header ({header}) and the body's {KEY_ARGUMENT} ({in_body}) differ; send one key"
            )
        if header is not None:
            return header
        return in_body if isinstance(in_body, str) else None

    def _derive(self, wanted: Intent, parsed: Any) -> str:
        chosen = wanted.scope or self.config.scope or current_scope()
        if chosen is None:
            raise ScopeMissingError(
                f"a key for {wanted.tool} needs a scope (the run, thread, task or business id of the "
                f"call): pass scope= to the transport or to intent(), or call inside "
                f"`with idem_runtime.scope(...)`; nothing was sent"
            )
        if parsed is None and self.request.content:
            raise KeyDerivationError(
                f"the key of {wanted.tool} is derived from a JSON body, and this request has none "
                f"(content-type {self.request.headers.get('content-type')!r}); send json=..., or "
                f"give the key with intent(..., key=...); nothing was sent"
            )
        return derive_key(
            chosen,
            wanted.tool,
            request_intent(self.request.method, str(self.request.url), parsed),
            ordinal=wanted.ordinal,
            secret=self.config.secret,
            key_fields=request_key_fields(wanted.key_fields),
        )

    def _keyed(self, parsed: Any, body: bytes) -> httpx.Request:
        assert self.key is not None
        headers = self.request.headers.copy()
        headers[HEADER] = _quote(self.key) if self.config.key_header == "sf-string" else self.key
        if self.config.key_in_body and isinstance(parsed, dict) and parsed.get(KEY_ARGUMENT) != self.key:
            body = json.dumps({**parsed, KEY_ARGUMENT: self.key}, ensure_ascii=False, separators=(",", ":")).encode()
            for name in ("content-length", "transfer-encoding"):
                headers.pop(name, None)
        return httpx.Request(
            self.request.method, self.request.url, headers=headers, content=body, extensions=self.request.extensions
        )

    def _attempt(self, **what: Any) -> Attempt:
        return Attempt(tool=self.tool, key=self.key, number=self.number, **what)

    def answered(self, response: httpx.Response, body: bytes) -> _Step:
        status = response.status_code
        replayed = response.headers.get(REPLAYED_HEADER, "").strip().lower() == "true"
        out = httpx.Response(
            status,
            headers=response.headers,
            stream=httpx.ByteStream(body),
            request=self.request,
            extensions={**response.extensions, EXTENSION: CallInfo(self.key, self.number, replayed)},
        )
        if status < 400 or not _retryable_status(status, self.repeatable):
            observe(self.config.on_attempt, self._attempt(status=status))
            return _Step(response=out)
        delay = self.budget.next_delay(self.number, parse_retry_after(response.headers.get("retry-after")))
        observe(self.config.on_attempt, self._attempt(status=status, retry_in=delay))
        return _Step(response=out) if delay is None else _Step(delay=delay)

    def failed(self, error: Exception) -> _Step:
        if not isinstance(error, httpx.TransportError) or isinstance(error, _NEVER_RETRIED):
            observe(self.config.on_attempt, self._attempt(error=error))
            return _Step(error=error)
        if not isinstance(error, _NOT_SENT) and not self.repeatable:
            observe(self.config.on_attempt, self._attempt(error=error))
            unknown = HTTPOutcomeUnknownError(
                f"outcome unknown: {self.request.method} {self.request.url} may have been executed "
                f"({type(error).__name__}: {error}) and carries no key, so it was not retried. Check "
                f"whether it happened before sending it again; send it with a key "
                f"(extensions=idem_runtime.http.intent(tool)) to make it safe to retry"
            )
            unknown.request = self.request
            unknown.__cause__ = error
            return _Step(error=unknown)
        delay = self.budget.next_delay(self.number, None)
        observe(self.config.on_attempt, self._attempt(error=error, retry_in=delay))
        return _Step(error=error) if delay is None else _Step(delay=delay)


def _retryable_status(status: int, repeatable: bool) -> bool:
    """409 (in flight), 429 and 503 say "not now"; other 5xx may be transient. Without a key
    only 429 is safe: the server says it did not process the request."""
    if status == 429:
        return True
    return repeatable and (status == 409 or status >= 500)


class _Base:
    """The options both transports take; ``inner`` and ``sleep`` default to the subclass's
    ``_default_inner()`` and ``_default_sleep``."""

    def __init__(
        self,
        inner: Any = None,
        *,
        scope: Union[None, str, Scope] = None,
        secret: Union[None, str, bytes] = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        on_attempt: Optional[Callable[[Attempt], Any]] = None,
        key_in_body: bool = False,
        key_header: str = "sf-string",
        sleep: Optional[Callable[[float], Any]] = None,
    ) -> None:
        if not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry must be an idem_runtime.http.RetryPolicy, not {retry!r}")
        if key_header not in KEY_HEADER_FORMS:
            raise ConfigurationError(
                f"key_header is 'sf-string' (the key quoted, as the IETF draft writes it) or 'bare' "
                f"(unquoted, for a service that compares raw header values), not {key_header!r}"
            )
        self._config = _Config(scope, secret, retry, on_attempt, key_in_body, key_header)
        self._inner = inner if inner is not None else self._default_inner()
        self._sleep = sleep if sleep is not None else type(self)._default_sleep

    @staticmethod
    def _default_inner() -> Any:
        raise NotImplementedError

    @staticmethod
    def _default_sleep(delay: float) -> Any:
        raise NotImplementedError


class IdempotentTransport(_Base, httpx.BaseTransport):
    """Wraps a sync httpx transport (``inner``, default ``httpx.HTTPTransport()``; pass your
    own for TLS or proxy settings); see the module's documentation for what is keyed and
    retried. ``scope`` and ``secret`` are the keys' defaults; ``retry`` the
    :class:`RetryPolicy`; ``on_attempt`` sees every :class:`Attempt`; ``key_in_body=True``
    also adds the key to a JSON object body; ``key_header="bare"`` writes the header's key
    unquoted; ``sleep`` replaces ``time.sleep`` (tests record
    instead of waiting)."""

    _default_inner = staticmethod(httpx.HTTPTransport)
    _default_sleep = staticmethod(time.sleep)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        call = _Call(self._config, request)
        while True:
            call.number += 1
            try:
                response = self._inner.handle_request(call.request)
                try:
                    body = response.content if response.is_stream_consumed else b"".join(response.iter_raw())
                finally:
                    response.close()
            except Exception as e:  # noqa: BLE001 - classified, and re-raised unless retried
                step = call.failed(e)
            else:
                step = call.answered(response, body)
            if step.delay is None:
                return step.final()
            self._sleep(step.delay)

    def close(self) -> None:
        self._inner.close()


async def _anyio_sleep(delay: float) -> None:
    import anyio

    await anyio.sleep(delay)


class AsyncIdempotentTransport(_Base, httpx.AsyncBaseTransport):
    """Wraps an async httpx transport (default ``httpx.AsyncHTTPTransport()``); the same
    options and policy as :class:`IdempotentTransport`, but ``sleep`` is an async function
    of seconds (default ``anyio.sleep``)."""

    _default_inner = staticmethod(httpx.AsyncHTTPTransport)
    _default_sleep = staticmethod(_anyio_sleep)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        call = _Call(self._config, request)
        while True:
            call.number += 1
            try:
                response = await self._inner.handle_async_request(call.request)
                try:
                    if response.is_stream_consumed:
                        body = response.content
                    else:
                        body = b"".join([chunk async for chunk in response.aiter_raw()])
                finally:
                    await response.aclose()
            except Exception as e:  # noqa: BLE001 - classified, and re-raised unless retried
                step = call.failed(e)
            else:
                step = call.answered(response, body)
            if step.delay is None:
                return step.final()
            await self._sleep(step.delay)

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = [
    "IdempotentTransport",
    "AsyncIdempotentTransport",
    "Intent",
    "intent",
    "CallInfo",
    "call_info",
    "HTTPOutcomeUnknownError",
    "RetryPolicy",
    "Attempt",
]
