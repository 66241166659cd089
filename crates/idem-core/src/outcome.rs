//! What became of each keyed request or tool call, counted the same way by every front end.
//!
//! `idem_requests_total{outcome}` is one counter for the HTTP layer, the gateway and the MCP
//! proxy. The [`Engine`](crate::Engine) counts what it decides (executed, replayed, conflict,
//! mismatch, outcome unknown, not sent, store error); a front end counts only the refusals it
//! makes before the engine is asked (missing or invalid key, passthrough).

/// Every value of the `outcome` label.
pub const ALL: [Outcome; 10] = [
    Outcome::Executed,
    Outcome::Replayed,
    Outcome::Conflict,
    Outcome::Mismatch,
    Outcome::Missing,
    Outcome::Invalid,
    Outcome::StoreError,
    Outcome::OutcomeUnknown,
    Outcome::NotSent,
    Outcome::Passthrough,
];

/// The store operations `idem_store_errors_total{op}` and `idem_store_call_seconds{op}` name.
pub const STORE_OPS: [&str; 7] = [
    "claim", "complete", "release", "extend", "get", "purge", "resolve",
];

/// Registers every counter idem emits at zero, so a scraper sees each from the start: an alert
/// on `idem_completions_lost_total` or `idem_store_errors_total` must not find "no data" until
/// the first loss. Call it once after installing a recorder.
pub fn register_metrics() {
    for outcome in ALL {
        metrics::counter!("idem_requests_total", "outcome" => outcome.as_str()).absolute(0);
    }
    for op in STORE_OPS {
        metrics::counter!("idem_store_errors_total", "op" => op).absolute(0);
    }
    for name in [
        "idem_abandoned_records_total",
        "idem_cache_hits_total",
        "idem_cache_misses_total",
        "idem_completions_lost_total",
        "idem_purged_records_total",
    ] {
        metrics::counter!(name).absolute(0);
    }
}

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

    /// The value of the span attribute `idem.outcome` ([`crate::span`]): the words the
    /// language packages use for what a call met (`in_flight`, `unknown`), the label's
    /// elsewhere.
    pub const fn attribute(self) -> &'static str {
        match self {
            Outcome::Conflict => "in_flight",
            Outcome::OutcomeUnknown => "unknown",
            other => other.as_str(),
        }
    }

    /// Adds one to `idem_requests_total{outcome}` through the `metrics` facade (a no-op when
    /// no recorder is installed), and records `idem.outcome` on the request's span, if the
    /// current span is one: one call, so the two never disagree.
    pub fn count(self) {
        metrics::counter!("idem_requests_total", "outcome" => self.as_str()).increment(1);
        crate::span::record_outcome(self);
    }
}
