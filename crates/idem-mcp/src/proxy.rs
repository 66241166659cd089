//! [`Proxy`]: what the proxy interprets of the protocol, whatever carries the messages
//! ([design §8](docs/design.md#8-mcp)).
//!
//! The transports ([`crate::stdio`], [`crate::http`]) relay every message as the bytes it came
//! in, both ways: notifications (progress, logging, list changes, resource updates),
//! server-to-client requests (sampling, elicitation, roots) and their answers, cancellations,
//! and methods and members of protocol versions newer than this code. They hand the proxy
//! only:
//!
//! - `tools/list` results: each tool is classified ([`crate::policy`]), and each effect tool's
//!   input schema gets or loses the `idempotency_key` property ([`crate::schema`]); every other
//!   member stays;
//! - `tools/call` requests of effect tools: deduplicated through the [`Guard`]; the stored
//!   result is the upstream's raw JSON result;
//! - `initialize` requests and `server/discover` results, so that only protocol versions this
//!   code relays faithfully are negotiated ([`KNOWN_VERSIONS`]).
//!
//! Each client connection (over HTTP, each session) has its own upstream connection or
//! session, so the client's capabilities, progress tokens and request ids reach the upstream
//! as they are; the proxy's own requests (an effect call forwarded, a `tools/list` to classify
//! a tool it was never shown) carry ids of their own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::{Fingerprint, Key, Outcome, ProblemType, Scope, Store, ToolClass};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::call::{Forwarded, Guard, Reply, raw, refusal};
use crate::policy::{KeySource, Policies};
use crate::schema::{KEY_ARG, KeyArg, declares_key, present, take_key};

/// The protocol versions whose `tools/list` and `tools/call` this code reads correctly; a
/// newer one is not negotiated through the proxy.
pub const KNOWN_VERSIONS: &[&str] = &[
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// What the proxy knows of one upstream tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// Its class.
    pub class: ToolClass,
    /// Whether its own schema declares `idempotency_key`.
    pub declares_key: bool,
}

/// The protocol the proxy interprets, shared by every connection.
#[derive(Debug)]
pub struct Proxy<S> {
    guard: Guard<S>,
    policies: Arc<Policies>,
    tools: Arc<RwLock<HashMap<String, Known>>>,
    /// When the upstream's tool list was last read.
    listed_at: Arc<RwLock<Option<Instant>>>,
}

impl<S: Clone> Clone for Proxy<S> {
    fn clone(&self) -> Self {
        Proxy {
            guard: self.guard.clone(),
            policies: self.policies.clone(),
            tools: self.tools.clone(),
            listed_at: self.listed_at.clone(),
        }
    }
}

/// How long a tool classed read or idempotent is passed through on what the last
/// `tools/list` said. Past it the list is read again first: an upstream redeployed with a
/// tool that now has side effects must not have it pass through without a key for long.
const TRUST_LISTING: Duration = Duration::from_secs(10);

impl<S: Store + Clone> Proxy<S> {
    /// A proxy keeping keys in `store`.
    pub fn new(store: S, policies: Policies) -> Self {
        Proxy {
            guard: Guard::new(store),
            policies: Arc::new(policies),
            tools: Arc::default(),
            listed_at: Arc::default(),
        }
    }

    /// Runs the handling of a `tools/call` as a task the drain waits for ([`Guard::track`]).
    pub fn track<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.guard.track(work)
    }

    /// Waits, at most `grace`, for effect calls still executing (see [`Guard::drain`]).
    pub async fn drain(&self, grace: Duration) {
        let left = self.guard.drain(grace).await;
        if left > 0 {
            tracing::warn!(
                left,
                "tool calls still running at shutdown; their keys will read as abandoned"
            );
        }
    }

    /// The result of `method` as the client should see it, when the proxy rewrites that
    /// method's results (`tools/list`, `server/discover`); `None` to relay it unchanged.
    pub fn rewrite_result(&self, method: &str, result: &RawValue) -> Option<Box<RawValue>> {
        let mut v: Value = serde_json::from_str(result.get()).ok()?;
        match method {
            "tools/list" => {
                let tools = v.get_mut("tools")?.as_array_mut()?;
                self.learn(tools, false);
                for tool in tools.iter_mut() {
                    let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
                    if self.policies.classify(tool) == ToolClass::Effect {
                        let source = self.policies.for_tool(name).key;
                        present(tool, source);
                    }
                }
            }
            "server/discover" => {
                let versions = v.get_mut("supportedVersions")?.as_array_mut()?;
                versions.retain(|v| v.as_str().is_some_and(|v| KNOWN_VERSIONS.contains(&v)));
            }
            _ => return None,
        }
        Some(raw(&v))
    }

    /// An `initialize` request's params with a protocol version newer than this code replaced
    /// by the newest it knows (the upstream then answers with that one or an older one);
    /// `None` to relay it unchanged.
    pub fn clamp_initialize(&self, params: &RawValue) -> Option<Value> {
        let mut v: Value = serde_json::from_str(params.get()).ok()?;
        let asked = v.get("protocolVersion")?.as_str()?;
        let latest = KNOWN_VERSIONS.last().copied().unwrap_or_default();
        if KNOWN_VERSIONS.contains(&asked) || asked < latest {
            return None;
        }
        v["protocolVersion"] = Value::String(latest.to_owned());
        Some(v)
    }

    /// Remembers the class of each listed tool; `whole` when this is the upstream's whole list
    /// (a tool not in it is forgotten, so it counts as an effect from now on).
    fn learn(&self, tools: &[Value], whole: bool) {
        *self.listed_at.write().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let mut known = self.tools.write().unwrap_or_else(|p| p.into_inner());
        if whole {
            known.clear();
        }
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            known.insert(
                name.to_owned(),
                Known {
                    class: self.policies.classify(tool),
                    declares_key: declares_key(tool),
                },
            );
        }
    }

    /// What is known of `name`, asking the upstream (`list` reads one page of `tools/list`
    /// at a cursor) when a client calls a tool it never listed. A tool classed an effect is
    /// trusted as long as it is known (the safe direction); one that would pass through is
    /// trusted only on a recent listing.
    pub async fn known<F, Fut>(&self, name: &str, list: F) -> Known
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<Value, String>>,
    {
        if let Some(k) = self.lookup(name) {
            let recent = self
                .listed_at
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|at| at.elapsed() < TRUST_LISTING);
            if k.class == ToolClass::Effect || recent {
                return k;
            }
        }
        let mut all = Vec::new();
        let mut cursor = None;
        let listed = loop {
            match list(cursor.take()).await {
                Ok(page) => {
                    if let Some(tools) = page.get("tools").and_then(Value::as_array) {
                        all.extend(tools.iter().cloned());
                    }
                    match page.get("nextCursor").and_then(Value::as_str) {
                        Some(c) if all.len() < 100_000 => cursor = Some(c.to_owned()),
                        _ => break true,
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the upstream's tools");
                    break false;
                }
            }
        };
        if listed {
            self.learn(&all, true);
        }
        // A tool the upstream does not list is an effect
        // ([design §7](docs/design.md#7-the-runtime-side)): fail closed.
        self.lookup(name).unwrap_or(Known {
            class: self
                .policies
                .class_override(name)
                .unwrap_or(ToolClass::Effect),
            declares_key: false,
        })
    }

    fn lookup(&self, name: &str) -> Option<Known> {
        let known = self.tools.read().unwrap_or_else(|p| p.into_inner());
        known.get(name).copied()
    }

    /// One `tools/call` of an effect tool: reads its key, and runs `forward` (which sends the
    /// edited params upstream and waits at most the given time for the answer) at most once
    /// for it, or answers what the store holds.
    pub async fn call_effect<F, Fut>(
        &self,
        mut params: Map<String, Value>,
        scope: Scope,
        known: Known,
        forward: F,
    ) -> Reply
    where
        F: FnOnce(Map<String, Value>, Duration) -> Fut + Send + 'static,
        Fut: Future<Output = Forwarded> + Send + 'static,
    {
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let policy = self.policies.for_tool(&tool).clone();
        let (key, args) = take_key(&mut params, policy.key, known.declares_key);
        let key = match key {
            KeyArg::Present(k) => match Key::new(k) {
                Ok(k) => k,
                Err(e) => return Ok(invalid_key(&tool, &e.to_string())),
            },
            KeyArg::Invalid(why) => return Ok(invalid_key(&tool, &why)),
            KeyArg::Missing => match policy.key {
                KeySource::Model => return Ok(missing(model_missing(&tool))),
                KeySource::Runtime => return Ok(missing(runtime_missing(&tool))),
                KeySource::Derived => match derived(&scope, &tool, &args, policy.derive_window) {
                    Ok(k) => k,
                    Err(why) => return Ok(invalid_key(&tool, &why)),
                },
            },
        };
        let fingerprint = Fingerprint::json_call(&tool, &Value::Object(args));
        let timeout = policy.upstream_timeout;
        self.guard
            .call(&tool, scope, key, fingerprint, &policy, move || {
                forward(params, timeout)
            })
            .await
    }
}

/// The key of a call from a client that sends none: `idem/v1` over (scope, tool, arguments)
/// with the number of the `window` it falls in as the ordinal. Identical calls in one window
/// are one intent; a retry that crosses into the next window is a new one.
fn derived(
    scope: &Scope,
    tool: &str,
    args: &Map<String, Value>,
    window: Duration,
) -> Result<Key, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let ordinal = u64::try_from(now / window.as_millis().max(1)).unwrap_or(u64::MAX);
    idem_keys::derive(
        scope.as_str(),
        tool,
        &Value::Object(args.clone()),
        ordinal,
        None,
    )
    .map_err(|e| e.to_string())
}

fn missing(text: String) -> Box<RawValue> {
    Outcome::Missing.count();
    refusal(ProblemType::KeyMissing, text)
}

fn model_missing(tool: &str) -> String {
    format!(
        "{tool} has side effects, so it needs an {KEY_ARG} argument naming this intent; it \
         was not run. Call it again with {KEY_ARG} set (for example a turn id plus the tool \
         name), and pass the same value on every retry of this intent."
    )
}

fn runtime_missing(tool: &str) -> String {
    format!(
        "{tool} was not run: it has side effects, and its idempotency key must come from the \
         agent runtime (in the request's _meta.idempotency_key), which sent none. Calling it \
         again will not help and there is no argument to add; tell the user that {tool} \
         cannot run until the runtime passes a key."
    )
}

fn invalid_key(tool: &str, why: &str) -> Box<RawValue> {
    Outcome::Invalid.count();
    refusal(
        ProblemType::KeyInvalid,
        format!(
            "The {KEY_ARG} is not usable: {why}. {tool} was not run. Use 1 to 255 visible ASCII \
             characters (no spaces), the same on every retry of this intent."
        ),
    )
}

#[cfg(test)]
mod tests {
    use idem_core::MemoryStore;
    use serde_json::json;

    use super::*;

    fn proxy(policy: &str) -> Proxy<MemoryStore> {
        Proxy::new(MemoryStore::new(), Policies::parse(policy).expect("policy"))
    }

    #[test]
    fn tools_list_keeps_what_it_does_not_know() {
        let p = proxy("[tools.send_email]\nkey = \"runtime\"");
        let listed = raw(&json!({
            "tools": [
                {"name": "charge_card", "inputSchema": {"type": "object"}, "x-new": 1},
                {"name": "send_email", "inputSchema": {"type": "object", "properties": {"idempotency_key": {}}}},
                {"name": "get_balance", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}},
            ],
            "resultType": "complete", "ttlMs": 0, "cacheScope": "private", "nextCursor": "c2",
        }));
        let out: Value = serde_json::from_str(
            p.rewrite_result("tools/list", &listed)
                .expect("rewritten")
                .get(),
        )
        .expect("json");
        assert_eq!(out["resultType"], "complete");
        assert_eq!(out["ttlMs"], 0);
        assert_eq!(out["cacheScope"], "private");
        assert_eq!(out["nextCursor"], "c2");
        assert_eq!(out["tools"][0]["x-new"], 1);
        assert_eq!(out["tools"][0]["inputSchema"]["required"], json!([KEY_ARG]));
        assert_eq!(out["tools"][1]["inputSchema"]["properties"], json!({}));
        assert_eq!(out["tools"][2]["inputSchema"], json!({"type": "object"}));
        assert!(p.rewrite_result("prompts/list", &listed).is_none());
    }

    #[test]
    fn only_known_versions_are_negotiated() {
        let p = proxy("");
        let newer = raw(&json!({"protocolVersion": "2099-01-01", "capabilities": {"x": {}}}));
        assert_eq!(
            p.clamp_initialize(&newer),
            Some(json!({"protocolVersion": "2026-07-28", "capabilities": {"x": {}}}))
        );
        assert_eq!(
            p.clamp_initialize(&raw(&json!({"protocolVersion": "2025-06-18"}))),
            None
        );
        let discover = raw(&json!({"supportedVersions": ["2026-07-28", "2099-01-01"], "x": 1}));
        let out: Value = serde_json::from_str(
            p.rewrite_result("server/discover", &discover)
                .expect("rewritten")
                .get(),
        )
        .expect("json");
        assert_eq!(out, json!({"supportedVersions": ["2026-07-28"], "x": 1}));
    }

    async fn call(
        p: &Proxy<MemoryStore>,
        params: Value,
        runs: &Arc<std::sync::atomic::AtomicU32>,
    ) -> Value {
        let Value::Object(params) = params else {
            panic!()
        };
        let runs = runs.clone();
        let known = Known {
            class: ToolClass::Effect,
            declares_key: false,
        };
        let reply = p
            .call_effect(
                params,
                Scope::new("mcp").expect("scope"),
                known,
                move |sent, _| async move {
                    let n = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    Forwarded::Result(raw(
                        &json!({"content": [], "sent": Value::Object(sent), "n": n}),
                    ))
                },
            )
            .await;
        match reply {
            Ok(v) | Err(v) => serde_json::from_str(v.get()).expect("json"),
        }
    }

    #[tokio::test]
    async fn key_sources() {
        let p = proxy(
            "[tools.r]\nkey = \"runtime\"\n[tools.d]\nkey = \"derived\"\nderive_window = \"1h\"",
        );
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        // The model retries with a new key of its own; the runtime's key is the same: one run.
        let first = call(&p, json!({"name": "m", "arguments": {"a": 1, "idempotency_key": "model-1"}, "_meta": {"idempotency_key": "rt-1"}}), &runs).await;
        assert_eq!(first["sent"], json!({"name": "m", "arguments": {"a": 1}}));
        let retry = call(&p, json!({"name": "m", "arguments": {"a": 1, "idempotency_key": "model-2"}, "_meta": {"idempotency_key": "rt-1"}}), &runs).await;
        assert_eq!(retry["_meta"]["idem"]["key"], "rt-1");
        // runtime: no runtime key is refused, and the model's argument does not count.
        let refused = call(
            &p,
            json!({"name": "r", "arguments": {"idempotency_key": "mine"}}),
            &runs,
        )
        .await;
        assert_eq!(refused["_meta"]["idem"]["problem"], "key-missing");
        assert!(
            refused["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("runtime"))
        );
        // derived: two identical calls in one window are one.
        let d1 = call(&p, json!({"name": "d", "arguments": {"to": "x"}}), &runs).await;
        let d2 = call(&p, json!({"name": "d", "arguments": {"to": "x"}}), &runs).await;
        assert_eq!(d2["_meta"]["idem"]["replayed"], true);
        assert_eq!(d1["n"], d2["n"]);
        let d3 = call(&p, json!({"name": "d", "arguments": {"to": "y"}}), &runs).await;
        assert!(d3.get("_meta").is_none());
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
