"""idem key derivation, version idem/v1: the reference for Python (standard library only).

    from idem_key import derive
    key = derive("turn_9f3a", "charge_card", {"customer": "cus_8g2k", "amount": 4900})
    # 'turn_9f3a-charge_card-...'

The algorithm is specified in docs/key-derivation.md; docs/key-vectors.json holds the vectors
every implementation reproduces byte for byte. Copy this one file into your agent runtime.
"""

import hashlib
import hmac
import json
import math

VERSION = "idem/v1"
MAX_SAFE = 2**53
LABEL_MAX = 48
DIGEST_BYTES = 20  # 160 bits, 32 base32 characters
_B32 = "abcdefghijklmnopqrstuvwxyz234567"
_LABEL_OK = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:")


class DeriveError(ValueError):
    """The inputs cannot name an intent; the message says why."""


def _es_number(x):
    """A number as ECMAScript's Number.prototype.toString writes it (RFC 8785 section 3.2.2.3)."""
    if isinstance(x, bool):
        raise DeriveError("booleans are not numbers")
    if isinstance(x, int):
        if abs(x) > MAX_SAFE:
            raise DeriveError(f"integer {x} is beyond 2^53; JCS cannot carry it exactly (send it as a string)")
        x = float(x)
    if not math.isfinite(x):
        raise DeriveError(f"number {x} is not finite")
    if x.is_integer() and abs(x) > MAX_SAFE:
        raise DeriveError(f"number {x!r} is an integer beyond 2^53; JCS cannot carry it exactly (send it as a string)")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    text = repr(abs(x))  # shortest round-trip digits
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + (int(exp) if exp else 0)  # value = 0.<all digits> * 10^point, before stripping
    point -= len(whole + frac) - len((whole + frac).lstrip("0"))
    digits = digits.rstrip("0") or "0"
    k, n = len(digits), point
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


def _es_string(s):
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif c < 0x20:
            out.append({8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}.get(c, "\\u%04x" % c))
        elif 0xD800 <= c <= 0xDFFF:
            raise DeriveError("a string has a lone surrogate (\\u%04x); it is not Unicode text" % c)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical(value):
    """RFC 8785 (JCS) serialisation of a JSON value made of dict, list, str, int, float, bool, None."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return _es_number(value)
    if isinstance(value, str):
        return _es_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise DeriveError(f"object member names must be strings, not {type(k).__name__}")
        keys = sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))
        return "{" + ",".join(_es_string(k) + ":" + canonical(value[k]) for k in keys) + "}"
    raise DeriveError(f"{type(value).__name__} is not a JSON value")


def _label(s):
    return "".join(ch if ch in _LABEL_OK else "_" for ch in s)[:LABEL_MAX]


def _base32(data):
    bits = int.from_bytes(data, "big")
    n = len(data) * 8
    out = []
    for shift in range(n - 5, -1, -5):
        out.append(_B32[(bits >> shift) & 31])
    return "".join(out)


def canonical_bytes(scope, tool, args, ordinal=0):
    """The bytes that are hashed: JCS of ["idem/v1", scope, tool, ordinal, args without idempotency_key]."""
    if not isinstance(scope, str) or not scope:
        raise DeriveError("scope must be a non-empty string")
    if not isinstance(tool, str) or not tool:
        raise DeriveError("tool must be a non-empty string")
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal <= MAX_SAFE:
        raise DeriveError("ordinal must be an integer from 0 to 2^53")
    if isinstance(args, dict) and "idempotency_key" in args:
        args = {k: v for k, v in args.items() if k != "idempotency_key"}
    return canonical([VERSION, scope, tool, ordinal, args]).encode("utf-8", "surrogatepass")


def derive(scope, tool, args, ordinal=0, secret=None):
    """The idempotency key of one intent. `secret` (bytes) makes it an HMAC-SHA256."""
    data = canonical_bytes(scope, tool, args, ordinal)
    if secret is None:
        digest = hashlib.sha256(data).digest()
    else:
        if isinstance(secret, str):
            secret = secret.encode("utf-8")
        digest = hmac.new(secret, data, hashlib.sha256).digest()
    return f"{_label(scope)}-{_label(tool)}-{_base32(digest[:DIGEST_BYTES])}"


def loads_args(text):
    """Parses JSON text for derive(); integers beyond 2^53 are an error, not a rounding."""

    def parse_int(literal):
        v = int(literal)
        if abs(v) > MAX_SAFE:
            raise DeriveError(f"integer {literal} is beyond 2^53; JCS cannot carry it exactly (send it as a string)")
        return v

    try:
        return json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as e:
        raise DeriveError(f"args are not JSON: {e}") from None
