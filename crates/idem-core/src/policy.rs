//! Policy: which tools need keys, and how a key behaves on one route or tool.
//!
//! One vocabulary for every front end. The gateway's TOML, the MCP proxy's TOML, the tool
//! client and the language packages all speak of a [`ToolClass`] (from MCP annotations or
//! configuration), a [`Policy`] (lease, retention, what an unknown outcome gets, how long a
//! duplicate waits), and refuse the same unsafe values through one [`Policy::validate`], in
//! the same words.

use std::time::Duration;

use serde::Deserialize;

use crate::store::{AbandonedPolicy, DEFAULT_RETENTION};

/// What calling a tool twice does (design §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolClass {
    /// Changes nothing: no key, retried freely, passed through.
    Read,
    /// Naturally safe to repeat (a PUT of a whole resource): no key, retried freely.
    Idempotent,
    /// A side effect: a key is required, sent on every attempt, and a repeat replays the
    /// first result.
    Effect,
}

impl ToolClass {
    /// From MCP tool annotations: `readOnlyHint` makes a read, `idempotentHint` an idempotent
    /// tool, anything else (no annotations included) an effect. Unknown means effect: the
    /// safe mistake is a key nobody needed, not a double charge. `readOnlyHint` wins over
    /// `idempotentHint`.
    pub const fn from_annotations(
        read_only_hint: Option<bool>,
        idempotent_hint: Option<bool>,
    ) -> Self {
        match (read_only_hint, idempotent_hint) {
            (Some(true), _) => ToolClass::Read,
            (_, Some(true)) => ToolClass::Idempotent,
            _ => ToolClass::Effect,
        }
    }

    /// Whether calls of this class carry a key.
    pub const fn needs_key(self) -> bool {
        matches!(self, ToolClass::Effect)
    }

    /// The lowercase name, as configuration files write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ToolClass::Read => "read",
            ToolClass::Idempotent => "idempotent",
            ToolClass::Effect => "effect",
        }
    }
}

/// The shortest lease a configuration may set. A claim must outlive a heartbeat's round trip
/// to the store (the heartbeat extends it every third of the lease), or a duplicate takes the
/// key over while the first execution still runs.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// The longest lease, retention or wait a policy takes (100 years): a deadline is an
/// `Instant` and a record's times are milliseconds in an `i64`, and a value near
/// `Duration::MAX` (a language package's `1e22` milliseconds) overflowed them with a panic.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How the engine treats the keys of one route or tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a claim holds the key without a heartbeat. The heartbeat extends it every
    /// third of this while the effect runs, so it bounds how long a crashed executor blocks
    /// the key, not how long an effect may take.
    pub lease: Duration,
    /// How long a completed result is replayed, counted from completion.
    pub retention: Duration,
    /// What a retry of an abandoned record (an unknown outcome) gets (design §5).
    pub on_abandoned: AbandonedPolicy,
    /// How long a duplicate of an in-flight execution waits for its result before it is
    /// answered [`Answer::InFlight`](crate::Answer::InFlight); `None` answers at once.
    pub wait: Option<Duration>,
    /// HTTP statuses that mean "not processed, try again": the key is released, not kept
    /// (design §4). Empty for tool calls, which have no status.
    pub release_statuses: Vec<u16>,
    /// Bodies longer than this are stored as length and digest only (design §4).
    pub max_stored_body: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lease: Duration::from_secs(30),
            retention: DEFAULT_RETENTION,
            on_abandoned: AbandonedPolicy::Reject,
            wait: None,
            release_statuses: vec![429, 503],
            max_stored_body: 1024 * 1024,
        }
    }
}

/// A policy value that would let one key run twice, or never replay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Under [`MIN_LEASE`].
    #[error(
        "lease {} is under {}: a duplicate would take the key over while the first execution still runs",
        humantime::format_duration(*.0),
        humantime::format_duration(MIN_LEASE)
    )]
    LeaseTooShort(Duration),
    /// Zero retention.
    #[error("retention 0s keeps no result: a retry would run the effect again")]
    NoRetention,
    /// Zero upstream timeout.
    #[error("upstream timeout 0s makes every call's outcome unknown")]
    NoUpstreamTime,
    /// A release status that is not an HTTP status.
    #[error("release_statuses has {0}, which is not an HTTP status")]
    NotAStatus(u16),
    /// A lease, retention or wait over [`MAX_DURATION`].
    #[error(
        "{what} {} is over {}: the clock arithmetic of a deadline that far out would overflow",
        humantime::format_duration(*.value),
        humantime::format_duration(MAX_DURATION)
    )]
    TooLong {
        /// `lease`, `retention` or `wait`.
        what: &'static str,
        /// The value given.
        value: Duration,
    },
}

impl Policy {
    /// Refuses values that would let one key run twice or never replay. Configuration files
    /// (the gateway's, the MCP proxy's) call it for every route or tool; code that builds a
    /// policy directly (tests with short leases) need not.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.lease < MIN_LEASE {
            return Err(PolicyError::LeaseTooShort(self.lease));
        }
        if self.retention.is_zero() {
            return Err(PolicyError::NoRetention);
        }
        for (what, value) in [
            ("lease", Some(self.lease)),
            ("retention", Some(self.retention)),
            ("wait", self.wait),
        ] {
            if let Some(value) = value.filter(|v| *v > MAX_DURATION) {
                return Err(PolicyError::TooLong { what, value });
            }
        }
        if let Some(bad) = self
            .release_statuses
            .iter()
            .find(|s| !(100..=599).contains(*s))
        {
            return Err(PolicyError::NotAStatus(*bad));
        }
        Ok(())
    }

    /// Refuses an upstream timeout of zero: nothing could ever answer in time.
    pub fn validate_upstream_timeout(timeout: Duration) -> Result<(), PolicyError> {
        if timeout.is_zero() {
            Err(PolicyError::NoUpstreamTime)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_classify_and_unknown_means_effect() {
        use ToolClass::*;
        assert_eq!(ToolClass::from_annotations(Some(true), None), Read);
        assert_eq!(ToolClass::from_annotations(Some(true), Some(true)), Read);
        assert_eq!(ToolClass::from_annotations(None, Some(true)), Idempotent);
        assert_eq!(
            ToolClass::from_annotations(Some(false), Some(false)),
            Effect
        );
        assert_eq!(ToolClass::from_annotations(None, None), Effect);
        assert!(Effect.needs_key() && !Read.needs_key() && !Idempotent.needs_key());
    }

    #[test]
    fn unsafe_values_are_refused_in_words() {
        let p = Policy::default();
        assert_eq!(p.validate(), Ok(()));
        let short = Policy {
            lease: Duration::from_millis(500),
            ..Policy::default()
        };
        assert_eq!(
            short.validate().map_err(|e| e.to_string()),
            Err("lease 500ms is under 1s: a duplicate would take the key over while the first execution still runs".to_owned())
        );
        let none = Policy {
            retention: Duration::ZERO,
            ..Policy::default()
        };
        assert_eq!(none.validate(), Err(PolicyError::NoRetention));
        let status = Policy {
            release_statuses: vec![42],
            ..Policy::default()
        };
        assert_eq!(status.validate(), Err(PolicyError::NotAStatus(42)));
        for (what, p) in [
            (
                "lease",
                Policy {
                    lease: MAX_DURATION * 2,
                    ..Policy::default()
                },
            ),
            (
                "retention",
                Policy {
                    retention: Duration::MAX,
                    ..Policy::default()
                },
            ),
            (
                "wait",
                Policy {
                    wait: Some(Duration::from_secs(u64::MAX)),
                    ..Policy::default()
                },
            ),
        ] {
            assert!(
                matches!(p.validate(), Err(PolicyError::TooLong { what: w, .. }) if w == what),
                "{what} over 100 years is refused"
            );
        }
        assert!(Policy::validate_upstream_timeout(Duration::ZERO).is_err());
        assert!(Policy::validate_upstream_timeout(Duration::from_secs(1)).is_ok());
    }
}
