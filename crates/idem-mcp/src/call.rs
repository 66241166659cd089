//! One `tools/call` of an effect tool, over the [`Engine`]: the engine claims the key (and
//! waits for a duplicate in flight), this module forwards the call, says what it came to,
//! and maps the engine's answer to a `CallToolResult`
//! ([design §3](docs/design.md#3-what-a-request-with-a-key-gets) and [§8](docs/design.md#8-mcp),
//! without HTTP).
//!
//! Every refusal is a tool error result (`isError: true`) whose text tells the model what
//! happened and what to do, with a machine-readable `_meta.idem.problem` naming the same
//! problem types as the HTTP layer (`key-missing`, `key-reused`, `in-flight`, ...): a model
//! reads tool results, and a transport failure would make its runtime retry blindly.
//!
//! What is kept, and why ([design §4](docs/design.md#4-which-results-are-kept)):
//! - a result the upstream returned is kept and replayed as the upstream's raw JSON (members
//!   this code does not know included), marked `_meta.idem` on a replay;
//! - an error answer, a result with `isError: true` or a JSON-RPC error, is the tool saying it
//!   did not do what was asked: it releases the key, so the runtime's retry with the same key
//!   runs once the cause is fixed; a tool configured with `keep_errors = true` (one whose
//!   errors can follow a partial effect, or are final answers) keeps and replays them. The
//!   JSON-RPC errors that say the call was refused before the tool ran (parse error, invalid
//!   request, method not found, invalid params) release the key whatever the tool's setting;
//! - a result over the size bound is kept as its length and digest: the caller and every
//!   retry get `response-too-large`, nothing runs again;
//! - `resultType: "input_required"` (the server asks for input before it runs the tool) is
//!   relayed to the client and releases the key: the client's next call, with the input,
//!   claims it again;
//! - a transport failure after the call was sent (the connection closed, a timeout) marks the
//!   record abandoned: the effect may have happened, so a retry gets `outcome-unknown` (or
//!   re-executes, under `on_unknown = "retry"`), never a silent second run.
//!
//! # Cancel safety
//! The engine runs in a task of its own: a client that cancels the request or disconnects
//! drops only its wait for the answer. A call already forwarded finishes, its result is
//! stored, and a retry with the same key replays it instead of finding the key abandoned.

use std::future::Future;
use std::time::Duration;

use idem_core::{
    Answer, Effect, Engine, Fingerprint, Key, ProblemType, Scope, Store, StoredBody, StoredResponse,
};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio_util::task::TaskTracker;

use crate::policy::{RPC_ERROR, TOOL_ERROR, ToolPolicy};

/// The status a stored `CallToolResult` is kept under (the record format is HTTP-shaped).
const RESULT: u16 = 200;

/// What forwarding a call upstream came to.
#[derive(Debug)]
pub enum Forwarded {
    /// The upstream answered with a result (`isError` or not), as raw JSON.
    Result(Box<RawValue>),
    /// The upstream answered with a JSON-RPC error object, as raw JSON.
    Error(Box<RawValue>),
    /// The answer was over the size the proxy buffers: its length and SHA-256.
    TooLarge {
        /// Bytes.
        len: u64,
        /// SHA-256 of the message.
        sha256: [u8; 32],
    },
    /// Nothing reached the tool (the upstream was already gone): the key is released.
    NotSent(String),
    /// The call was sent and no answer came: the outcome is unknown.
    Lost(String),
}

/// What the client gets: a tool result, or a JSON-RPC error object (one the upstream gave),
/// as raw JSON.
pub type Reply = Result<Box<RawValue>, Box<RawValue>>;

/// Deduplicates effect tool calls over a store.
#[derive(Debug)]
pub struct Guard<S> {
    engine: Engine<S>,
    tasks: TaskTracker,
}

impl<S> Clone for Guard<S>
where
    S: Clone,
{
    fn clone(&self) -> Self {
        Guard {
            engine: self.engine.clone(),
            tasks: self.tasks.clone(),
        }
    }
}

/// The tool error result for a refusal: `text` for the model, `problem` for programs.
pub fn refusal(problem: ProblemType, text: impl Into<String>) -> Box<RawValue> {
    raw(&json!({
        "content": [{"type": "text", "text": text.into()}],
        "isError": true,
        "_meta": {"idem": {"problem": problem.name()}},
    }))
}

/// A value as raw JSON.
pub fn raw(v: &Value) -> Box<RawValue> {
    // Serialising a `Value` cannot fail, and its text is valid JSON.
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| {
        RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!())
    })
}

/// `_meta.idem.problem` of a reply, if it is a refusal.
pub fn problem_of(reply: &Reply) -> Option<String> {
    let r = reply.as_ref().ok()?;
    let v: Value = serde_json::from_str(r.get()).ok()?;
    v.get("_meta")?
        .get("idem")?
        .get("problem")?
        .as_str()
        .map(str::to_owned)
}

impl<S: Store + Clone> Guard<S> {
    /// A guard over `store`.
    pub fn new(store: S) -> Self {
        Guard {
            // A duplicate of a call running in another process re-reads the store this
            // often: tool calls are slower than HTTP requests, so less often than the layer.
            // No completed-record cache (design §9): a tool call's replay saves nothing worth
            // the record's `replays` count, which `idem inspect` shows as a replay's evidence.
            engine: Engine::new(store).with_poll_interval(Duration::from_millis(100)),
            tasks: TaskTracker::new(),
        }
    }

    /// Waits, at most `grace`, for the calls still executing to finish and be stored; returns
    /// how many were still running when it gave up. A proxy calls it when its client has gone
    /// (or on SIGTERM) before closing the upstream, so that a call already forwarded is kept
    /// and replayed rather than left abandoned.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
        self.tasks.len()
    }

    /// Runs `work` as a task that [`Guard::drain`] waits for: the handling of a call from the
    /// moment it is read, so that a shutdown right after a call arrives waits for it too,
    /// not only once it reaches [`Guard::call`].
    pub fn track<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(work)
    }

    /// Runs `forward` at most once for (scope, key) and `fingerprint`, or answers what the
    /// store holds. `tool` only names the tool in messages.
    pub async fn call<F, Fut>(
        &self,
        tool: &str,
        scope: Scope,
        key: Key,
        fingerprint: Fingerprint,
        policy: &ToolPolicy,
        forward: F,
    ) -> Reply
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Forwarded> + Send + 'static,
    {
        // The call's span (design §13): the tool's name goes with every log line of the engine
        // about this call, and the GenAI attributes and the outcome to a trace.
        let span = idem_core::span::request(idem_core::span::Call::Tool {
            name: tool,
            call_id: None,
        });
        let run = self.clone().run(
            tool.to_owned(),
            scope,
            key,
            fingerprint,
            policy.clone(),
            forward,
        );
        let task = self.tasks.spawn(tracing::Instrument::instrument(run, span));
        match task.await {
            Ok(reply) => reply,
            Err(e) => {
                tracing::error!(error = %e, tool, "tool call task failed; the key will read as abandoned");
                Err(raw(&json!({
                    "code": crate::rpc::INTERNAL_ERROR,
                    "message": "the idempotency proxy failed while handling this call",
                })))
            }
        }
    }

    async fn run<F, Fut>(
        self,
        tool: String,
        scope: Scope,
        key: Key,
        fingerprint: Fingerprint,
        policy: ToolPolicy,
        forward: F,
    ) -> Reply
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Forwarded> + Send + 'static,
    {
        let effect = move || async move { settle(forward().await) };
        let answer = self
            .engine
            .run(scope, key.clone(), fingerprint, &policy.engine, effect)
            .await;
        let Ok(answer) = answer else {
            return Ok(refusal(
                ProblemType::StoreUnavailable,
                format!(
                    "The idempotency store is unavailable, so {tool} was not run: without \
                     the store a retry could run it twice. Try again later with the same \
                     idempotency_key ({key})."
                ),
            ));
        };
        match answer {
            Answer::Executed {
                response, value, ..
            } => value.unwrap_or_else(|| decode(&response, &key, false)),
            Answer::NotSent(value) => value.unwrap_or_else(|| {
                Err(raw(&json!({
                    "code": crate::rpc::INTERNAL_ERROR,
                    "message": "the call was not sent",
                })))
            }),
            Answer::Unknown(value) => value.unwrap_or_else(|| Ok(unknown(&tool, &key, ""))),
            Answer::Replayed(record) => match &record.response {
                Some(r) => decode(r, &key, true),
                None => Ok(refusal(
                    ProblemType::StoreUnavailable,
                    "The stored result of this key could not be read.",
                )),
            },
            Answer::InFlight(_) => Ok(refusal(
                ProblemType::InFlight,
                format!(
                    "A call of {tool} with idempotency_key {key} is still running \
                     (waited {}s for it); it was not run a second time. Call again \
                     later with the same idempotency_key to get its result.",
                    policy.engine.wait.unwrap_or_default().as_secs()
                ),
            )),
            Answer::Mismatch(_) => Ok(refusal(
                ProblemType::KeyReused,
                format!(
                    "idempotency_key {key} was already used for a different call (another \
                     tool or other arguments); {tool} was not run. If this is a new \
                     intent, use a new idempotency_key; if it is a retry, send exactly \
                     the original arguments."
                ),
            )),
            Answer::Abandoned(_) => Ok(unknown(&tool, &key, " by an earlier attempt")),
        }
    }
}

fn unknown(tool: &str, key: &Key, by: &str) -> Box<RawValue> {
    refusal(
        ProblemType::OutcomeUnknown,
        format!(
            "The outcome of {tool} with idempotency_key {key} is unknown: it was sent to the \
             server{by} but no result came back. It was not run again, because that could repeat \
             its effect. Check whether it happened before acting on it; an operator can settle \
             the key with `idem inspect` and `idem resolve`."
        ),
    )
}

/// What the engine is told, and the reply for outcomes that are not stored.
fn settle(forwarded: Forwarded) -> (Effect, Option<Reply>) {
    match forwarded {
        Forwarded::Result(result) => {
            let head: ResultHead = serde_json::from_str(result.get()).unwrap_or_default();
            if head.result_type.as_deref() == Some("input_required") {
                // The tool did not run yet: the client answers and calls again.
                return (Effect::NotSent, Some(Ok(result)));
            }
            let status = if head.is_error == Some(true) {
                TOOL_ERROR
            } else {
                RESULT
            };
            (
                Effect::Done(stored(status, result.get().as_bytes().to_vec())),
                None,
            )
        }
        Forwarded::Error(e) if refused_before_running(&e) => (Effect::NotSent, Some(Err(e))),
        Forwarded::Error(e) => (
            Effect::Done(stored(RPC_ERROR, e.get().as_bytes().to_vec())),
            None,
        ),
        Forwarded::TooLarge { len, sha256 } => (
            Effect::Done(StoredResponse {
                status: RESULT,
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: StoredBody::Omitted { len, sha256 },
            }),
            None,
        ),
        Forwarded::NotSent(why) => (
            Effect::NotSent,
            Some(Ok(refusal(
                ProblemType::UpstreamUnavailable,
                format!(
                    "The MCP server behind the proxy is unavailable ({why}); nothing was run. Try again later with the same idempotency_key."
                ),
            ))),
        ),
        Forwarded::Lost(why) => {
            tracing::warn!(reason = %why, "forwarded call got no answer");
            (Effect::Unknown, None)
        }
    }
}

/// The members of a tool result the proxy reads.
#[derive(Debug, Default, serde::Deserialize)]
struct ResultHead {
    #[serde(rename = "isError", default)]
    is_error: Option<bool>,
    #[serde(rename = "resultType", default)]
    result_type: Option<String>,
}

/// JSON-RPC errors that mean the server refused the request before running the tool: parse
/// error, invalid request, method not found, invalid params.
fn refused_before_running(e: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(e.get())
        .is_ok_and(|c| [-32700, -32600, -32601, -32602].contains(&c.code))
}

fn stored(status: u16, body: Vec<u8>) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: StoredBody::Full(body.into()),
    }
}

/// The reply a stored response stands for; a replay carries `_meta.idem.replayed = true`.
fn decode(response: &StoredResponse, key: &Key, replayed: bool) -> Reply {
    let body = match &response.body {
        StoredBody::Full(b) => b,
        StoredBody::Omitted { len, .. } => {
            return Ok(refusal(
                ProblemType::ResponseTooLarge,
                format!(
                    "This call (idempotency_key {key}) ran, but its result was {len} bytes, \
                     over the size the proxy relays and stores, so only its digest was kept; \
                     it was not run again. Ask for a smaller result (a page, a summary) as a \
                     new intent with a new key."
                ),
            ));
        }
    };
    let unreadable = |e: serde_json::Error| {
        tracing::error!(error = %e, key = %key, "a stored tool result is unreadable");
        Ok(refusal(
            ProblemType::StoreUnavailable,
            format!(
                "The stored result of idempotency_key {key} could not be read; it was not run again."
            ),
        ))
    };
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(_) => {
            return unreadable(serde_json::Error::io(
                std::io::ErrorKind::InvalidData.into(),
            ));
        }
    };
    if response.status == RPC_ERROR {
        return match RawValue::from_string(text.to_owned()) {
            Ok(e) => Err(e),
            Err(e) => unreadable(e),
        };
    }
    if !replayed {
        return match RawValue::from_string(text.to_owned()) {
            Ok(r) => Ok(r),
            Err(e) => unreadable(e),
        };
    }
    match serde_json::from_str::<Value>(text) {
        Ok(mut result) => {
            if let Some(obj) = result.as_object_mut() {
                let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                if !meta.is_object() {
                    *meta = json!({});
                }
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(
                        "idem".into(),
                        json!({ "replayed": true, "key": key.as_str() }),
                    );
                }
            }
            Ok(raw(&result))
        }
        Err(e) => unreadable(e),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem_core::MemoryStore;

    use super::*;

    fn key(s: &str) -> Key {
        Key::new(s).expect("key")
    }

    fn problem(r: &Reply) -> Option<String> {
        problem_of(r)
    }

    fn value(r: &Reply) -> Value {
        match r {
            Ok(v) | Err(v) => serde_json::from_str(v.get()).expect("json"),
        }
    }

    fn result(v: Value) -> Forwarded {
        Forwarded::Result(raw(&v))
    }

    async fn charge(
        guard: &Guard<MemoryStore>,
        k: &str,
        args: u8,
        count: &Arc<AtomicU32>,
        answer: fn(u32) -> Forwarded,
    ) -> Reply {
        let count = count.clone();
        guard
            .call(
                "charge_card",
                Scope::new("mcp").expect("scope"),
                key(k),
                Fingerprint::json_call("charge_card", &json!({ "n": args })),
                &ToolPolicy::default(),
                move || async move { answer(count.fetch_add(1, Ordering::SeqCst) + 1) },
            )
            .await
    }

    fn ok(n: u32) -> Forwarded {
        result(
            json!({"content": [{"type": "text", "text": format!("ch_{n}")}], "resultType": "complete", "x-new": {"n": n}}),
        )
    }

    #[tokio::test]
    async fn one_run_per_key_and_the_replay_is_marked() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let first = charge(&guard, "k", 1, &count, ok).await;
        // The first caller gets the upstream's bytes as they came.
        let sent = ok(1);
        let Forwarded::Result(sent) = sent else {
            panic!()
        };
        assert_eq!(first.as_ref().map(|r| r.get()).ok(), Some(sent.get()));
        let again = value(&charge(&guard, "k", 1, &count, ok).await);
        // The replay is the same result, unknown members included, plus the marker.
        let mut want = value(&first);
        want["_meta"] = json!({"idem": {"replayed": true, "key": "k"}});
        assert_eq!(again, want);
        let other = charge(&guard, "k", 2, &count, ok).await;
        assert_eq!(problem(&other).as_deref(), Some("key-reused"));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    fn tool_error(_: u32) -> Forwarded {
        result(json!({"content": [{"type": "text", "text": "SMTP down"}], "isError": true}))
    }

    fn rpc_error(code: i64) -> Forwarded {
        Forwarded::Error(raw(&json!({"code": code, "message": "boom"})))
    }

    #[tokio::test]
    async fn error_answers_release_the_key_unless_the_tool_keeps_them() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let failed = charge(&guard, "e", 1, &count, tool_error).await;
        assert_eq!(value(&failed)["isError"], true);
        // Released: the retry runs, once the cause is fixed, and its result is kept.
        let retry = charge(&guard, "e", 1, &count, ok).await;
        assert_eq!(value(&retry)["content"][0]["text"], "ch_2");
        let replay = charge(&guard, "e", 1, &count, ok).await;
        assert_eq!(value(&replay)["_meta"]["idem"]["replayed"], true);
        // A JSON-RPC error from the tool releases too; a validation error always does.
        assert!(
            charge(&guard, "i", 1, &count, |_| rpc_error(-32603))
                .await
                .is_err()
        );
        assert!(charge(&guard, "i", 1, &count, ok).await.is_ok());
        assert!(
            charge(&guard, "v", 1, &count, |_| rpc_error(-32602))
                .await
                .is_err()
        );
        assert!(charge(&guard, "v", 1, &count, ok).await.is_ok());
        assert_eq!(count.load(Ordering::SeqCst), 6);

        // keep_errors = true: both kinds are replayed, nothing runs again.
        let keep = crate::Policies::parse("[defaults]\nkeep_errors = true").expect("policy");
        let keep = keep.for_tool("charge_card").clone();
        let count = Arc::new(AtomicU32::new(0));
        let run = |k: &'static str, answer: fn(u32) -> Forwarded| {
            let (guard, count, keep) = (guard.clone(), count.clone(), keep.clone());
            async move {
                guard
                    .call(
                        "charge_card",
                        Scope::new("mcp").expect("scope"),
                        key(k),
                        Fingerprint::json_call("charge_card", &json!({})),
                        &keep,
                        move || async move { answer(count.fetch_add(1, Ordering::SeqCst) + 1) },
                    )
                    .await
            }
        };
        run("ke", tool_error).await.expect("result");
        let replay = value(&run("ke", ok).await);
        assert_eq!(
            (
                replay["isError"].clone(),
                replay["_meta"]["idem"]["replayed"].clone()
            ),
            (json!(true), json!(true))
        );
        assert!(run("kr", |_| rpc_error(-32603)).await.is_err());
        let again = run("kr", ok).await;
        assert_eq!(value(&again)["message"], "boom");
        assert!(run("kv", |_| rpc_error(-32601)).await.is_err());
        assert!(run("kv", ok).await.is_ok());
        assert_eq!(count.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_result_too_large_is_refused_at_once_and_never_rerun() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let big = |_| Forwarded::TooLarge {
            len: 20 << 20,
            sha256: [7; 32],
        };
        let first = charge(&guard, "big", 1, &count, big).await;
        assert_eq!(problem(&first).as_deref(), Some("response-too-large"));
        let retry = charge(&guard, "big", 1, &count, ok).await;
        assert_eq!(problem(&retry).as_deref(), Some("response-too-large"));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn input_required_is_relayed_and_releases_the_key() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let ask = |_| result(json!({"resultType": "input_required", "inputRequests": {"a": {}}}));
        let first = charge(&guard, "ir", 1, &count, ask).await;
        assert_eq!(value(&first)["resultType"], "input_required");
        assert!(charge(&guard, "ir", 1, &count, ok).await.is_ok());
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_lost_answer_is_an_unknown_outcome_not_a_second_run() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let lost = |_| Forwarded::Lost("connection closed".into());
        let first = charge(&guard, "l", 1, &count, lost).await;
        assert_eq!(problem(&first).as_deref(), Some("outcome-unknown"));
        let retry = charge(&guard, "l", 1, &count, ok).await;
        assert_eq!(problem(&retry).as_deref(), Some("outcome-unknown"));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_duplicate_waits_for_the_first_and_replays_it() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let slow = {
            let (guard, count) = (guard.clone(), count.clone());
            tokio::spawn(async move {
                guard
                    .call(
                        "charge_card",
                        Scope::new("mcp").expect("scope"),
                        key("w"),
                        Fingerprint::json_call("charge_card", &json!({ "n": 1 })),
                        &ToolPolicy::default(),
                        move || async move {
                            let _ = started_tx.send(());
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            ok(count.fetch_add(1, Ordering::SeqCst) + 1)
                        },
                    )
                    .await
            })
        };
        let _ = started.await;
        // The first caller gives up (a cancel, a disconnect): the execution goes on, is
        // stored, and the duplicate, which waited for it, replays it.
        slow.abort();
        let dup = charge(&guard, "w", 1, &count, ok).await;
        assert_eq!(value(&dup)["_meta"]["idem"]["replayed"], true);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        let mut short = ToolPolicy::default();
        short.engine.wait = None;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let blocker = {
            let guard = guard.clone();
            tokio::spawn(async move {
                guard
                    .call(
                        "charge_card",
                        Scope::new("mcp").expect("scope"),
                        key("c"),
                        Fingerprint::json_call("charge_card", &json!({})),
                        &ToolPolicy::default(),
                        move || async move {
                            let _ = rx.await;
                            ok(0)
                        },
                    )
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let conflict = guard
            .call(
                "charge_card",
                Scope::new("mcp").expect("scope"),
                key("c"),
                Fingerprint::json_call("charge_card", &json!({})),
                &short,
                || async { ok(0) },
            )
            .await;
        assert_eq!(problem(&conflict).as_deref(), Some("in-flight"));
        let _ = tx.send(());
        assert!(blocker.await.is_ok_and(|r| r.is_ok()));
    }
}
