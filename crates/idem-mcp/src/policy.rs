//! Which tools need a key, and how their keys behave: classification from MCP annotations
//! ([design §7](docs/design.md#7-the-runtime-side)) with per-tool overrides from a TOML file.
//!
//! ```toml
//! scope = "mcp"              # the scope of stdio callers ([design §8](docs/design.md#8-mcp))
//! scope_headers = ["authorization"]   # over HTTP: the headers naming the caller (default: idem serve's)
//! scope_cookies = ["session"]          # over HTTP: only these cookies name the caller
//! anonymous = "refuse"                 # over HTTP: an effect call naming no caller is refused; or "allow"
//!
//! [defaults]                 # every effect tool, unless its own table says otherwise
//! key = "model"              # where keys come from: "model", "runtime" or "derived"
//! derive_window = "60s"      # key = "derived": identical calls this close are one
//! keep_errors = false        # true: replay isError results and JSON-RPC errors too
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
use idem_core::{AbandonedPolicy, Anonymous, DEFAULT_RETENTION, Policy, ToolClass};
use serde::Deserialize;
use serde_json::Value;

/// The scope of stdio callers when nothing configures one.
pub const DEFAULT_SCOPE: &str = "mcp";

/// The file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// The scope label of stdio callers.
    pub scope: Option<String>,
    /// Headers naming an HTTP caller (default: `idem serve`'s, `ScopeHeaders::default`).
    pub scope_headers: Option<Vec<String>>,
    /// Over HTTP: the cookies that name a caller, where the `Cookie` header is a scope header
    /// (default: the whole header).
    pub scope_cookies: Option<Vec<String>>,
    /// Over HTTP: what an effect call from a caller naming no one gets (default: refused).
    pub anonymous: Option<Anonymous>,
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
    /// Where the tool's keys come from.
    pub key: Option<KeySource>,
    /// With `key = "derived"`: the window within which identical calls are one.
    #[serde(default, with = "humantime_serde")]
    pub derive_window: Option<Duration>,
    /// Keep (and replay) error answers instead of releasing the key.
    pub keep_errors: Option<bool>,
}

/// Where an effect tool's keys come from ([design §8](docs/design.md#8-mcp)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeySource {
    /// The model passes `idempotency_key` as an argument (a runtime's key in `_meta` still
    /// wins): the schema asks the model for it.
    #[default]
    Model,
    /// Only the runtime's key in `_meta` counts: the argument is hidden from the model, and a
    /// call without a runtime key is refused.
    Runtime,
    /// A client that sends no key gets one derived from (scope, tool, arguments) and the time
    /// window: identical calls within the window are one intent.
    Derived,
}

/// How the proxy treats one effect tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Lease, retention, unknown-outcome policy, how long a duplicate of an in-flight call
    /// waits before it gets a conflict, stored-size bound.
    pub engine: Policy,
    /// How long a forwarded call may take before its outcome counts as unknown.
    pub upstream_timeout: Duration,
    /// Where keys come from.
    pub key: KeySource,
    /// The derivation window of `KeySource::Derived`.
    pub derive_window: Duration,
    /// Whether error answers are kept (replayed) rather than released.
    pub keep_errors: bool,
}

/// The status a stored tool error result (`isError: true`) is kept under.
pub const TOOL_ERROR: u16 = 422;
/// The status a stored JSON-RPC error from the upstream is kept under.
pub const RPC_ERROR: u16 = 500;

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy {
            engine: Policy {
                retention: DEFAULT_RETENTION,
                on_abandoned: AbandonedPolicy::Reject,
                wait: Some(Duration::from_secs(10)),
                // Error answers are stored under these statuses: released unless the tool
                // keeps errors ([design §4](docs/design.md#4-which-results-are-kept)).
                release_statuses: vec![TOOL_ERROR, RPC_ERROR],
                ..Policy::default()
            },
            upstream_timeout: Duration::from_secs(300),
            key: KeySource::Model,
            derive_window: Duration::from_secs(60),
            keep_errors: false,
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
        if let Some(k) = f.key {
            self.key = k;
        }
        if let Some(w) = f.derive_window {
            self.derive_window = w;
        }
        if let Some(k) = f.keep_errors {
            self.keep_errors = k;
            self.engine.release_statuses = if k {
                Vec::new()
            } else {
                vec![TOOL_ERROR, RPC_ERROR]
            };
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
    /// The HTTP scope cookies from the file, if it set them.
    pub scope_cookies: Option<Vec<String>>,
    /// What an HTTP effect call naming no caller gets, if the file says.
    pub anonymous: Option<Anonymous>,
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
            scope_cookies: file.scope_cookies,
            anonymous: file.anonymous,
        })
    }

    /// The class of a tool as `tools/list` describes it (raw JSON): the file's word if it
    /// has one, else the annotations'.
    pub fn classify(&self, tool: &Value) -> ToolClass {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        self.class_override(name).unwrap_or_else(|| {
            let hint = |h: &str| {
                tool.get("annotations")
                    .and_then(|a| a.get(h))
                    .and_then(Value::as_bool)
            };
            ToolClass::from_annotations(hint("readOnlyHint"), hint("idempotentHint"))
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
        if self.derive_window.is_zero() {
            anyhow::bail!("derive_window must be more than 0s");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &'static str, annotations: Option<Value>) -> Value {
        match annotations {
            Some(a) => json!({"name": name, "inputSchema": {}, "annotations": a}),
            None => json!({"name": name, "inputSchema": {}}),
        }
    }

    #[test]
    fn annotations_classify_and_unknown_means_effect() {
        let p = Policies::default();
        let read = json!({"readOnlyHint": true});
        let idem = json!({"idempotentHint": true});
        // readOnlyHint wins over idempotentHint; destructive=false alone is still an effect.
        let both = json!({"readOnlyHint": true, "idempotentHint": true});
        let additive = json!({"destructiveHint": false});
        assert_eq!(p.classify(&tool("a", Some(read))), ToolClass::Read);
        assert_eq!(p.classify(&tool("b", Some(idem))), ToolClass::Idempotent);
        assert_eq!(p.classify(&tool("c", Some(both))), ToolClass::Read);
        assert_eq!(p.classify(&tool("d", Some(additive))), ToolClass::Effect);
        assert_eq!(p.classify(&tool("e", None)), ToolClass::Effect);
        let not_read = json!({"readOnlyHint": false, "idempotentHint": false});
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
            key = "runtime"
            [tools.send_email]
            keep_errors = true
            key = "derived"
            derive_window = "5m"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let read = json!({"readOnlyHint": true});
        assert_eq!(
            p.classify(&tool("get_balance", Some(read.clone()))),
            ToolClass::Effect
        );
        assert_eq!(p.classify(&tool("other", Some(read))), ToolClass::Read);
        let charge = p.for_tool("charge_card");
        assert_eq!(charge.engine.retention, Duration::from_secs(7 * 86400));
        assert_eq!(charge.engine.on_abandoned, AbandonedPolicy::Retry);
        assert_eq!(charge.engine.wait, Some(Duration::from_secs(2)));
        assert_eq!(charge.key, KeySource::Runtime);
        assert_eq!(charge.engine.release_statuses, vec![TOOL_ERROR, RPC_ERROR]);
        let other = p.for_tool("send_email");
        assert_eq!(other.engine.retention, Duration::from_secs(3600));
        assert_eq!(other.engine.on_abandoned, AbandonedPolicy::Reject);
        assert_eq!(other.key, KeySource::Derived);
        assert_eq!(other.derive_window, Duration::from_secs(300));
        assert!(other.keep_errors && other.engine.release_statuses.is_empty());
        assert_eq!(p.for_tool("x").key, KeySource::Model);
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
            "[defaults]\nderive_window = \"0s\"",
            "[tools.x]\nkey = \"llm\"",
        ] {
            assert!(Policies::parse(bad).is_err(), "{bad}");
        }
        assert!(Policies::parse("[tools.x]\nretentoin = \"1h\"").is_err());
    }
}
