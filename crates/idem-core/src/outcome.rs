//! What became of each keyed request or tool call, counted the same way by every front end.
//!
//! `idem_requests_total{outcome}` is one counter for the HTTP layer, the gateway and the MCP
//! proxy. The [`Engine`](crate::Engine) counts what it decides (executed, replayed, conflict,
//! mismatch, outcome unknown, not sent, store error); a front end counts only the refusals it
//! makes before the engine is asked (missing or invalid key, passthrough).

use std::sync::OnceLock;

use metrics::{Counter, Histogram};

/// Every value of the `outcome` label, in the order of [`Outcome`]'s variants, which index
/// the resolved handles (see [`register_metrics`]).
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
/// In the order of [`StoreOp`]'s variants, which index the resolved handles (see
/// [`register_metrics`]).
pub const STORE_OPS: [StoreOp; 7] = [
    StoreOp::Claim,
    StoreOp::Complete,
    StoreOp::Release,
    StoreOp::Extend,
    StoreOp::Get,
    StoreOp::Purge,
    StoreOp::Resolve,
];

/// Registers every counter idem emits at zero, so a scraper sees each from the start: an alert
/// on `idem_completions_lost_total` or `idem_store_errors_total` must not find "no data" until
/// the first loss. It also resolves, once, the handles a request's path counts through
/// (rather than looking each metric up by name and labels on every use). Call it once, after
/// installing the global recorder.
pub fn register_metrics() {
    if METERS.get().is_some() {
        // Zeroing again would reset counts already made (a loss counted, then erased).
        tracing::warn!(
            "register_metrics called again: the counters and the handles of the first call stay"
        );
        return;
    }
    for outcome in ALL {
        metrics::counter!("idem_requests_total", "outcome" => outcome.as_str()).absolute(0);
    }
    for op in STORE_OPS {
        metrics::counter!("idem_store_errors_total", "op" => op.as_str()).absolute(0);
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
    // A second caller racing the first resolves the same handles; either set stands.
    let _ = METERS.set(Meters::resolve());
}

/// The metrics a keyed request's path records, resolved to handles once by
/// [`register_metrics`].
///
/// `metrics::counter!` with a label builds its key and looks it up in the recorder's registry
/// on every call: about 650 instructions, four times per new key (callgrind, issue 33). A
/// resolved handle is an atomic add. Until [`register_metrics`] runs (the language packages,
/// tests with a recorder of their own), each call resolves its handle as before, so it lands
/// in whatever recorder is current.
struct Meters {
    requests: [Counter; ALL.len()],
    store_calls: [Histogram; STORE_OPS.len()],
    store_errors: [Counter; STORE_OPS.len()],
    cache_hits: Counter,
    cache_misses: Counter,
}

static METERS: OnceLock<Meters> = OnceLock::new();

impl Meters {
    fn resolve() -> Self {
        Meters {
            requests: ALL.map(Outcome::resolve),
            store_calls: STORE_OPS.map(StoreOp::resolve_seconds),
            store_errors: STORE_OPS.map(StoreOp::resolve_errors),
            cache_hits: metrics::counter!("idem_cache_hits_total"),
            cache_misses: metrics::counter!("idem_cache_misses_total"),
        }
    }
}

/// A store operation, as `idem_store_errors_total{op}` and `idem_store_call_seconds{op}`
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// `Store::claim`.
    Claim,
    /// `Store::complete`.
    Complete,
    /// `Store::release`.
    Release,
    /// `Store::extend`.
    Extend,
    /// `Store::get`.
    Get,
    /// `Store::purge_expired`.
    Purge,
    /// `Store::resolve`.
    Resolve,
}

impl StoreOp {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::Extend => "extend",
            StoreOp::Get => "get",
            StoreOp::Purge => "purge",
            StoreOp::Resolve => "resolve",
        }
    }

    fn resolve_seconds(self) -> Histogram {
        metrics::histogram!("idem_store_call_seconds", "op" => self.as_str())
    }

    fn resolve_errors(self) -> Counter {
        metrics::counter!("idem_store_errors_total", "op" => self.as_str())
    }

    /// Records one call's duration in `idem_store_call_seconds{op}`.
    pub(crate) fn record_seconds(self, seconds: f64) {
        match METERS.get() {
            Some(m) => m.store_calls[self as usize].record(seconds),
            None => self.resolve_seconds().record(seconds),
        }
    }

    /// Adds one to `idem_store_errors_total{op}`.
    pub(crate) fn count_error(self) {
        match METERS.get() {
            Some(m) => m.store_errors[self as usize].increment(1),
            None => self.resolve_errors().increment(1),
        }
    }
}

/// Adds one to `idem_cache_hits_total` or `idem_cache_misses_total`.
pub(crate) fn count_cache_lookup(hit: bool) {
    match (METERS.get(), hit) {
        (Some(m), true) => m.cache_hits.increment(1),
        (Some(m), false) => m.cache_misses.increment(1),
        (None, true) => metrics::counter!("idem_cache_hits_total").increment(1),
        (None, false) => metrics::counter!("idem_cache_misses_total").increment(1),
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

    fn resolve(self) -> Counter {
        metrics::counter!("idem_requests_total", "outcome" => self.as_str())
    }

    /// Adds one to `idem_requests_total{outcome}` through the `metrics` facade (a no-op when
    /// no recorder is installed), and records `idem.outcome` on the request's span, if the
    /// current span is one: one call, so the two never disagree.
    pub fn count(self) {
        match METERS.get() {
            Some(m) => m.requests[self as usize].increment(1),
            None => self.resolve().increment(1),
        }
        crate::span::record_outcome(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Meters`]' arrays are indexed by the variants: the lists must be in their order.
    #[test]
    fn the_lists_are_in_the_variants_order() {
        for (i, outcome) in ALL.iter().enumerate() {
            assert_eq!(*outcome as usize, i, "{outcome:?}");
        }
        for (i, op) in STORE_OPS.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?}");
        }
    }
}
