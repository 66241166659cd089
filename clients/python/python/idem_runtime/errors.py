"""The exceptions idem_runtime raises: one hierarchy, each saying what to do next.

Every error is an :class:`IdemError`. Those about bad input are also ``ValueError`` (a
caller's mistake, fixed in code); the others describe the state of a key and carry it as
``.key`` so a caller, or the model reading the message, can act on it.
"""

from __future__ import annotations

from typing import Optional


class IdemError(Exception):
    """Base class of every idem_runtime error."""

    def __init__(self, message: str, *, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.key = key


class ConfigurationError(IdemError, ValueError):
    """A store URL, policy value or option is invalid; nothing was run."""


class KeyDerivationError(IdemError, ValueError):
    """No key could be derived from these arguments (not JSON, an integer beyond 2^53, a
    lone surrogate, a key field that is missing); nothing was run."""


class ScopeMissingError(IdemError):
    """A key needs a scope (the run, thread, task or business id the call belongs to), and
    none was given or set with ``with idem_runtime.scope(...)``; nothing was run."""


class StoreUnavailableError(IdemError):
    """The store could not be read or written, so the call was not run (idem fails closed:
    it never runs a side effect it could not record). Retry later with the same arguments."""


class InFlightError(IdemError):
    """Another call with this key is still running and did not finish within the wait.
    Retry later with the same arguments: the retry gets that call's result."""


class KeyMismatchError(IdemError):
    """The key was first used for a call with other arguments. A different intent needs a
    different key (another scope, or an ``ordinal``)."""


class OutcomeUnknownError(IdemError):
    """An earlier call with this key may have acted, but its outcome is unknown (its process
    stopped, or it lost the store, mid-call). It was not run again. Check whether it
    happened, then settle the key with ``idem resolve``."""


class ResultTooLargeError(IdemError):
    """The call ran, but its result was over ``max_result_bytes``, so only its digest was
    kept and a replay cannot return it. It was not run again."""


class ResultUnreadableError(IdemError):
    """A stored result could not be decoded by the codec. It was not run again."""


class ReplayedError(IdemError):
    """Replays an exception the first call raised and the tool keeps, when its class cannot
    be rebuilt (``type_name`` and ``message`` say what it was)."""

    def __init__(self, message: str, *, key: Optional[str] = None, type_name: str = "") -> None:
        super().__init__(message, key=key)
        self.type_name = type_name


__all__ = [
    "IdemError",
    "ConfigurationError",
    "KeyDerivationError",
    "ScopeMissingError",
    "StoreUnavailableError",
    "InFlightError",
    "KeyMismatchError",
    "OutcomeUnknownError",
    "ResultTooLargeError",
    "ResultUnreadableError",
    "ReplayedError",
]
