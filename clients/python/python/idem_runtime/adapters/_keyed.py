"""What the adapters (LangChain, OpenAI Agents, Pydantic AI) share: a framework's tool call
run through ``@idempotent``.

The adapters see a tool call as a name, the model's arguments and a way to run it (the
framework's own invoker). Each tool name gets one ``@idempotent`` function taking
``**arguments``, so the key and the fingerprint are taken over exactly the model's arguments
(as ``idem key`` and ``idem mcp`` take them), and the engine (claim, completion, replay, the
errors) is the decorator's, unchanged. The function runs whatever invoker the current call
set in a context variable: it is built once per tool, while each call brings its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from typing import Any, Awaitable, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

from .._decorator import Outcome, idempotent
from .._keys import KEY_ARGUMENT, derive_key
from .._scope import Scope, current_scope, scope as scope_context
from .. import errors
from ..errors import ConfigurationError, IdemError, ReplayedError

Fields = Union[None, str, Sequence[str]]
Mark = Optional[Callable[[Dict[str, Any]], None]]

_invoker: contextvars.ContextVar["_Invoker"] = contextvars.ContextVar("idem_adapter_invoker")


async def _run_invoker(**_arguments: Any) -> Any:
    return await _invoker.get()()


def _run_invoker_sync(**_arguments: Any) -> Any:
    return _invoker.get()()


class _Invoker:
    """One call's invoker (sync, or returning an awaitable), noting whether the engine ran it."""

    def __init__(self, invoke: Callable[[], Any]) -> None:
        self.invoke = invoke
        self.ran = False

    def __call__(self) -> Any:
        self.ran = True
        return self.invoke()


def model_arguments(args: Mapping[str, Any]) -> Dict[str, Any]:
    """The arguments a key is derived from: the model's, less any ``idempotency_key`` it
    wrote (a model invents a new one on each retry; the runtime's key must not follow it)."""
    return {k: v for k, v in args.items() if k != KEY_ARGUMENT}


def scope_text(value: Union[None, str, Scope]) -> Optional[str]:
    """A scope value as the string keys are derived from; ``None`` or ``""`` is no scope."""
    if value is None:
        return None
    text = value.id if isinstance(value, Scope) else str(value)
    return text or None


def first_scope(*candidates: Callable[[], Union[None, str, Scope]]) -> Optional[str]:
    """The first candidate that gives a scope, each asked only if those before gave none."""
    for candidate in candidates:
        found = scope_text(candidate())
        if found is not None:
            return found
    return None


def explicit_scope(explicit: Any, ctx: Any) -> Union[None, str, Scope]:
    """``scope=`` as given: a value, or a function of the framework's context, applied."""
    return explicit(ctx) if callable(explicit) and not isinstance(explicit, Scope) else explicit


def explicit_or_current(explicit: Any, ctx: Any) -> Optional[str]:
    """The scope a caller chose: ``scope=``, else the current ``with idem_runtime.scope(...)``."""
    return first_scope(lambda: explicit_scope(explicit, ctx), current_scope)


class KeyedTools:
    """One ``@idempotent`` per tool name, over the call's arguments; ``options`` are the
    decorator's (``store``, ``retention``, ``keep_errors``, ...), ``key_fields`` per tool."""

    def __init__(self, options: Mapping[str, Any], key_fields: Optional[Mapping[str, Fields]] = None) -> None:
        taken = {"scope", "tool", "key_fields"} & set(options)
        if taken:
            raise ConfigurationError(
                f"{sorted(taken)} are set by the adapter (scope= and key_fields= on the adapter "
                f"itself; the tool name is the tool's)"
            )
        self.options = dict(options)
        self.key_fields = dict(key_fields or {})
        self._fns: Dict[Tuple[str, bool], Any] = {}
        try:
            self._fn("tool", True)  # bad options fail here, not at the first tool call
        except TypeError as e:
            raise ConfigurationError(
                f"{e}: an adapter's options are @idempotent's (store, retention, lease, wait, "
                f"on_abandoned, keep_errors, unknown_errors, codec, secret, ordinal, "
                f"max_result_bytes)"
            ) from None

    def _fn(self, name: str, is_async: bool) -> Any:
        fn = self._fns.get((name, is_async))
        if fn is None:
            run = _run_invoker if is_async else _run_invoker_sync
            fn = idempotent(run, tool=name, key_fields=self.key_fields.get(name), **self.options)
            self._fns[(name, is_async)] = fn
        return fn

    def key(self, scope_id: str, name: str, args: Mapping[str, Any]) -> str:
        """The key ``call`` uses, for a tool that wants it as an argument (to pass on)."""
        return derive_key(
            scope_id,
            name,
            model_arguments(args),
            ordinal=self.options.get("ordinal", 0),
            secret=self.options.get("secret"),
            key_fields=self.key_fields.get(name),
        )

    async def call(
        self, name: str, args: Mapping[str, Any], scope_id: str,
        invoke: Callable[[], Awaitable[Any]], mark: Mark = None,
    ) -> Tuple[Any, Outcome]:
        """Runs ``invoke`` at most once for (scope, tool, arguments): the first call's result
        (or kept error) answers every later one. The tool body runs inside
        ``with idem_runtime.scope(scope_id)``, so ``@idempotent`` functions it calls share it.
        ``mark`` gets :func:`idem_metadata` for a result, and for a kept error replayed."""
        with self._calling(name, True, args, scope_id, invoke, mark) as run:
            done = await run()
        return _marking(done, mark)

    def call_sync(
        self, name: str, args: Mapping[str, Any], scope_id: str, invoke: Callable[[], Any], mark: Mark = None
    ) -> Tuple[Any, Outcome]:
        """:meth:`call` for a framework that calls its tools synchronously."""
        with self._calling(name, False, args, scope_id, invoke, mark) as run:
            done = run()
        return _marking(done, mark)

    @contextlib.contextmanager
    def _calling(
        self, name: str, is_async: bool, args: Mapping[str, Any], scope_id: str,
        invoke: Callable[[], Any], mark: Mark,
    ) -> Iterator[Callable[[], Any]]:
        """What both calls share: ``invoke`` set for the tool's ``@idempotent`` function to
        run, inside the scope; yields the call of that function."""
        fn = self._fn(name, is_async)
        invoker = _Invoker(invoke)
        token = _invoker.set(invoker)
        try:
            with scope_context(scope_id):
                yield lambda: fn.call_with_outcome(**model_arguments(args))
        except Exception as e:
            # Not run, and not refused by idem itself: a kept error from the first call.
            if mark is not None and not invoker.ran and (isinstance(e, ReplayedError) or not isinstance(e, IdemError)):
                mark(idem_metadata(Outcome(self.key(scope_id, name, args), True)))
            raise
        finally:
            _invoker.reset(token)


def _marking(done: Tuple[Any, Outcome], mark: Mark) -> Tuple[Any, Outcome]:
    if mark is not None:
        mark(idem_metadata(done[1]))
    return done


def idem_metadata(outcome: Outcome) -> Dict[str, Any]:
    """What an adapter attaches to a tool's answer where the framework keeps data the model
    does not see: the key (for ``idem inspect``) and whether this answer is a replay."""
    return {"idem": {"key": outcome.key, "replayed": outcome.replayed}}


def as_json(value: Any) -> Any:
    """A framework's tool result as a store keeps it (JSON): pydantic models as their JSON
    form, anything else JSON cannot hold as its text. A replay gives this form back; the call
    that ran gives the tool's own value. (A result the codec could not encode would leave the
    key's outcome unknown, and every retry refused, for a tool that did run.)"""

    def default(o: Any) -> Any:
        dump = getattr(o, "model_dump", None)
        return dump(mode="json") if callable(dump) else str(o)

    return json.loads(json.dumps(value, default=default))


_log = logging.getLogger("idem_runtime")


def refusal(name: str, e: IdemError) -> Optional[Tuple[str, bool]]:
    """For a framework that hands a tool's failure to the model as text (CrewAI, Strands): what
    the model reads when idem ran nothing, and whether calling again later may help; ``None``
    for an error that is not such a refusal (a kept error replayed is the tool's own). "Not
    configured" and a store that cannot be used are also logged at ERROR: no model can fix
    them, and a framework that turns them into text would otherwise hide them."""
    if isinstance(e, (errors.ScopeMissingError, ConfigurationError, errors.KeyDerivationError)):
        _log.error("%s was not run: idem is not configured for it: %s", name, e)
        return f"{name} was not run, and calling it again will not help: {e}", False
    if isinstance(e, errors.StoreUnavailableError):
        # A wrong URL and a store that is down look alike; either way an operator must know.
        _log.error("%s was not run: idem's store cannot be used: %s", name, e)
        return f"{name} was not run: its idempotency store cannot be used right now, so nothing ran; try again later. ({e})", True
    if isinstance(e, errors.InFlightError):
        return f"{name} was not run: another call with the same arguments is still running; do not call it again yet, wait for it. ({e})", True
    if isinstance(e, errors.OutcomeUnknownError):
        return (
            f"{name} was not run: an earlier call with the same arguments may have acted and its outcome is "
            f"unknown; do not call it again: an operator must check and resolve it. ({e})",
            False,
        )
    if isinstance(e, errors.KeyMismatchError):
        return f"{name} was not run: its idempotency key was used before with other arguments; nothing ran. ({e})", False
    return None
