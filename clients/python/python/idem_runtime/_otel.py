"""OpenTelemetry spans of tool calls, when the ``opentelemetry`` API is importable.

Each call of an ``@idempotent`` function is one span, ``execute_tool {tool}``, with the
attributes idem's Rust front ends give theirs (docs/design.md §13): the GenAI semantic
conventions for tool execution (``gen_ai.operation.name = execute_tool``,
``gen_ai.tool.name``) and idem's own, ``idem.outcome`` (executed, replayed, in_flight,
mismatch, unknown, not_sent), ``idem.key`` and ``idem.scope_hash`` (the first 16 hex digits
of the SHA-256 of the scope id: never the id itself, which may name a user). Without the
package, or until the application sets a tracer provider, ``tool_span`` is ``nullcontext``
and nothing else runs. The application configures
the SDK and its exporter as usual; idem only asks the global tracer provider for a tracer.
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from typing import Any, ContextManager, Optional

try:
    from opentelemetry import trace as _trace
except ImportError:  # the API is optional: no spans
    _trace = None


def scope_hash(scope_id: str) -> str:
    """What ``idem.scope_hash`` holds for a scope id."""
    return hashlib.sha256(scope_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _no_provider() -> bool:
    """Whether no tracer provider is configured: the API's stand-in (until the application
    sets one) or its explicit no-op. Its spans would record nothing, and starting one and
    making it current costs more than a replay through the native engine, so none is
    started; spans made inside the call still parent to the caller's. Asked on every call, so
    a provider set after import is honoured from the next call."""
    provider = _trace.get_tracer_provider()
    return isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider))


def tool_span(tool: str) -> ContextManager[Any]:
    """The call's span, current while the call runs (a context manager yielding it, or
    ``None`` without OpenTelemetry or a configured tracer provider). An exception leaving it
    is recorded on it."""
    if _trace is None or _no_provider():
        return nullcontext()
    return _trace.get_tracer("idem_runtime").start_as_current_span(
        f"execute_tool {tool}",
        kind=_trace.SpanKind.INTERNAL,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool},
    )


def claimed(span: Any, scope_id: Optional[str], key: str) -> None:
    """Records the key and the scope's hash (none for a key the caller passed explicitly)."""
    if span is not None and span.is_recording():
        span.set_attribute("idem.key", key)
        if scope_id:
            span.set_attribute("idem.scope_hash", scope_hash(scope_id))


def outcome(span: Any, value: str) -> None:
    """Records ``idem.outcome``."""
    if span is not None:
        span.set_attribute("idem.outcome", value)
