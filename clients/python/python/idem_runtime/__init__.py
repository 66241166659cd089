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
