"""Keys at the point of intent: ``derive_key`` and the arguments a call is keyed on.

The derivation itself is native (``idem/v1``, crates/idem-keys, through idem-embed): the
same code as the Rust CLI's ``idem key`` and the Node package, reproducing
docs/key-vectors.json. Python only binds the arguments and, when they are not plain JSON
types (which the native side reads directly), turns them into JSON text.
"""

from __future__ import annotations

import decimal
import functools
import inspect
import json
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._codec import to_json
from ._scope import Scope
from .errors import ConfigurationError, KeyDerivationError

KEY_ARGUMENT = "idempotency_key"


# One encoder for every call (``json.dumps`` with options builds one per call). ASCII only, so
# a lone surrogate reaches the derivation as an escape it can name instead of failing to
# cross into Rust; no NaN or infinity, which JSON does not have.
def _key_default(value: Any) -> Any:
    """``to_json`` for a key: stricter where a result's encoding may be lenient. A set is
    ordered by its members' canonical JSON text (``repr`` order changes with
    ``PYTHONHASHSEED`` for a set of frozensets or strings: one intent, a key per process); a
    ``Decimal`` that is not finite is refused, as a float NaN is."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=lambda member: _SORTING.encode(member))
    if isinstance(value, decimal.Decimal) and not value.is_finite():
        raise ValueError(f"Decimal({str(value)!r}) is not a finite number")
    return to_json(value)


_ENCODER = json.JSONEncoder(
    default=_key_default, ensure_ascii=True, allow_nan=False, separators=(",", ":")
)
# Members' text to order a set by: canonical enough that equal members sort equal.
_SORTING = json.JSONEncoder(
    default=_key_default, ensure_ascii=True, allow_nan=False, separators=(",", ":"), sort_keys=True
)


def _string_keys(value: Any, path: str = "arguments") -> None:
    """Refuses a ``dict`` key that is not a string: JSON writes ``{1: "a"}`` as ``{"1": "a"}``,
    the same intent as ``{"1": "a"}``, and drops one of ``{1: "a", "1": "b"}``."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise KeyDerivationError(
                    f"no key can be derived: {path} has the key {k!r}, which is not a string (JSON "
                    f"would write it as {json.dumps(str(k))}, the same as that string); use string keys"
                )
            _string_keys(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _string_keys(v, f"{path}[{i}]")


def args_json(args: Any) -> str:
    """Arguments as JSON text for the native side (the path of values that are not plain
    ``dict``/``list``/``str``/number types, which the native side reads directly)."""
    try:
        _string_keys(args)
        return _ENCODER.encode(args)
    except KeyDerivationError:
        raise
    except (TypeError, ValueError, RecursionError) as e:
        raise KeyDerivationError(
            f"the arguments cannot be part of a key ({e}); make them JSON, or name the ones that "
            f"make the intent with key_fields=[...]"
        ) from None


def parse_key_fields(fields: Union[None, str, Iterable[str]]) -> Optional[_native.KeyFields]:
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = [fields]
    fields = list(fields)
    named = [f for f in fields if f.lstrip("/").split("/" if f.startswith("/") else ".", 1)[0] == KEY_ARGUMENT]
    if named:
        # The key argument is never part of the intent: keyed on it, every call would be
        # keyed on nothing and share one key.
        raise ConfigurationError(
            f"key_fields name {KEY_ARGUMENT} ({named[0]!r}), which is never part of an intent; "
            f"name the arguments that make it (customer, amount_cents, ...)"
        )
    return _native.KeyFields(fields)


def well_formed(what: str, text: str) -> None:
    """A scope or a tool name with a lone surrogate is not Unicode text (the derivation's
    rule for arguments, docs/key-derivation.md): refused as such, not as an encoding error."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise KeyDerivationError(f"no key can be derived: the {what} {text!r} has a lone surrogate, which is not Unicode text") from None


def _serialised_scope(text: str) -> bool:
    try:
        Scope.from_dict(json.loads(text))
        return True
    except Exception:  # noqa: BLE001 - not JSON, or not a scope: an id that starts with "{"
        return False


def derive_key(
    scope: Union[str, Scope],
    tool: str,
    args: Any,
    *,
    ordinal: int = 0,
    secret: Union[None, str, bytes] = None,
    key_fields: Union[None, str, Sequence[str]] = None,
) -> str:
    """The idempotency key of one intent: ``<scope>-<tool>-<32 base32 characters>``.

    ``ordinal`` separates two deliberate identical calls in one scope; ``secret`` makes the
    digest an HMAC, for arguments an outsider could guess; ``key_fields`` derives the key from
    the named arguments only (names, dotted paths such as ``order.id``, or JSON Pointers).
    """
    if isinstance(scope, dict) or (isinstance(scope, str) and scope.startswith("{") and _serialised_scope(scope)):
        # A serialised scope (Scope.dumps(), Node's JSON.stringify(scope)) is read as one,
        # never taken for an id: the same forms Node's deriveKey reads.
        scope = Scope.from_dict(json.loads(scope) if isinstance(scope, str) else scope)
    if isinstance(scope, Scope):
        scope = scope.id
    if not isinstance(scope, str):
        raise TypeError(f"a scope is a Scope, a non-empty string or a serialised scope, not {scope!r}")
    well_formed("scope", scope)
    well_formed("tool name", tool)
    if isinstance(secret, str):
        secret = secret.encode()
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
        raise KeyDerivationError(f"ordinal must be an integer from 0 to 2^53, not {ordinal!r}")
    fields = parse_key_fields(key_fields)
    if fields is not None and isinstance(args, dict):
        # As the decorator does: only the arguments the fields start at are serialised, so
        # the others need not be JSON (or keyable) at all.
        roots = set(field_roots(fields.specs))
        args = {k: v for k, v in args.items() if k in roots}
    return _native.derive_key(scope, tool, args_json(args), ordinal, secret, fields)


def in_class(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` was defined in a class body (``Stripe.refund``, a method, a
    ``staticmethod`` or a ``classmethod``), as its ``__qualname__`` says."""
    parts = getattr(fn, "__qualname__", "").split(".")
    return len(parts) >= 2 and parts[-2] != "<locals>"


def method_receiver(fn: Callable[..., Any]) -> Optional[str]:
    """``"self"`` or ``"cls"`` when ``fn`` is a method (defined in a class body, as its
    ``__qualname__`` says: ``Gateway.refund``, not ``outer.<locals>.refund``) whose first
    parameter is named so; else ``None``. A plain function whose first parameter happens to be
    called ``self`` is not a method: that argument is part of its intent."""
    if not in_class(fn):
        return None
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params[0] if params and params[0] in ("self", "cls") else None


def default_tool(fn: Callable[..., Any]) -> str:
    """The tool's name when none is given: the function's ``__name__``, a method's
    ``Class.method`` (two classes' ``pay`` are two tools). A lambda, a ``functools.partial``
    or a callable object has no name that says which code runs: refused."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>" or isinstance(fn, functools.partial):
        raise ConfigurationError(
            f"{fn!r} has no name that tells its calls apart from other code's (a lambda, a "
            f"partial or a callable object): give it one with tool='charge_card'"
        )
    if in_class(fn):
        # Two classes' same-named methods (static ones too) are two tools.
        return ".".join(getattr(fn, "__qualname__").split(".")[-2:])
    return name


def receiver_identity(fn: Callable[..., Any], tool: str, instance_key: Optional[Callable[[Any], Any]]) -> Optional[Tuple[str, Callable[[Any], Any]]]:
    """For a method: the name its receiver is keyed under and what of it is keyed. A
    ``classmethod``'s class by its qualified name; an instance by ``instance_key(self)``,
    which a method that takes ``self`` must be given: two instances configured apart
    (``Gateway("acct_A")``, ``Gateway("acct_B")``) are two intents, and idem cannot know what
    sets them apart."""
    kind = method_receiver(fn)
    if kind is None:
        if instance_key is not None:
            raise ConfigurationError(f"{tool}: instance_key is for a method taking self; this is not one")
        return None
    if kind == "cls":
        return ("cls", lambda cls: f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', repr(cls))}")
    if instance_key is None:
        raise ConfigurationError(
            f"{tool} is a method: say what of the instance makes its intent, "
            f"@idempotent(instance_key=lambda self: self.account) (two instances configured "
            f"apart must not share keys), or instance_key=lambda self: None if every instance "
            f"is one"
        )
    if not callable(instance_key):
        raise ConfigurationError(f"{tool}: instance_key is a function of the instance, not {instance_key!r}")
    return ("self", instance_key)


class Binder:
    """Turns one call's positional and keyword arguments into the JSON object its key and
    fingerprint are taken over: every parameter by name, defaults applied, ``self``/``cls``
    and ``idempotency_key`` left out, ``**kwargs`` merged in. With key fields, only the
    top-level arguments they name are serialised, so other arguments need not be JSON.

    A plain signature (no ``*args``, ``**kwargs`` or positional-only parameters) is bound by
    a dictionary walk, on every call of a tool: ``Signature.bind`` costs more than the rest
    of a replay. Anything else, and any call the walk cannot bind (a missing or unexpected
    argument), goes through ``Signature.bind``, which also words the ``TypeError``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        roots: Optional[Sequence[str]] = None,
        receiver: Optional[Tuple[str, Callable[[Any], Any]]] = None,
    ) -> None:
        # A partial's own arguments are part of every call's intent: bound against the
        # function it wraps (partial(base, 1) and partial(base, 9) are two tools' worth).
        self.partial = fn if isinstance(fn, functools.partial) else None
        self.signature = inspect.signature(self.partial.func if self.partial else fn)
        params = list(self.signature.parameters.values())
        # A method's receiver is keyed by what identifies it (``receiver_identity``).
        self.receiver = receiver
        self.skip_first = receiver is not None and bool(params)
        self.first = params[0].name if params else None
        self.takes_key = KEY_ARGUMENT in self.signature.parameters or any(
            p.kind is p.VAR_KEYWORD for p in params
        )
        self.roots = set(roots) if roots is not None else None
        self.plain = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
        self.positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        self.names = frozenset(p.name for p in params)
        self.defaults = tuple((p.name, p.default) for p in params if p.default is not p.empty)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict:
        if self.partial is not None:
            args = (*self.partial.args, *args)
            kwargs = {**self.partial.keywords, **kwargs}
        if not self.plain or len(args) > len(self.positional):
            return self.bind_slow(args, kwargs)
        out = dict(zip(self.positional, args))
        for k, v in kwargs.items():
            if k in out or k not in self.names:
                return self.bind_slow(args, kwargs)
            out[k] = v
        if len(out) < len(self.names):
            for name, default in self.defaults:
                if name not in out:
                    out[name] = default
            if len(out) < len(self.names):
                return self.bind_slow(args, kwargs)
        if self.skip_first:
            out[self.first] = self.identify(out[self.first])
        out.pop(KEY_ARGUMENT, None)
        if self.roots is not None:
            out = {k: v for k, v in out.items() if k in self.roots}
        return out

    def bind_slow(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(str(e)) from None
        bound.apply_defaults()
        out: dict = {}
        for i, (name, value) in enumerate(bound.arguments.items()):
            if i == 0 and self.skip_first:
                out[name] = self.identify(value)
                continue
            param = self.signature.parameters[name]
            if param.kind is param.VAR_KEYWORD:
                for k, v in value.items():
                    if k in out:
                        # Only *NAME can collide (Python refuses the others): merged, f(1,
                        # NAME=2) and f(3, NAME=2) would be one key, and the second a replay.
                        raise KeyDerivationError(
                            f"keyword argument {k!r} has the name of a parameter; an "
                            f"idempotent function cannot key it apart from *{k}; rename one"
                        )
                    if k != KEY_ARGUMENT:
                        out[k] = v
            elif name != KEY_ARGUMENT:
                out[name] = list(value) if param.kind is param.VAR_POSITIONAL else value
        if self.roots is not None:
            out = {k: v for k, v in out.items() if k in self.roots}
        return out


    def identify(self, receiver: Any) -> Any:
        """What of a method's receiver is keyed (see ``receiver_identity``)."""
        assert self.receiver is not None
        return self.receiver[1](receiver)


def field_roots(specs: Sequence[str]) -> list:
    """The top-level argument each key field starts at."""
    roots = []
    for spec in specs:
        if spec.startswith("/"):
            first = spec[1:].split("/", 1)[0]
            roots.append(first.replace("~1", "/").replace("~0", "~"))
        else:
            roots.append(spec.split(".", 1)[0])
    return roots
