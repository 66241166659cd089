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
//! What is kept, and why:
//! - a result the upstream returned, `isError: true` included: the tool ran, and whatever it
//!   did before failing may have happened; replaying it is the only answer that cannot repeat
//!   an effect ([design §4](docs/design.md#4-which-results-are-kept): 5xx responses are kept too);
//! - a JSON-RPC error from the upstream is kept and replayed as the same error, except the
//!   codes that say the call was refused before the tool ran (parse error, invalid request,
//!   method not found, invalid params): those release the key, as validation failures record
//!   nothing (Stripe saves no result when parameters fail validation);
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
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode, ErrorData, MetaObject};
use serde_json::{Value, json};
use tokio_util::task::TaskTracker;

use crate::policy::ToolPolicy;

/// The status a stored `CallToolResult` is kept under (the record format is HTTP-shaped).
const RESULT: u16 = 200;
/// The status a stored JSON-RPC error from the upstream is kept under.
const RPC_ERROR: u16 = 500;

/// What forwarding a call upstream came to.
#[derive(Debug)]
pub enum Forwarded {
    /// The upstream answered with a result (`isError` or not): the tool ran.
    Result(CallToolResult),
    /// The upstream answered with a JSON-RPC error.
    Error(ErrorData),
    /// Nothing reached the tool (the upstream was already gone): the key is released.
    NotSent(String),
    /// The call was sent and no answer came: the outcome is unknown.
    Lost(String),
}

/// What the client gets: a tool result, or a JSON-RPC error (one the upstream gave, or a
/// store failure).
pub type Reply = Result<CallToolResult, ErrorData>;

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
pub fn refusal(problem: ProblemType, text: impl Into<String>) -> CallToolResult {
    let mut meta = MetaObject::new();
    meta.0
        .insert("idem".into(), json!({ "problem": problem.name() }));
    CallToolResult::error(vec![ContentBlock::text(text)]).with_meta(Some(meta))
}

impl<S: Store + Clone> Guard<S> {
    /// A guard over `store`.
    pub fn new(store: S) -> Self {
        Guard {
            // A duplicate of a call running in another process re-reads the store this
            // often: tool calls are slower than HTTP requests, so less often than the layer.
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
        // The tool's name goes with every log line of the engine about this call.
        let span = tracing::info_span!("tool_call", tool);
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
                Err(ErrorData::internal_error(
                    "the idempotency proxy failed while handling this call",
                    None,
                ))
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
            Answer::NotSent(value) => value
                .unwrap_or_else(|| Err(ErrorData::internal_error("the call was not sent", None))),
            Answer::Unknown(value) => value.unwrap_or_else(|| Ok(unknown(&tool, &key, ""))),
            Answer::Replayed(record) => match record.response {
                Some(r) => decode(&r, &key, true),
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

fn unknown(tool: &str, key: &Key, by: &str) -> CallToolResult {
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
        Forwarded::Result(result) => match serde_json::to_vec(&result) {
            Ok(body) => (Effect::Done(stored(RESULT, body)), None),
            Err(e) => {
                // Cannot happen for a value that came off the wire; if it did, the result
                // cannot be replayed, so the outcome must read as unknown, not as absent.
                tracing::error!(error = %e, "cannot serialise a tool result");
                (Effect::Unknown, Some(Ok(result)))
            }
        },
        Forwarded::Error(e) if refused_before_running(&e) => (Effect::NotSent, Some(Err(e))),
        Forwarded::Error(e) => match serde_json::to_vec(&e) {
            Ok(body) => (Effect::Done(stored(RPC_ERROR, body)), None),
            Err(_) => (Effect::Unknown, Some(Err(e))),
        },
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

/// JSON-RPC errors that mean the server refused the request before running the tool.
fn refused_before_running(e: &ErrorData) -> bool {
    [
        ErrorCode::PARSE_ERROR,
        ErrorCode::INVALID_REQUEST,
        ErrorCode::METHOD_NOT_FOUND,
        ErrorCode::INVALID_PARAMS,
    ]
    .contains(&e.code)
}

fn stored(status: u16, body: Vec<u8>) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: StoredBody::Full(body),
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
                    "This idempotency_key ({key}) already ran, but its result was {len} bytes, \
                     over the size the proxy stores, so only its digest was kept; it was not \
                     run again."
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
    match response.status {
        RPC_ERROR => match serde_json::from_slice::<ErrorData>(body) {
            Ok(e) => Err(e),
            Err(e) => unreadable(e),
        },
        _ => match serde_json::from_slice::<CallToolResult>(body) {
            Ok(mut result) if replayed => {
                let meta = result.meta.get_or_insert_with(MetaObject::new);
                meta.0.insert(
                    "idem".into(),
                    json!({ "replayed": true, "key": Value::String(key.as_str().to_owned()) }),
                );
                Ok(result)
            }
            Ok(result) => Ok(result),
            Err(e) => unreadable(e),
        },
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
        let r = r.as_ref().ok()?;
        r.meta
            .as_ref()?
            .0
            .get("idem")?
            .get("problem")?
            .as_str()
            .map(str::to_owned)
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
        Forwarded::Result(CallToolResult::success(vec![ContentBlock::text(format!(
            "ch_{n}"
        ))]))
    }

    #[tokio::test]
    async fn one_run_per_key_and_the_replay_is_marked() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let first = charge(&guard, "k", 1, &count, ok).await.expect("result");
        assert_eq!(first.meta, None);
        let again = charge(&guard, "k", 1, &count, ok).await.expect("result");
        assert_eq!(again.content, first.content);
        let idem = again.meta.as_ref().and_then(|m| m.0.get("idem")).cloned();
        assert_eq!(idem, Some(json!({"replayed": true, "key": "k"})));
        let other = charge(&guard, "k", 2, &count, ok).await;
        assert_eq!(problem(&other).as_deref(), Some("key-reused"));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn tool_errors_are_kept_and_validation_errors_release() {
        let guard = Guard::new(MemoryStore::new());
        let count = Arc::new(AtomicU32::new(0));
        let failed =
            |_| Forwarded::Result(CallToolResult::error(vec![ContentBlock::text("declined")]));
        charge(&guard, "e", 1, &count, failed)
            .await
            .expect("result");
        let replay = charge(&guard, "e", 1, &count, ok).await.expect("result");
        assert_eq!(replay.is_error, Some(true));
        let invalid = |_| Forwarded::Error(ErrorData::invalid_params("amount missing", None));
        assert!(charge(&guard, "v", 1, &count, invalid).await.is_err());
        // Released: the retry runs.
        assert!(
            charge(&guard, "v", 1, &count, ok)
                .await
                .is_ok_and(|r| r.is_error != Some(true))
        );
        let internal = |_| Forwarded::Error(ErrorData::internal_error("boom", None));
        assert!(charge(&guard, "i", 1, &count, internal).await.is_err());
        let again = charge(&guard, "i", 1, &count, ok).await;
        assert_eq!(again.err().map(|e| e.message), Some("boom".into()));
        assert_eq!(count.load(Ordering::SeqCst), 4);
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
        let dup = charge(&guard, "w", 1, &count, ok).await.expect("result");
        assert!(dup.meta.is_some_and(|m| m.0.contains_key("idem")));
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
