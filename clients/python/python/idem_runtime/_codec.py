"""How a tool's return value is stored and replayed.

JSON by default: what the function returned is stored as JSON and a replay returns the
decoded JSON (a dataclass or a pydantic model comes back as a dict, as with AWS Lambda
Powertools). For typed replays, pass a codec of your own: any object with ``media_type``,
``encode(value) -> bytes`` and ``decode(data: bytes) -> value``, e.g. one that calls a
pydantic model's ``model_dump_json`` and ``model_validate_json``. Pickle is not offered: a
store shared with other processes would let whoever can write it run code in yours.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Codec(Protocol):
    media_type: str

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


def to_json(value: Any) -> Any:
    """``json.dumps``'s ``default``: the common types that have one obvious JSON form."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic v2
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON")


_ENCODER = json.JSONEncoder(default=to_json, ensure_ascii=False, separators=(",", ":"))
_scan = json.JSONDecoder().scan_once


class JsonCodec:
    """The default codec."""

    media_type = "application/json"

    def encode(self, value: Any) -> bytes:
        return _ENCODER.encode(value).encode()

    def decode(self, data: bytes) -> Any:
        # A replay's hot path: the C scanner straight away (``json.loads`` first sniffs the
        # bytes' encoding and strips whitespace in Python). Anything it does not take whole
        # (surrounding whitespace, as an operator's ``idem resolve --body`` file may have,
        # or an error to report) goes through ``json.loads``.
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        try:
            value, end = _scan(text, 0)
        except (StopIteration, ValueError):
            return json.loads(text)
        return value if end == len(text) else json.loads(text)


JSON = JsonCodec()
