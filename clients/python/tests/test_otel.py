"""OpenTelemetry spans of @idempotent calls (docs/design.md §13): one span per call, with the
GenAI tool-execution attributes and idem's own, read back from the SDK's in-memory exporter.
Skipped, saying so, where the OpenTelemetry SDK is not installed (it is pinned in
requirements.txt, so CI runs them)."""

from __future__ import annotations

import asyncio
import hashlib
import unittest
import uuid

from idem_runtime import OutcomeUnknownError, idempotent, scope

try:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:  # pragma: no cover - CI installs it
    trace = None

EXPORTER = None


def setUpModule() -> None:
    global EXPORTER
    if trace is None:
        raise unittest.SkipTest("opentelemetry-sdk is not installed (tests/requirements.txt)")
    EXPORTER = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    # Once per process; the other test modules create no provider of their own.
    trace.set_tracer_provider(provider)


class Spans(unittest.TestCase):
    def setUp(self) -> None:
        EXPORTER.clear()
        self.run_id = "run-" + uuid.uuid4().hex[:12]

    def spans(self):
        return [s for s in EXPORTER.get_finished_spans() if s.name.startswith("execute_tool")]

    def assert_tool_span(self, span, tool: str, outcome: str) -> None:
        attrs = dict(span.attributes)
        self.assertEqual(span.name, f"execute_tool {tool}")
        self.assertEqual(attrs["gen_ai.operation.name"], "execute_tool")
        self.assertEqual(attrs["gen_ai.tool.name"], tool)
        self.assertEqual(attrs["idem.outcome"], outcome)
        expected = hashlib.sha256(self.run_id.encode()).hexdigest()[:16]
        self.assertEqual(attrs["idem.scope_hash"], expected)
        self.assertTrue(attrs["idem.key"].startswith(self.run_id.replace("-", "_")))
        # The scope id itself (it may name a user) is in no attribute but the key's text.
        for name, value in attrs.items():
            if name != "idem.key":
                self.assertNotIn(self.run_id, str(value), name)

    def test_executed_replayed_and_unknown(self):
        @idempotent(store="memory:", unknown_errors=[TimeoutError])
        def charge_card(customer: str, amount_cents: int) -> dict:
            if amount_cents == 1:
                raise TimeoutError("the answer never came")
            return {"charge": "ch_1"}

        with scope(self.run_id):
            charge_card("cus_1", 4900)
            charge_card("cus_1", 4900)
            with self.assertRaises(TimeoutError):
                charge_card("cus_1", 1)
            with self.assertRaises(OutcomeUnknownError):
                charge_card("cus_1", 1)
        spans = self.spans()
        self.assertEqual(len(spans), 4)
        for span, outcome in zip(spans, ["executed", "replayed", "unknown", "unknown"]):
            self.assert_tool_span(span, "charge_card", outcome)
        self.assertEqual(
            len({dict(s.attributes)["idem.key"] for s in spans}), 2, "two intents, two keys"
        )

    def test_a_released_call_is_not_sent_and_the_retry_executes_async(self):
        calls = []

        @idempotent(store="memory:")
        async def send_email(to: str) -> str:
            calls.append(to)
            if len(calls) == 1:
                raise ConnectionError("refused before sending")
            return "sent"

        async def main() -> None:
            with scope(self.run_id):
                with self.assertRaises(ConnectionError):
                    await send_email("a@example.com")
                await send_email("a@example.com")

        asyncio.run(main())
        spans = self.spans()
        self.assertEqual(len(spans), 2)
        self.assert_tool_span(spans[0], "send_email", "not_sent")
        self.assert_tool_span(spans[1], "send_email", "executed")
        self.assertEqual(spans[0].status.status_code, trace.StatusCode.ERROR)

    def test_the_span_is_the_parent_of_what_the_tool_does(self):
        tracer = trace.get_tracer("test")

        @idempotent(store="memory:")
        def lookup(order: str) -> str:
            with tracer.start_as_current_span("http GET /orders"):
                return "ok"

        with scope(self.run_id):
            lookup("o-1")
        inner = [s for s in EXPORTER.get_finished_spans() if s.name == "http GET /orders"]
        (outer,) = self.spans()
        self.assertEqual(inner[0].parent.span_id, outer.context.span_id)


# Before the application sets a tracer provider, no span is started (it would record nothing
# and cost more than the replay); one set afterwards is honoured from the next call. Its own
# process: the global provider can be set only once.
BEFORE_AND_AFTER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from idem_runtime import _otel, idempotent, scope

@idempotent(store="memory:", tool="ship")
def ship(order: str) -> dict:
    return {"shipped": order}

with scope("run-1"):
    assert ship("o-1") == {"shipped": "o-1"}
    with _otel.tool_span("ship") as span:
        assert span is None, span
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert ship("o-1") == {"shipped": "o-1"}
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["execute_tool ship"], names
print("ok")
"""


class ProviderSetLater(unittest.TestCase):
    def test_no_span_before_a_provider_is_set_and_spans_after(self):
        if trace is None:
            self.skipTest("opentelemetry-sdk is not installed (tests/requirements.txt)")
        import subprocess
        import sys

        from cli_support import subprocess_env

        # No provider from the environment (OTEL_PYTHON_TRACER_PROVIDER).
        env = {k: v for k, v in subprocess_env().items() if not k.startswith("OTEL_")}
        p = subprocess.run(
            [sys.executable, "-c", BEFORE_AND_AFTER],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        self.assertEqual((p.returncode, p.stdout.strip()), (0, "ok"), p.stderr)


if __name__ == "__main__":
    unittest.main()
