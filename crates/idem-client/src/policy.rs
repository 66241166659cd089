//! Which tools need keys, and how hard to retry ([design §7](docs/design.md#7-the-runtime-side)).
//! The tool classes are idem-core's [`ToolClass`], the vocabulary the MCP proxy and the gateway
//! share.

use std::time::Duration;

pub use idem_core::ToolClass;

/// Why an effect matters, for reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Moves money.
    Money,
    /// Visible outside the system (an e-mail, a message).
    External,
    /// Changes state others share (a ticket, a VM).
    SharedState,
}

/// A tool's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPolicy {
    /// What a repeat does.
    pub class: ToolClass,
    /// For effects: why it matters.
    pub category: Option<Category>,
}

impl ToolPolicy {
    /// A read.
    pub const fn read() -> Self {
        ToolPolicy {
            class: ToolClass::Read,
            category: None,
        }
    }

    /// An effect of a category.
    pub const fn effect(category: Category) -> Self {
        ToolPolicy {
            class: ToolClass::Effect,
            category: Some(category),
        }
    }

    /// From MCP tool annotations: `readOnlyHint` makes a read, `idempotentHint` an idempotent
    /// tool, anything else (no annotations included) an effect. Unknown means effect: the
    /// safe mistake is a key nobody needed, not a double charge.
    pub const fn from_annotations(
        read_only_hint: Option<bool>,
        idempotent_hint: Option<bool>,
    ) -> Self {
        ToolPolicy {
            class: ToolClass::from_annotations(read_only_hint, idempotent_hint),
            category: None,
        }
    }

    /// Whether a key is derived and sent.
    pub const fn needs_key(&self) -> bool {
        self.class.needs_key()
    }
}

/// Policies by tool name, from configuration or from a server's tool list. A tool nobody
/// described is an effect ([design §7](docs/design.md#7-the-runtime-side)).
#[derive(Debug, Clone, Default)]
pub struct ToolPolicies {
    by_name: std::collections::HashMap<String, ToolPolicy>,
}

impl ToolPolicies {
    /// Sets a tool's policy.
    pub fn set(&mut self, tool: impl Into<String>, policy: ToolPolicy) -> &mut Self {
        self.by_name.insert(tool.into(), policy);
        self
    }

    /// A tool's policy; an unknown tool is an effect.
    pub fn get(&self, tool: &str) -> ToolPolicy {
        self.by_name.get(tool).copied().unwrap_or(ToolPolicy {
            class: ToolClass::Effect,
            category: None,
        })
    }
}

/// How a call is retried: exponential backoff with full jitter, bounded in attempts and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The backoff bound before the second attempt; it doubles each time.
    pub base: Duration,
    /// The backoff bound never grows past this.
    pub cap: Duration,
    /// No attempt starts later than this after the first.
    pub max_total: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_total: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The upper bound of the jittered wait after `failed` attempts (1 after the first).
    pub fn backoff_bound(&self, failed: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failed.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait before the next attempt: uniform in [0, bound] ("full jitter"), but never less
    /// than what the server asked for with `Retry-After`.
    pub fn delay(&self, failed: u32, retry_after: Option<Duration>) -> Duration {
        let bound = self.backoff_bound(failed);
        let jitter = Duration::from_secs_f64(bound.as_secs_f64() * rand::random::<f64>());
        retry_after.map_or(jitter, |ra| ra.max(jitter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_map_as_design_says() {
        assert_eq!(
            ToolPolicy::from_annotations(Some(true), None).class,
            ToolClass::Read
        );
        assert_eq!(
            ToolPolicy::from_annotations(Some(true), Some(true)).class,
            ToolClass::Read
        );
        assert_eq!(
            ToolPolicy::from_annotations(Some(false), Some(true)).class,
            ToolClass::Idempotent
        );
        assert_eq!(
            ToolPolicy::from_annotations(None, None).class,
            ToolClass::Effect
        );
        assert_eq!(
            ToolPolicy::from_annotations(Some(false), Some(false)).class,
            ToolClass::Effect
        );
    }

    #[test]
    fn unknown_tools_are_effects() {
        let mut p = ToolPolicies::default();
        p.set("get_balance", ToolPolicy::read());
        assert_eq!(p.get("get_balance").class, ToolClass::Read);
        assert_eq!(p.get("launch_rocket").class, ToolClass::Effect);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_honours_retry_after() {
        let p = RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(350),
            ..RetryPolicy::default()
        };
        let bounds: Vec<u128> = (1..=5).map(|n| p.backoff_bound(n).as_millis()).collect();
        assert_eq!(bounds, vec![100, 200, 350, 350, 350]);
        for n in 1..=5 {
            for _ in 0..100 {
                assert!(p.delay(n, None) <= p.backoff_bound(n));
                assert!(p.delay(n, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
            }
        }
        assert_eq!(p.backoff_bound(200), Duration::from_millis(350));
    }
}
