"""idem for Python agents: stable idempotency keys at the point of intent, and tools that
run at most once per intent, on idem's Rust engine and stores.

    from idem_runtime import idempotent, scope

    @idempotent(key_fields=["customer", "amount_cents"])
    def charge_card(customer: str, amount_cents: int, note: str = "") -> dict:
        return payments.charge(customer, amount_cents)

    with scope(run_id):
        charge_card("cus_1", 4900)   # runs
        charge_card("cus_1", 4900)   # replays the stored result; no second charge
"""

import atexit as _atexit
import os as _os

from . import _decorator, _native
from ._codec import JSON, Codec, JsonCodec
from ._decorator import DEFAULT_RETENTION, Outcome, idempotent, inspect_key, open_store
from ._keys import KEY_ARGUMENT, derive_key
from ._native import DEFAULT_STORE
from ._scope import Scope, current_scope, scope
from .errors import (
    ConfigurationError,
    IdemError,
    InFlightError,
    KeyDerivationError,
    KeyMismatchError,
    OutcomeUnknownError,
    ReplayedError,
    ResultTooLargeError,
    ResultUnreadableError,
    ScopeMissingError,
    StoreUnavailableError,
)

__all__ = [
    "idempotent",
    "derive_key",
    "scope",
    "Scope",
    "current_scope",
    "Outcome",
    "inspect_key",
    "open_store",
    "Codec",
    "JsonCodec",
    "JSON",
    "KEY_ARGUMENT",
    "DEFAULT_STORE",
    "DEFAULT_RETENTION",
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

# Around a fork (multiprocessing's default start method on Linux): the native host's lock is
# held across it, and the child gets fresh locks for the stores it opens. A child of a
# process that had a SQLite store open is refused SQLite (ConfigurationError saying why);
# server stores and memory: work in it (crates/idem-embed/src/host.rs).
def _after_fork_in_child() -> None:
    _native.after_fork()
    _decorator._reset_after_fork()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(
        before=_native.before_fork,
        after_in_parent=_native.after_fork,
        after_in_child=_after_fork_in_child,
    )

# At exit the stores are closed: a SQLite store's file is then complete and alone, with no
# -wal or -shm beside it (the native host is never dropped, so nothing else would close it).
_atexit.register(_native.shutdown)
