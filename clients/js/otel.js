// OpenTelemetry spans of idempotent(fn) calls, when @opentelemetry/api can be imported
// (docs/design.md §13). Each call is one span, `execute_tool {tool}`, with the GenAI
// tool-execution attributes and idem's own, the same as idem's Rust front ends and the Python
// package: idem.outcome (executed, replayed, in_flight, mismatch, unknown, not_sent), idem.key,
// and idem.scope_hash (the first 16 hex digits of the SHA-256 of the scope id, never the id,
// which may name a user). Without the package nothing here runs. The application configures
// the SDK and its exporter as usual; idem only asks the global provider for a tracer.
import { createHash } from "node:crypto";

let api = null;
try {
  api = await import("@opentelemetry/api");
} catch {
  api = null; // optional: no spans
}

/** What idem.scope_hash holds for a scope id. */
export function scopeHash(scopeId) {
  return createHash("sha256").update(scopeId, "utf8").digest("hex").slice(0, 16);
}

/**
 * Runs `body(span)` inside the call's span, active meanwhile so the tool's own spans are its
 * children; `body(null)` without OpenTelemetry. `callOptions` is a framework's second argument
 * (the AI SDK's `{ toolCallId }`), which names the call when it can.
 */
export function withToolSpan(tool, callOptions, body) {
  if (api === null) return body(null);
  const attributes = { "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool };
  const callId = callOptions?.toolCallId;
  if (typeof callId === "string") attributes["gen_ai.tool.call.id"] = callId;
  const tracer = api.trace.getTracer("idem-runtime");
  return tracer.startActiveSpan(`execute_tool ${tool}`, { kind: api.SpanKind.INTERNAL, attributes }, async (span) => {
    try {
      return await body(span);
    } catch (e) {
      span.recordException(e);
      span.setStatus({ code: api.SpanStatusCode.ERROR, message: e?.message });
      throw e;
    } finally {
      span.end();
    }
  });
}

/** Records the key, and the scope's hash (none for a key the caller passed explicitly). */
export function claimed(span, scopeId, key) {
  if (span === null || !span.isRecording()) return;
  span.setAttribute("idem.key", key);
  if (scopeId) span.setAttribute("idem.scope_hash", scopeHash(scopeId));
}

/** Records idem.outcome. */
export function outcome(span, value) {
  span?.setAttribute("idem.outcome", value);
}
