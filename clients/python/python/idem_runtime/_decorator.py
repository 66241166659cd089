"""``@idempotent``: an in-process tool that runs at most once per intent.

The function that owns a side effect (an e-mail through smtplib, a row in a database, a call
to a payment API) becomes the service of design §7: the first call with a key runs it and
stores what it returned; every retry with that key (the framework's, the model asking again,
a re-delegated sub-agent, another process on the same store) gets the stored result instead.
The engine is idem's own (claim, heartbeat, complete or release under a fencing token), in
Rust; this module only binds arguments, encodes results and maps answers to exceptions.

An exception releases the key by default, so a retry runs the function again (design §4):
the function raised, so it presumably did not act. Name the exceptions that mean otherwise:
``keep_errors`` are stored and re-raised on every retry (a card declined is an answer), and
``unknown_errors`` mark the outcome unknown (a timeout talking to a payment API: it may have
charged), as does any ``BaseException`` that is not an ``Exception`` (cancellation,
``KeyboardInterrupt``): a retry then raises ``OutcomeUnknownError`` until an operator settles
the key, or, under ``on_abandoned="retry"``, runs again.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import datetime
import functools
import inspect
import json
import logging
import os
import threading

# Imported now, not when the first finish needs it: the module registers its exit hook as it
# is imported, which an interpreter already exiting refuses.
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence, Tuple, Type, Union

from . import _native, _otel
from ._codec import JSON, Codec
from ._keys import KEY_ARGUMENT, Binder, args_json, default_tool, derive_key, field_roots, parse_key_fields, receiver_identity, well_formed
from ._scope import Scope, current_scope
from .errors import (
    ConfigurationError,
    InFlightError,
    KeyMismatchError,
    OutcomeUnknownError,
    ReplayedError,
    ResultTooLargeError,
    ResultUnreadableError,
    ScopeMissingError,
)

log = logging.getLogger("idem_runtime")

DEFAULT_RETENTION = 24 * 3600.0
"""Seconds a result is replayed, from its completion (24 h, the draft standard's default)."""

Seconds = Union[int, float, datetime.timedelta]
ScopeArg = Union[None, str, Scope, Callable[[dict], Union[str, Scope]]]

_stores: dict = {}
_stores_lock = threading.Lock()


def _reset_after_fork() -> None:
    """In a forked child: a parent thread may have held the locks at the moment of the fork,
    and the settle pool's threads are the parent's (the child has none of them)."""
    global _stores_lock, _settlers, _settlers_lock
    _stores_lock = threading.Lock()
    _settlers, _settlers_lock = None, threading.Lock()


SETTLERS = 64
"""Threads kept for finishing coroutine functions' calls (``_settle_soon``)."""

_settlers: Optional[ThreadPoolExecutor] = None
_settlers_lock = threading.Lock()


def _report_failure(done: Future) -> None:
    """Logs what a finishing step raised, as the thread per finish it replaced printed it."""
    error = done.exception()
    if error is not None:
        log.error("idem: finishing a call failed", exc_info=error)


def _settle_soon(fn: Callable[[], Any]) -> None:
    """Runs ``fn`` (a ticket's finishing step) on a thread of the settle pool.

    Not the loop's default executor: duplicates waiting for a call in flight may hold all its
    threads (a handful: cpu + 4), and a finish queued behind them could not run until their
    ``wait`` ran out. A finish never waits for another call, so the pool's threads are never
    all held by waiters; more than ``SETTLERS`` finishing at once (a store that is down, each
    retrying for half its lease) queue behind each other. Reused, a call pays no thread start,
    which was a third of a coroutine's new key (docs/benchmarks.md). Its threads are joined at
    exit, as the thread per finish it replaced was: a finish in flight when the program ends
    still lands."""
    global _settlers
    pool = _settlers
    if pool is None:
        with _settlers_lock:
            if _settlers is None:
                _settlers = ThreadPoolExecutor(max_workers=SETTLERS, thread_name_prefix="idem-settle")
            pool = _settlers
    try:
        pool.submit(fn).add_done_callback(_report_failure)
    except RuntimeError:
        # The interpreter is exiting and the pool takes no more work: a thread of its own.
        threading.Thread(target=fn, name="idem-settle").start()


def open_store(url: Optional[str] = None) -> _native.Store:
    """The store at ``url`` (default: ``$IDEM_STORE``, else the CLI's ``sqlite:idem.db``),
    opened once per process."""
    url = url or os.environ.get("IDEM_STORE") or _native.DEFAULT_STORE
    store = _stores.get(url)
    if store is None:
        with _stores_lock:
            store = _stores.get(url)
            if store is None:
                store = _stores[url] = _native.Store(url)
    return store


def _seconds(what: str, value: Seconds) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be seconds or a timedelta, not {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one call was answered (``fn.call_with_outcome``): ``executed`` (this call ran the
    function) or ``replayed`` (a stored result), with the record's key and counters."""

    key: str
    replayed: bool
    attempts: int = 1
    replays: int = 0
    saved: str = "stored"
    """For an executed call: ``stored``, ``released``, ``unknown`` or ``lost: <why>``."""


class _Tool:
    """What one ``@idempotent`` holds; shared by its sync and async wrappers."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        tool: Optional[str],
        store: Union[None, str, _native.Store],
        scope: ScopeArg,
        key_fields: Union[None, str, Sequence[str]],
        ordinal: int,
        secret: Union[None, str, bytes],
        retention: Seconds,
        lease: Seconds,
        wait: Seconds,
        on_abandoned: str,
        keep_errors: Sequence[Type[BaseException]],
        unknown_errors: Sequence[Type[BaseException]],
        codec: Codec,
        max_result_bytes: int,
        instance_key: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        self.fn = fn
        self.tool = tool or default_tool(fn)
        well_formed("tool name", self.tool)
        self.store_arg = store
        self.scope = scope
        self.fields = parse_key_fields(key_fields)
        self.binder = Binder(
            fn,
            field_roots(self.fields.specs) if self.fields else None,
            receiver=receiver_identity(fn, self.tool, instance_key),
        )
        if isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal <= 1 << 53:
            raise ConfigurationError(f"ordinal must be an integer from 0 to 2^53, not {ordinal!r}")
        if secret is not None and not isinstance(secret, (str, bytes)):
            raise ConfigurationError(f"secret must be a str or bytes, not {type(secret).__name__}")
        if isinstance(max_result_bytes, bool) or not isinstance(max_result_bytes, int) or max_result_bytes < 0:
            raise ConfigurationError(
                f"max_result_bytes must be an integer >= 0, not {max_result_bytes!r}"
            )
        self.ordinal = ordinal
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self.policy = _native.Policy(
            _seconds("lease", lease),
            _seconds("retention", retention),
            _seconds("wait", wait),
            on_abandoned,
            max_result_bytes,
        )
        self.keep_errors = tuple(keep_errors)
        self.unknown_errors = tuple(unknown_errors)
        for group in (self.keep_errors, self.unknown_errors):
            for cls in group:
                if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                    raise ConfigurationError(f"{cls!r} is not an exception class")
        if not isinstance(codec, Codec) or not isinstance(codec.media_type, str):
            raise ConfigurationError(
                f"{codec!r} is not a codec (media_type: str, encode, decode)"
            )
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            # Calling one runs none of its body, so there is no result to keep; wrapped, its
            # generator failed to encode and the key read as an unknown outcome.
            raise ConfigurationError(
                f"{self.tool} is a generator function; @idempotent needs a function that "
                f"returns its result (collect it into a list first)"
            )
        self.codec = codec
        self._store: Optional[_native.Store] = store if isinstance(store, _native.Store) else None

    # -- before the call -------------------------------------------------------------------

    def store(self) -> _native.Store:
        if self._store is None:
            self._store = open_store(self.store_arg)  # type: ignore[arg-type]
        return self._store

    def scope_id(self, bound: dict) -> str:
        s = self.scope
        if s.__class__ is str:
            return s  # type: ignore[return-value]
        if callable(s) and not isinstance(s, Scope):
            s = s(bound)
        if s is None:
            s = current_scope()
        if s is None:
            raise ScopeMissingError(
                f"{self.tool}: no scope for its idempotency key. Wrap the work in "
                f"`with idem_runtime.scope(run_id):` (the run, thread, task or business id, "
                f"never a tool-call id), pass scope=..., or pass idempotency_key=..."
            )
        return s.id if isinstance(s, Scope) else str(s)

    def prepare(self, args: tuple, kwargs: dict) -> Tuple[list, tuple, dict]:
        """What the store's ``start`` takes (the bound arguments, from which it derives the
        key natively in the same call), and what to call the function with."""
        explicit = kwargs.get(KEY_ARGUMENT) if kwargs else None
        if kwargs and KEY_ARGUMENT in kwargs and not self.binder.takes_key:
            # None too: "no explicit key" (a framework passing its optional argument on).
            kwargs = {k: v for k, v in kwargs.items() if k != KEY_ARGUMENT}
        bound = self.binder.bind(args, kwargs)
        if explicit is not None:
            if not isinstance(explicit, str):
                raise ConfigurationError(f"{KEY_ARGUMENT} must be a string, not {explicit!r}")
            sid = ""
        else:
            sid = self.scope_id(bound)
        start = [explicit, sid, self.tool, bound, self.ordinal, self.secret, self.fields, self.policy]
        return start, args, kwargs

    def key_for(self, args: tuple, kwargs: dict) -> str:
        """The key a call with these arguments is given, without calling it: bound as the
        call binds them (defaults filled in, the receiver keyed), in the scope the call would
        use. What a supervisor hands a worker, or checks a log against: ``derive_key`` over
        a dict it wrote itself misses the defaults the call fills in, and is another key."""
        start, _args, _kwargs = self.prepare(args, kwargs)
        explicit, sid, tool, bound = start[0], start[1], start[2], start[3]
        if explicit is not None:
            return explicit
        return derive_key(sid, tool, bound, ordinal=self.ordinal, secret=self.secret, key_fields=self.fields.specs if self.fields else None)

    # -- answers that did not run the function ---------------------------------------------

    def answer(self, prior: Any, key: str) -> Any:
        kind = prior.kind
        if kind == "replayed":
            if log.isEnabledFor(logging.INFO):
                log.info("idem: %s replayed %s (replay %d)", self.tool, key, prior.replays + 1)
            if prior.body is None and prior.omitted_len is None:
                raise ResultUnreadableError(
                    f"{self.tool} ran for idempotency key {key}, but its record holds neither "
                    f"a result nor the digest of one (written by something else, or damaged). "
                    f"It was not run again; `idem inspect {key}` shows the record.",
                    key=key,
                )
            if prior.body is None:
                raise ResultTooLargeError(
                    f"{self.tool} ran for idempotency key {key}, but its result was "
                    f"{prior.omitted_len} bytes, over max_result_bytes, so only its digest was "
                    f"kept. It was not run again.",
                    key=key,
                )
            if prior.status == _native.RAISED:
                raise self.rebuild_error(prior.body, key)
            try:
                return self.codec.decode(prior.body)
            except Exception as e:
                raise ResultUnreadableError(
                    f"the stored result of {self.tool} (idempotency key {key}) could not be "
                    f"decoded by {type(self.codec).__name__}: {e}. It was not run again.",
                    key=key,
                ) from e
        if kind == "in_flight":
            raise InFlightError(
                f"{self.tool} with idempotency key {key} is held by another call, which did "
                f"not finish within the wait. Retry later with the same arguments: the retry "
                f"gets that call's result, or, if that call's process died, an unknown outcome "
                f"once its lease ends (the lease is renewed only while the call runs).",
                key=key,
            )
        if kind == "mismatch":
            raise KeyMismatchError(
                f"idempotency key {key} was first used for a {self.tool} call with other "
                f"arguments. A different intent needs a different key (another scope, or an "
                f"ordinal).",
                key=key,
            )
        store = self.store().url
        raise OutcomeUnknownError(
            f"{self.tool} with idempotency key {key} may have run (attempt {prior.attempts}), "
            f"but its outcome is unknown: the call stopped or lost the store midway. It was not "
            f"run again. Check whether it happened, then settle the key: "
            f"`idem resolve {key} --store {store} --release` if it did not (the next call "
            f"runs), or `--status 200 --body FILE` with its JSON result if it did.",
            key=key,
        )

    def rebuild_error(self, body: bytes, key: str) -> BaseException:
        try:
            data = json.loads(body)
            type_name, message, args = data["type"], data["message"], data.get("args", [])
        except Exception as e:
            return ResultUnreadableError(
                f"the stored error of {self.tool} (idempotency key {key}) is unreadable: {e}",
                key=key,
            )
        # Only classes this tool declared are rebuilt: a stored name never imports code.
        for cls in self.keep_errors:
            if _qualname(cls) == type_name:
                try:
                    return cls(*args)
                except Exception:
                    try:
                        return cls(message)
                    except Exception:
                        break
        return ReplayedError(
            f"{type_name}: {message} (replayed for idempotency key {key})",
            key=key,
            type_name=type_name,
        )

    # -- after the call --------------------------------------------------------------------

    def settle_error(self, ticket: Any, e: BaseException) -> str:
        """Keeps, marks unknown or releases the key of a call that raised ``e``; answers the
        call's outcome (``executed``, ``unknown``, ``not_sent``)."""
        if self.keep_errors and isinstance(e, self.keep_errors):
            message = _message(e)
            body = json.dumps(
                {"type": _qualname(type(e)), "message": message, "args": _json_args(e, message)},
                ensure_ascii=False,
            ).encode()
            ticket.finish_result(_native.RAISED, body, "application/json")
            return "executed"
        if (self.unknown_errors and isinstance(e, self.unknown_errors)) or not isinstance(e, Exception):
            ticket.finish_unknown()
            return "unknown"
        ticket.finish_not_run()
        return "not_sent"

    def settle_result(self, ticket: Any, key: str, result: Any) -> str:
        try:
            body = self.codec.encode(result)
            if not isinstance(body, (bytes, bytearray)):
                # Caught here, not by the native call, which would leave the ticket unfinished
                # (its key in flight until the process let go of it).
                raise ConfigurationError(
                    f"{type(self.codec).__name__}.encode returned {type(body).__name__}, "
                    f"not bytes; the result of {self.tool} (idempotency key {key}) was not "
                    f"kept, and the key reads as an unknown outcome"
                )
        except BaseException:
            # It ran: releasing would let a retry run it again. Unknown is the truth.
            ticket.finish_unknown()
            raise
        saved = ticket.finish_result(_native.RETURNED, body, self.codec.media_type)
        if saved != "stored":
            log.warning("idem: %s ran for %s but its result was not kept (%s)", self.tool, key, saved)
        return saved


def _start(store: _native.Store, start: list) -> Tuple[str, Any]:
    """Claims the call's key: the bound arguments go to the native side as they are when
    they are plain types (no JSON text made and parsed), as JSON text otherwise."""
    claimed = store.start(*start)
    if claimed is None:
        start[3] = args_json(start[3])
        claimed = store.start(*start)
    return claimed


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _message(e: BaseException) -> str:
    """``str(e)``, or a stand-in when its ``__str__`` raises: a kept error is stored either way,
    instead of leaving its key unfinished."""
    try:
        return str(e)
    except Exception:
        return f"<{type(e).__name__} whose str() raised>"


def _json_args(e: BaseException, message: str) -> list:
    try:
        json.dumps(e.args, allow_nan=False)
        return list(e.args)
    except (TypeError, ValueError, RecursionError):
        return [message]


def idempotent(
    fn: Optional[Callable[..., Any]] = None,
    *,
    tool: Optional[str] = None,
    store: Union[None, str, _native.Store] = None,
    scope: ScopeArg = None,
    key_fields: Union[None, str, Sequence[str]] = None,
    ordinal: int = 0,
    secret: Union[None, str, bytes] = None,
    retention: Seconds = DEFAULT_RETENTION,
    lease: Seconds = 30,
    wait: Seconds = 30,
    on_abandoned: str = "reject",
    keep_errors: Sequence[Type[BaseException]] = (),
    unknown_errors: Sequence[Type[BaseException]] = (),
    codec: Codec = JSON,
    max_result_bytes: int = 1 << 20,
    instance_key: Optional[Callable[[Any], Any]] = None,
) -> Any:
    """Makes ``fn`` (sync or async) run at most once per intent; see the module docstring.

    - ``tool``: the name in its keys (default: the function's name; a method's is
      ``Class.method``). A lambda or a ``functools.partial`` has no name of its own: give one.
    - ``instance_key``: for a method, what of the instance makes the intent
      (``instance_key=lambda self: self.account``): two instances with other accounts are
      two intents. Required on a method that takes ``self`` (``lambda self: None`` says every
      instance is one); a ``classmethod``'s class is keyed by its qualified name.
    - ``store``: a store URL (``sqlite:PATH``, ``memory:``, ``postgres://...``,
      ``redis://...``); default ``$IDEM_STORE`` or ``sqlite:idem.db``, the file ``idem
      inspect`` reads by default.
    - ``scope``: a string, a :class:`Scope`, or a function of the bound arguments returning
      one; default the current ``with scope(...)``. A caller may instead pass
      ``idempotency_key=...``, used as is.
    - ``key_fields``: derive the key (and check the arguments) from these only.
    - ``retention``/``lease``/``wait``: seconds or timedeltas. A duplicate of a call in
      flight waits up to ``wait`` for its result (0: raise ``InFlightError`` at once).
    - ``on_abandoned``: ``reject`` (an unknown outcome raises ``OutcomeUnknownError``) or
      ``retry`` (run again).
    """

    def decorate(f: Callable[..., Any]) -> Any:
        t = _Tool(
            f,
            tool=tool,
            store=store,
            scope=scope,
            key_fields=key_fields,
            ordinal=ordinal,
            secret=secret,
            retention=retention,
            lease=lease,
            wait=wait,
            on_abandoned=on_abandoned,
            keep_errors=keep_errors,
            unknown_errors=unknown_errors,
            codec=codec,
            max_result_bytes=max_result_bytes,
            instance_key=instance_key,
        )
        if inspect.iscoroutinefunction(f):
            return _async_wrapper(t)
        return _sync_wrapper(t)

    return decorate(fn) if fn is not None else decorate


_Prior = _native.Prior


def _sync_wrapper(t: _Tool) -> Callable[..., Any]:
    def run(args: tuple, kwargs: dict, with_outcome: bool) -> Any:
        with _otel.tool_span(t.tool) as span:
            start, args, kwargs = t.prepare(args, kwargs)
            key, started = _start(t.store(), start)
            _otel.claimed(span, start[1], key)
            if started.__class__ is _Prior:
                _otel.outcome(span, started.kind)
                value = t.answer(started, key)
                if with_outcome:
                    return value, Outcome(key, True, started.attempts, started.replays)
                return value
            try:
                result = t.fn(*args, **kwargs)
            except BaseException as e:
                _otel.outcome(span, t.settle_error(started, e))
                raise
            # A result that cannot be encoded leaves the key unknown (settle_result raises).
            _otel.outcome(span, "unknown")
            saved = t.settle_result(started, key, result)
            _otel.outcome(span, "executed")
            return (result, Outcome(key, False, saved=saved)) if with_outcome else result

    def call_with_outcome(*args: Any, **kwargs: Any) -> Tuple[Any, Outcome]:
        return run(args, kwargs, True)  # type: ignore[no-any-return]

    @functools.wraps(t.fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run(args, kwargs, False)

    wrapper.call_with_outcome = call_with_outcome  # type: ignore[attr-defined]
    wrapper.key_for = lambda *args, **kwargs: t.key_for(args, kwargs)  # type: ignore[attr-defined]
    wrapper.idem_tool = t  # type: ignore[attr-defined]
    return wrapper


async def _claim(store: _native.Store, start: list) -> Tuple[str, Any]:
    """``_start`` in a worker thread. If the caller is cancelled meanwhile (a framework's
    timeout, a duplicate waiting for a call in flight), the claim may still succeed in the
    thread; its ticket is then released, since the function never ran. Dropped instead, the
    key would read as in flight until the lease ended and as an unknown outcome after."""
    loop = asyncio.get_running_loop()
    claim = loop.run_in_executor(None, _start, store, start)
    try:
        return await asyncio.shield(claim)
    except asyncio.CancelledError:
        claim.add_done_callback(_release_unused)
        raise


def _release_unused(claim: "asyncio.Future[Tuple[str, Any]]") -> None:
    if claim.cancelled() or claim.exception() is not None:
        return
    started = claim.result()[1]
    if started.__class__ is not _Prior:
        _settle_soon(started.finish_not_run)


async def _settle(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs a ticket's finishing step on the settle pool (``_settle_soon``), and answers what
    it returned or raised. Once per call that ran; a replay needs none."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    context = contextvars.copy_context()  # as asyncio.to_thread: a codec may read it

    def deliver(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def run() -> None:
        try:
            value, ok = context.run(fn, *args), True
        except BaseException as e:  # delivered to the awaiting coroutine
            value, ok = e, False
        try:
            loop.call_soon_threadsafe(deliver, ok, value)
        except RuntimeError:
            pass  # the loop closed meanwhile; the ticket was finished all the same

    _settle_soon(run)
    return await done


def _async_wrapper(t: _Tool) -> Callable[..., Any]:
    # The engine's blocking halves run in a worker thread (the GIL released inside), so the
    # event loop goes on while a store answers or a duplicate is waited for.
    async def call_with_outcome(*args: Any, **kwargs: Any) -> Tuple[Any, Outcome]:
        with _otel.tool_span(t.tool) as span:
            start, args, kwargs = t.prepare(args, kwargs)
            store = t.store()
            key, started = await _claim(store, start)
            _otel.claimed(span, start[1], key)
            if started.__class__ is _Prior:
                _otel.outcome(span, started.kind)
                value = t.answer(started, key)
                return value, Outcome(key, True, started.attempts, started.replays)
            try:
                result = await t.fn(*args, **kwargs)
            except BaseException as e:
                # Settled even when cancelled: shielded from the cancellation it reports.
                settled = asyncio.shield(_settle(t.settle_error, started, e))
                _otel.outcome(span, await settled)
                raise
            # A result that cannot be encoded leaves the key unknown (settle_result raises).
            _otel.outcome(span, "unknown")
            saved = await _settle(t.settle_result, started, key, result)
            _otel.outcome(span, "executed")
            return result, Outcome(key, False, saved=saved)

    @functools.wraps(t.fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return (await call_with_outcome(*args, **kwargs))[0]

    wrapper.call_with_outcome = call_with_outcome  # type: ignore[attr-defined]
    wrapper.key_for = lambda *args, **kwargs: t.key_for(args, kwargs)  # type: ignore[attr-defined]
    wrapper.idem_tool = t  # type: ignore[attr-defined]
    return wrapper


def inspect_key(key: str, store: Optional[str] = None) -> Optional[Any]:
    """The record of ``key`` in ``store`` (what ``idem inspect`` shows), or ``None``."""
    return open_store(store).record(key)


__all__ = ["idempotent", "Outcome", "open_store", "inspect_key", "DEFAULT_RETENTION"]
