//! Which tools need a key, and how their keys behave: classification from MCP annotations
//! (DESIGN §7) with per-tool overrides from a TOML file.
//!
//! ```toml
//! scope = "mcp"              # the scope of stdio callers (DESIGN §8); default "mcp"
//! scope_headers = ["authorization"]   # over HTTP: the headers naming the caller
//!
//! [defaults]                 # every effect tool, unless its own table says otherwise
//! retention = "24h"          # how long a result is replayed, from completion
//! lease = "30s"              # how long a crashed proxy blocks a key
//! wait = "10s"               # a duplicate of a call in flight waits this long, then conflict
//! on_unknown = "reject"      # or "retry": what a retry of an outcome-unknown call does
//! upstream_timeout = "300s"  # sent but no answer by then: outcome unknown
//!
//! [tools.charge_card]
//! class = "effect"           # "read", "idempotent" or "effect"; overrides the annotations
//! retention = "7d"
//! on_unknown = "reject"
//! ```
//!
//! Annotations are hints from the server, and the proxy runs in the server's own trust domain,
//! so it believes them; the file exists for servers whose annotations are missing or wrong.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use idem_core::{AbandonedPolicy, DEFAULT_RETENTION, Policy};
use rmcp::model::Tool;
use serde::Deserialize;

/// The scope of stdio callers when nothing configures one.
pub const DEFAULT_SCOPE: &str = "mcp";

/// What kind of tool this is (DESIGN §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Changes nothing: passes through, no key.
    Read,
    /// Naturally safe to repeat: passes through, no key.
    Idempotent,
    /// A side effect: a key is required and a repeat replays the first result.
    Effect,
}

impl Class {
    /// From the tool's annotations: `readOnlyHint` makes it a read, `idempotentHint` an
    /// idempotent tool, and anything else (including no annotations) an effect.
    pub fn from_annotations(tool: &Tool) -> Self {
        let hints = tool.annotations.as_ref();
        if hints.and_then(|a| a.read_only_hint) == Some(true) {
            Class::Read
        } else if hints.and_then(|a| a.idempotent_hint) == Some(true) {
            Class::Idempotent
        } else {
            Class::Effect
        }
    }

    /// The lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Idempotent => "idempotent",
            Class::Effect => "effect",
        }
    }
}

/// The file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// The scope label of stdio callers.
    pub scope: Option<String>,
    /// Headers naming an HTTP caller.
    pub scope_headers: Option<Vec<String>>,
    /// Settings of every effect tool.
    #[serde(default)]
    pub defaults: ToolFile,
    /// Per-tool overrides, by tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolFile>,
}

/// One tool's settings (or the defaults), as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFile {
    /// Overrides the annotations (ignored in `[defaults]`).
    pub class: Option<Class>,
    /// How long a completed result is replayed.
    #[serde(default, with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// How long a claim holds the key without a heartbeat.
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    /// How long a duplicate of an in-flight call waits for its result.
    #[serde(default, with = "humantime_serde")]
    pub wait: Option<Duration>,
    /// What a retry of a call whose outcome is unknown does.
    pub on_unknown: Option<OnUnknown>,
    /// How long a forwarded call may take before its outcome counts as unknown.
    #[serde(default, with = "humantime_serde")]
    pub upstream_timeout: Option<Duration>,
}

/// `on_unknown` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    /// Answer outcome-unknown until an operator resolves the key.
    Reject,
    /// Execute again (the upstream gets the same key in `idempotency_key` if it declares it).
    Retry,
}

/// How the proxy treats one effect tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Lease, retention, unknown-outcome policy, stored-size bound.
    pub engine: Policy,
    /// How long a duplicate of an in-flight call waits before it gets a conflict.
    pub wait: Duration,
    /// How long a forwarded call may take before its outcome counts as unknown.
    pub upstream_timeout: Duration,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy {
            engine: Policy {
                retention: DEFAULT_RETENTION,
                on_abandoned: AbandonedPolicy::Reject,
                // Tool results have no HTTP status; nothing is "not processed" by status.
                release_statuses: Vec::new(),
                ..Policy::default()
            },
            wait: Duration::from_secs(10),
            upstream_timeout: Duration::from_secs(300),
        }
    }
}

impl ToolPolicy {
    fn apply(&mut self, f: &ToolFile) {
        if let Some(r) = f.retention {
            self.engine.retention = r;
        }
        if let Some(l) = f.lease {
            self.engine.lease = l;
        }
        if let Some(w) = f.wait {
            self.wait = w;
        }
        if let Some(t) = f.upstream_timeout {
            self.upstream_timeout = t;
        }
        if let Some(o) = f.on_unknown {
            self.engine.on_abandoned = match o {
                OnUnknown::Reject => AbandonedPolicy::Reject,
                OnUnknown::Retry => AbandonedPolicy::Retry,
            };
        }
    }
}

/// The validated policy of every tool.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    defaults: ToolPolicy,
    tools: BTreeMap<String, (Option<Class>, ToolPolicy)>,
    /// The scope label from the file, if it set one.
    pub scope: Option<String>,
    /// The HTTP scope headers from the file, if it set them.
    pub scope_headers: Option<Vec<String>>,
}

impl Policies {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the policy file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in the policy file {}", path.display()))
    }

    /// Validates a policy file's text.
    pub fn parse(text: &str) -> Result<Self> {
        let file: PolicyFile = toml::from_str(text)?;
        Self::from_file(file)
    }

    /// From a parsed file, refusing settings that would let one key run twice or never
    /// replay.
    pub fn from_file(file: PolicyFile) -> Result<Self> {
        if file.defaults.class.is_some() {
            anyhow::bail!(
                "[defaults] cannot set class: every tool would get it whatever it declares; \
                 set class per tool under [tools.NAME]"
            );
        }
        check(&file.defaults).context("in [defaults]")?;
        for (name, f) in &file.tools {
            check(f).with_context(|| format!("in [tools.{name}]"))?;
        }
        let mut defaults = ToolPolicy::default();
        defaults.apply(&file.defaults);
        let tools = file
            .tools
            .into_iter()
            .map(|(name, f)| {
                let mut p = defaults.clone();
                p.apply(&f);
                (name, (f.class, p))
            })
            .collect();
        Ok(Policies {
            defaults,
            tools,
            scope: file.scope,
            scope_headers: file.scope_headers,
        })
    }

    /// The class of `tool`: the file's word if it has one, else the annotations'.
    pub fn classify(&self, tool: &Tool) -> Class {
        self.class_override(&tool.name)
            .unwrap_or_else(|| Class::from_annotations(tool))
    }

    /// The class the file gives the tool `name`, if any.
    pub fn class_override(&self, name: &str) -> Option<Class> {
        self.tools.get(name).and_then(|(c, _)| *c)
    }

    /// The policy of the tool `name`.
    pub fn for_tool(&self, name: &str) -> &ToolPolicy {
        self.tools.get(name).map_or(&self.defaults, |(_, p)| p)
    }
}

/// The shortest lease: a claim must outlive a heartbeat's round trip to the store, or a
/// duplicate takes the key over while the first call still runs.
const MIN_LEASE: Duration = Duration::from_secs(1);

fn check(f: &ToolFile) -> Result<()> {
    if let Some(l) = f.lease
        && l < MIN_LEASE
    {
        anyhow::bail!(
            "lease {} is under {}: a duplicate would take the key over while the first call still runs",
            humantime::format_duration(l),
            humantime::format_duration(MIN_LEASE)
        );
    }
    if f.retention.is_some_and(|r| r.is_zero()) {
        anyhow::bail!("retention 0s keeps no result: a retry would run the tool again");
    }
    if f.upstream_timeout.is_some_and(|t| t.is_zero()) {
        anyhow::bail!("upstream_timeout 0s makes every call's outcome unknown");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rmcp::model::ToolAnnotations;

    use super::*;

    fn tool(name: &'static str, annotations: Option<ToolAnnotations>) -> Tool {
        let mut t = Tool::default();
        t.name = name.into();
        t.input_schema = Arc::new(serde_json::Map::new());
        t.annotations = annotations;
        t
    }

    #[test]
    fn annotations_classify_and_unknown_means_effect() {
        let p = Policies::default();
        let read = ToolAnnotations::new().read_only(true);
        let idem = ToolAnnotations::new().idempotent(true);
        // readOnlyHint wins over idempotentHint; destructive=false alone is still an effect.
        let both = ToolAnnotations::new().read_only(true).idempotent(true);
        let additive = ToolAnnotations::new().destructive(false);
        assert_eq!(p.classify(&tool("a", Some(read))), Class::Read);
        assert_eq!(p.classify(&tool("b", Some(idem))), Class::Idempotent);
        assert_eq!(p.classify(&tool("c", Some(both))), Class::Read);
        assert_eq!(p.classify(&tool("d", Some(additive))), Class::Effect);
        assert_eq!(p.classify(&tool("e", None)), Class::Effect);
        let not_read = ToolAnnotations::new().read_only(false).idempotent(false);
        assert_eq!(p.classify(&tool("f", Some(not_read))), Class::Effect);
    }

    #[test]
    fn the_file_overrides_annotations_and_defaults() {
        let p = Policies::parse(
            r#"
            scope = "agent-7"
            [defaults]
            retention = "1h"
            wait = "2s"
            [tools.get_balance]
            class = "effect"
            [tools.charge_card]
            retention = "7d"
            on_unknown = "retry"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let read = ToolAnnotations::new().read_only(true);
        assert_eq!(
            p.classify(&tool("get_balance", Some(read.clone()))),
            Class::Effect
        );
        assert_eq!(p.classify(&tool("other", Some(read))), Class::Read);
        let charge = p.for_tool("charge_card");
        assert_eq!(charge.engine.retention, Duration::from_secs(7 * 86400));
        assert_eq!(charge.engine.on_abandoned, AbandonedPolicy::Retry);
        assert_eq!(charge.wait, Duration::from_secs(2));
        let other = p.for_tool("send_email");
        assert_eq!(other.engine.retention, Duration::from_secs(3600));
        assert_eq!(other.engine.on_abandoned, AbandonedPolicy::Reject);
        assert_eq!(p.scope.as_deref(), Some("agent-7"));
    }

    #[test]
    fn mistakes_in_the_file_are_errors() {
        assert!(Policies::parse("[tools.x]\nclass = \"sometimes\"").is_err());
        assert!(Policies::parse("[tools.x]\nretention = \"soon\"").is_err());
        for bad in [
            "[defaults]\nlease = \"0s\"",
            "[tools.x]\nlease = \"500ms\"",
            "[tools.x]\nretention = \"0s\"",
            "[defaults]\nupstream_timeout = \"0s\"",
            "[defaults]\nclass = \"effect\"",
        ] {
            assert!(Policies::parse(bad).is_err(), "{bad}");
        }
        assert!(Policies::parse("[tools.x]\nretentoin = \"1h\"").is_err());
    }
}
