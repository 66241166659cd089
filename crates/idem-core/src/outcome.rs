//! What became of each keyed request or tool call, counted the same way by every front end.
//!
//! `idem_requests_total{outcome}` is one counter for the HTTP layer, the gateway and the MCP
//! proxy. The [`Engine`](crate::Engine) counts what it decides (executed, replayed, conflict,
//! mismatch, outcome unknown, not sent, store error); a front end counts only the refusals it
//! makes before the engine is asked (missing or invalid key, passthrough).

/// One value of the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// This request executed the effect.
    Executed,
    /// A stored result was replayed.
    Replayed,
    /// Another execution of the same key was in flight (after any wait).
    Conflict,
    /// The key was used for another request.
    Mismatch,
    /// A key was required and none was sent.
    Missing,
    /// The key or the request was refused before the store was asked.
    Invalid,
    /// The store could not be used; nothing ran.
    StoreError,
    /// The outcome is unknown: this execution's, or an earlier one's (abandoned).
    OutcomeUnknown,
    /// The effect reported that nothing was sent; the key was released.
    NotSent,
    /// No key and none required: passed through unprotected.
    Passthrough,
}

impl Outcome {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::Missing => "missing",
            Outcome::Invalid => "invalid",
            Outcome::StoreError => "store_error",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::NotSent => "not_sent",
            Outcome::Passthrough => "passthrough",
        }
    }

    /// Adds one to `idem_requests_total{outcome}` through the `metrics` facade (a no-op when
    /// no recorder is installed).
    pub fn count(self) {
        metrics::counter!("idem_requests_total", "outcome" => self.as_str()).increment(1);
    }
}
