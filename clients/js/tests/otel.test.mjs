// OpenTelemetry spans of idempotent(fn) calls (docs/design.md §13): one span per call with the
// GenAI tool-execution attributes and idem's own, read back from the SDK's in-memory exporter
// (the SDK is a devDependency, so `npm ci` installs it and these run in CI).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import { context, trace, SpanStatusCode } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import { OutcomeUnknownError, idempotent, withScope } from "../index.js";

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

let unique = 0;
const runId = () => `run-${process.pid}-${unique++}`;
const toolSpans = () => exporter.getFinishedSpans().filter((s) => s.name.startsWith("execute_tool"));

function assertToolSpan(span, tool, outcome, scopeId) {
  assert.equal(span.name, `execute_tool ${tool}`);
  assert.equal(span.attributes["gen_ai.operation.name"], "execute_tool");
  assert.equal(span.attributes["gen_ai.tool.name"], tool);
  assert.equal(span.attributes["idem.outcome"], outcome);
  const hash = createHash("sha256").update(scopeId).digest("hex").slice(0, 16);
  assert.equal(span.attributes["idem.scope_hash"], hash);
  assert.equal(typeof span.attributes["idem.key"], "string");
  for (const [name, value] of Object.entries(span.attributes)) {
    if (name !== "idem.key") assert.ok(!String(value).includes(scopeId), `${name} carries the scope id`);
  }
}

test("executed, replayed and unknown calls each make one span with their outcome", async () => {
  exporter.reset();
  const scopeId = runId();
  const charge = idempotent(async ({ customer, amount }) => ({ charge: `ch_${customer}_${amount}` }), {
    tool: "charge_card",
    store: "memory:",
  });
  // A result the codec cannot encode: the function acted, so its outcome is unknown.
  const lost = idempotent(async () => 1n, { tool: "charge_card", store: "memory:" });
  await withScope(scopeId, async () => {
    await charge({ customer: "cus_1", amount: 4900 }, { toolCallId: "call_1" });
    await charge({ customer: "cus_1", amount: 4900 }, { toolCallId: "call_2" });
    await assert.rejects(lost({ customer: "cus_1", amount: 1 }), TypeError);
    await assert.rejects(lost({ customer: "cus_1", amount: 1 }), OutcomeUnknownError);
  });
  const spans = toolSpans();
  assert.deepEqual(
    spans.map((s) => s.attributes["idem.outcome"]),
    ["executed", "replayed", "unknown", "unknown"],
  );
  for (const span of spans) assertToolSpan(span, "charge_card", span.attributes["idem.outcome"], scopeId);
  assert.deepEqual(
    spans.map((s) => s.attributes["gen_ai.tool.call.id"]),
    ["call_1", "call_2", undefined, undefined],
  );
  assert.equal(spans[0].attributes["idem.key"], spans[1].attributes["idem.key"]);
  assert.equal(spans[3].status.code, SpanStatusCode.ERROR);
});

test("a released call is not_sent, and the tool's own spans are children of the call's", async () => {
  exporter.reset();
  const scopeId = runId();
  let calls = 0;
  const tracer = trace.getTracer("test");
  const send = idempotent(
    async ({ to }) => {
      calls += 1;
      if (calls === 1) throw new Error("refused before sending");
      return tracer.startActiveSpan("POST /send", (inner) => {
        inner.end();
        return `sent to ${to}`;
      });
    },
    { tool: "send_email", store: "memory:" },
  );
  await withScope(scopeId, async () => {
    await assert.rejects(send({ to: "a@example.com" }), /refused/);
    assert.equal(await send({ to: "a@example.com" }), "sent to a@example.com");
  });
  const spans = toolSpans();
  assert.equal(spans.length, 2);
  assertToolSpan(spans[0], "send_email", "not_sent", scopeId);
  assertToolSpan(spans[1], "send_email", "executed", scopeId);
  const inner = exporter.getFinishedSpans().find((s) => s.name === "POST /send");
  assert.equal(inner.parentSpanContext?.spanId ?? inner.parentSpanId, spans[1].spanContext().spanId);
});
