//! One tracing span per keyed request or tool call, with the attributes every front end shares
//! ([design §13](docs/design.md#13-observability)).
//!
//! A front end opens the span with [`request`] and runs the [`Engine`](crate::Engine) inside
//! it; the engine records the scope's hash and the key when it claims, and
//! [`Outcome::count`](crate::Outcome::count) records `idem.outcome` wherever an outcome is
//! counted, so the span and `idem_requests_total` can never disagree. The span is a plain
//! `tracing` span: without a subscriber it costs next to nothing, and the `idem` binary exports
//! it as OpenTelemetry (GenAI semantic conventions for tool execution) only when `OTEL_*`
//! says so (`idem-telemetry`).
//!
//! Never a secret: the scope is recorded as a short hash of its label (itself a hash of the
//! caller's credentials, for callers named by headers), never the label or a header.

use sha2::{Digest, Sha256};
use tracing::Span;
use tracing::field::Empty;

use crate::key::Key;
use crate::outcome::Outcome;
use crate::scope::Scope;

/// The attribute holding the request's outcome (see [`Outcome::attribute`]).
pub const OUTCOME: &str = "idem.outcome";
/// The attribute holding [`scope_hash`] of the request's scope.
pub const SCOPE_HASH: &str = "idem.scope_hash";
/// The attribute holding the idempotency key.
pub const KEY: &str = "idem.key";

/// What a span describes.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    /// A keyed HTTP request (the tower layer, the gateway).
    Http {
        /// Its method.
        method: &'a str,
    },
    /// A tool call (the MCP proxy): named `execute_tool {name}`, as the GenAI semantic
    /// conventions name tool execution.
    Tool {
        /// The tool's name.
        name: &'a str,
        /// The call's id, when the caller gave one.
        call_id: Option<&'a str>,
    },
}

/// Opens the span of one keyed request or tool call, a child of the current span. Its
/// `idem.*` attributes are filled in by the engine as it decides.
pub fn request(call: Call<'_>) -> Span {
    match call {
        Call::Http { method } => tracing::info_span!(
            "idem.request",
            otel.name = format!("idem {method}"),
            otel.kind = "internal",
            http.request.method = method,
            idem.outcome = Empty,
            idem.scope_hash = Empty,
            idem.key = Empty,
        ),
        Call::Tool { name, call_id } => tracing::info_span!(
            "idem.tool_call",
            otel.name = format!("execute_tool {name}"),
            otel.kind = "internal",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = name,
            gen_ai.tool.call.id = call_id,
            idem.outcome = Empty,
            idem.scope_hash = Empty,
            idem.key = Empty,
        ),
    }
}

/// The first 16 hex digits of the SHA-256 of the scope's label: enough to tell callers apart
/// in a trace and to match `idem inspect`'s label, and nothing that names the caller.
pub fn scope_hash(scope: &Scope) -> String {
    let digest = Sha256::digest(scope.as_str().as_bytes());
    hex::encode(&digest[..8])
}

/// Records the scope's hash and the key on the current span, if it is a request span.
pub(crate) fn record_claim(scope: &Scope, key: &Key) {
    let span = Span::current();
    if has_field(&span, SCOPE_HASH) {
        span.record(SCOPE_HASH, scope_hash(scope));
        span.record(KEY, key.as_str());
    }
}

/// Records the outcome on the current span (a no-op on any other span).
pub(crate) fn record_outcome(outcome: Outcome) {
    let span = Span::current();
    if has_field(&span, OUTCOME) {
        span.record(OUTCOME, outcome.attribute());
    }
}

/// Whether `span` is enabled and declares `field`: only request spans are written to, and the
/// scope is hashed only when someone records it.
fn has_field(span: &Span, field: &str) -> bool {
    span.metadata()
        .is_some_and(|m| m.fields().field(field).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_hash_is_short_stable_and_not_the_label() {
        let scope = Scope::from_principal([b"authorization".as_slice(), b"Bearer secret"]);
        let hash = scope_hash(&scope);
        assert_eq!(hash.len(), 16);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!scope.as_str().contains(&hash));
        assert_eq!(hash, scope_hash(&scope.clone()));
        assert_ne!(hash, scope_hash(&Scope::anonymous()));
    }
}
