//! W3C trace context in and out of a front end, through whatever propagator the process
//! installed (none by default: then both functions do nothing).

use opentelemetry::global;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of the trace named by `headers` (`traceparent`, `tracestate`), when
/// they name one. Call it on a span just opened, before it is entered: a span's parent is
/// fixed once it starts. Without such headers the span stays a child of the current span.
pub fn continue_remote(span: &Span, headers: &http::HeaderMap) {
    if span.is_disabled() {
        return; // nobody records it: not even the headers are read
    }
    let parent = global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    if parent.span().span_context().is_valid() {
        // Fails only without an OpenTelemetry layer, when there is nothing to continue.
        let _ = span.set_parent(parent);
    }
}

/// Writes the current span's trace context into `headers` (replacing a `traceparent` the
/// caller sent, whose trace the current span continues), so the upstream's spans join the
/// trace. Writes nothing when no trace is being exported.
pub fn inject(headers: &mut http::HeaderMap) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        global::get_text_map_propagator(|p| p.inject_context(&cx, &mut HeaderInjector(headers)));
    }
}
