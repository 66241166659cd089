//! Which tools need a key, and how their keys behave: classification from MCP annotations
//! ([design §7](docs/design.md#7-the-runtime-side)) with per-tool overrides from a TOML file.
//!
//! ```toml
//! scope = "mcp"              # the scope of stdio callers ([design §8](docs/design.md#8-mcp));
//! default "mcp" scope_headers = ["authorization"]   # over HTTP: the headers naming the caller
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
use idem_core::{AbandonedPolicy, DEFAULT_RETENTION, Policy, ToolClass};
use rmcp::model::Tool;
use serde::Deserialize;

/// The scope of stdio callers when nothing configures one.
pub const DEFAULT_SCOPE: &str = "mcp";

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
    /// Overrides the annotations (refused in `[defaults]`).
    pub class: Option<ToolClass>,
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
    pub on_unknown: Option<AbandonedPolicy>,
    /// How long a forwarded call may take before its outcome counts as unknown.
    #[serde(default, with = "humantime_serde")]
    pub upstream_timeout: Option<Duration>,
}

/// How the proxy treats one effect tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Lease, retention, unknown-outcome policy, how long a duplicate of an in-flight call
    /// waits before it gets a conflict, stored-size bound.
    pub engine: Policy,
    /// How long a forwarded call may take before its outcome counts as unknown.
    pub upstream_timeout: Duration,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy {
            engine: Policy {
                retention: DEFAULT_RETENTION,
                on_abandoned: AbandonedPolicy::Reject,
                wait: Some(Duration::from_secs(10)),
                // Tool results have no HTTP status; nothing is "not processed" by status.
                release_statuses: Vec::new(),
                ..Policy::default()
            },
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
            self.engine.wait = Some(w);
        }
        if let Some(t) = f.upstream_timeout {
            self.upstream_timeout = t;
        }
        if let Some(o) = f.on_unknown {
            self.engine.on_abandoned = o;
        }
    }
}

/// The validated policy of every tool.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    defaults: ToolPolicy,
    tools: BTreeMap<String, (Option<ToolClass>, ToolPolicy)>,
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
        let mut defaults = ToolPolicy::default();
        defaults.apply(&file.defaults);
        defaults.validate().context("in [defaults]")?;
        let tools = file
            .tools
            .into_iter()
            .map(|(name, f)| {
                let mut p = defaults.clone();
                p.apply(&f);
                p.validate().with_context(|| format!("in [tools.{name}]"))?;
                Ok((name, (f.class, p)))
            })
            .collect::<Result<_>>()?;
        Ok(Policies {
            defaults,
            tools,
            scope: file.scope,
            scope_headers: file.scope_headers,
        })
    }

    /// The class of `tool`: the file's word if it has one, else the annotations'.
    pub fn classify(&self, tool: &Tool) -> ToolClass {
        self.class_override(&tool.name).unwrap_or_else(|| {
            let hints = tool.annotations.as_ref();
            ToolClass::from_annotations(
                hints.and_then(|a| a.read_only_hint),
                hints.and_then(|a| a.idempotent_hint),
            )
        })
    }

    /// The class the file gives the tool `name`, if any.
    pub fn class_override(&self, name: &str) -> Option<ToolClass> {
        self.tools.get(name).and_then(|(c, _)| *c)
    }

    /// The policy of the tool `name`.
    pub fn for_tool(&self, name: &str) -> &ToolPolicy {
        self.tools.get(name).map_or(&self.defaults, |(_, p)| p)
    }
}

impl ToolPolicy {
    /// Refuses settings that would let one key run twice or never replay, in the words the
    /// gateway uses for the same values ([`Policy::validate`]).
    fn validate(&self) -> Result<()> {
        self.engine.validate()?;
        Policy::validate_upstream_timeout(self.upstream_timeout)?;
        Ok(())
    }
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
        assert_eq!(p.classify(&tool("a", Some(read))), ToolClass::Read);
        assert_eq!(p.classify(&tool("b", Some(idem))), ToolClass::Idempotent);
        assert_eq!(p.classify(&tool("c", Some(both))), ToolClass::Read);
        assert_eq!(p.classify(&tool("d", Some(additive))), ToolClass::Effect);
        assert_eq!(p.classify(&tool("e", None)), ToolClass::Effect);
        let not_read = ToolAnnotations::new().read_only(false).idempotent(false);
        assert_eq!(p.classify(&tool("f", Some(not_read))), ToolClass::Effect);
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
            ToolClass::Effect
        );
        assert_eq!(p.classify(&tool("other", Some(read))), ToolClass::Read);
        let charge = p.for_tool("charge_card");
        assert_eq!(charge.engine.retention, Duration::from_secs(7 * 86400));
        assert_eq!(charge.engine.on_abandoned, AbandonedPolicy::Retry);
        assert_eq!(charge.engine.wait, Some(Duration::from_secs(2)));
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
