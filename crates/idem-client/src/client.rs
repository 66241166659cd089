//! [`ToolClient`]: one key per intent, reused on every retry path.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::Key;
use serde_json::Value;
use tracing::Instrument;

use crate::policy::{RetryPolicy, ToolClass, ToolPolicy};
use crate::transport::{Request, Response, Transport, TransportError};

/// One intent: a decision to call one tool with these arguments.
#[derive(Debug, Clone)]
pub struct Intent {
    /// Whose intent: a turn, a task id handed to sub-agents, a business id.
    pub scope: String,
    /// The tool.
    pub tool: String,
    /// The arguments.
    pub args: Value,
    /// Separates deliberate identical calls in one scope.
    pub ordinal: u64,
    /// What the tool is.
    pub policy: ToolPolicy,
}

/// What an attempt came to, as reported to observers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// An answer with this status.
    Answered(u16),
    /// No answer; see [`TransportError`].
    Failed(TransportError),
}

/// One attempt, for observers (metrics, logs, tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The tool.
    pub tool: String,
    /// The key sent, for effects.
    pub key: Option<Key>,
    /// 1 for the first.
    pub number: u32,
    /// What came of it.
    pub outcome: AttemptOutcome,
    /// The wait before the next attempt, if there is one.
    pub retry_in: Option<Duration>,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The server refused the request as malformed or conflicting with the key's first use
    /// (400, 422, and other 4xx but 409 and 429). Never retried: the same request would be
    /// refused again.
    #[error("refused with status {}: {}", .0.status, String::from_utf8_lossy(&.0.body))]
    Refused(Response),
    /// Retries ran out (attempts or time); the last answer or failure is kept.
    #[error("gave up after {attempts} attempts: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// What the last one came to.
        last: String,
        /// The last answer, if it was one.
        response: Option<Response>,
    },
    /// An effect without a key may have been executed, so it was not retried.
    #[error(
        "outcome unknown: the request may have been executed and carries no key, so it was not retried: {0}"
    )]
    OutcomeUnknown(TransportError),
    /// The key could not be derived (an integer beyond 2^53 in the arguments, say).
    #[error("cannot derive the key: {0}")]
    Derive(#[from] idem_keys::DeriveError),
}

type Observer = Arc<dyn Fn(&Attempt) + Send + Sync>;
type Sleeper = Arc<
    dyn Fn(Duration) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// A client that calls tools through a [`Transport`] and retries them safely.
#[derive(Clone)]
pub struct ToolClient<T> {
    transport: T,
    retry: RetryPolicy,
    secret: Option<Vec<u8>>,
    observer: Option<Observer>,
    sleep: Sleeper,
    /// Whether an effect's arguments carry its key as `idempotency_key` (see
    /// [`ToolClient::key_in_args`]).
    key_in_args: bool,
}

impl<T> fmt::Debug for ToolClient<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolClient")
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> ToolClient<T> {
    /// A client with the default retry policy.
    pub fn new(transport: T) -> Self {
        ToolClient {
            transport,
            retry: RetryPolicy::default(),
            secret: None,
            observer: None,
            sleep: Arc::new(|d| Box::pin(tokio::time::sleep(d))),
            key_in_args: false,
        }
    }

    /// Sets the retry policy.
    pub fn retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Derives keys with HMAC-SHA256 under this secret
    /// ([design §7](docs/design.md#7-the-runtime-side)).
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// Also sends an effect's key as the argument `idempotency_key` (added to an object's
    /// arguments), for a tool that reads it there. Off by default: on HTTP the
    /// `Idempotency-Key` header is the key, and a service whose model forbids extra fields
    /// would refuse every call ([design §7](docs/design.md#7-the-runtime-side)).
    pub fn key_in_args(mut self, on: bool) -> Self {
        self.key_in_args = on;
        self
    }

    /// Calls `observer` after every attempt.
    pub fn on_attempt(mut self, observer: impl Fn(&Attempt) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Replaces how the client waits between attempts (tests record instead of sleeping).
    pub fn sleeper<F, Fut>(mut self, sleep: F) -> Self
    where
        F: Fn(Duration) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.sleep = Arc::new(move |d| Box::pin(sleep(d)));
        self
    }

    /// The key of an intent, derived once, here, at the point of intent.
    pub fn key_for(&self, intent: &Intent) -> Result<Option<Key>, CallError> {
        if !intent.policy.needs_key() {
            return Ok(None);
        }
        let key = idem_keys::derive(
            &intent.scope,
            &intent.tool,
            &intent.args,
            intent.ordinal,
            self.secret.as_deref(),
        )?;
        Ok(Some(key))
    }

    /// Calls the tool: an effect gets its key derived once and sent, as the `Idempotency-Key`
    /// header (and the argument `idempotency_key` under [`ToolClient::key_in_args`]), on
    /// every attempt.
    pub async fn call(&self, intent: &Intent) -> Result<Response, CallError> {
        let key = self.key_for(intent)?;
        self.call_with_key(intent, key).await
    }

    /// Calls the tool with a key chosen by the caller (`None` sends an effect unkeyed: it is
    /// then never retried once it may have been sent).
    pub async fn call_with_key(
        &self,
        intent: &Intent,
        key: Option<Key>,
    ) -> Result<Response, CallError> {
        let mut args = intent.args.clone();
        if let (true, Some(k), Value::Object(map)) = (self.key_in_args, &key, &mut args) {
            map.insert("idempotency_key".into(), Value::from(k.as_str()));
        }
        // Effects without a key may not be repeated once they may have run; the rest may.
        let repeatable = key.is_some() || !matches!(intent.policy.class, ToolClass::Effect);
        let start = Instant::now();
        let mut number = 0u32;
        loop {
            number += 1;
            let span = tracing::info_span!("tool_attempt", tool = %intent.tool, attempt = number, key = key.as_ref().map(Key::as_str));
            let req = Request {
                tool: &intent.tool,
                args: &args,
                key: key.as_ref(),
                attempt: number,
            };
            let result = self.transport.send(req).instrument(span).await;
            let outcome = match &result {
                Ok(r) => AttemptOutcome::Answered(r.status),
                Err(e) => AttemptOutcome::Failed(e.clone()),
            };
            // What the server asked for (`Retry-After`) when this attempt may be retried.
            let retry_after: Option<Duration> = match &result {
                Ok(r) if r.status < 400 => {
                    self.observe(intent, &key, number, outcome, None);
                    return result.map_err(CallError::OutcomeUnknown);
                }
                Ok(r) if retryable_status(r.status, repeatable) => r.retry_after,
                Ok(_) => {
                    self.observe(intent, &key, number, outcome, None);
                    return Err(match result {
                        Ok(r) if r.status >= 500 => CallError::GaveUp {
                            attempts: number,
                            last: format!("status {}", r.status),
                            response: Some(r),
                        },
                        Ok(r) => CallError::Refused(r),
                        Err(e) => CallError::OutcomeUnknown(e),
                    });
                }
                Err(e @ TransportError::NoAnswer(_)) if !repeatable => {
                    let e = e.clone();
                    self.observe(intent, &key, number, outcome, None);
                    return Err(CallError::OutcomeUnknown(e));
                }
                Err(_) => None,
            };
            let delay = self.retry.delay(number, retry_after);
            if number >= self.retry.max_attempts
                || start.elapsed().saturating_add(delay) > self.retry.max_total
            {
                self.observe(intent, &key, number, outcome, None);
                let (last, response) = match result {
                    Ok(r) => (format!("status {}", r.status), Some(r)),
                    Err(e) => (e.to_string(), None),
                };
                return Err(CallError::GaveUp {
                    attempts: number,
                    last,
                    response,
                });
            }
            self.observe(intent, &key, number, outcome, Some(delay));
            (self.sleep)(delay).await;
        }
    }

    fn observe(
        &self,
        intent: &Intent,
        key: &Option<Key>,
        number: u32,
        outcome: AttemptOutcome,
        retry_in: Option<Duration>,
    ) {
        tracing::debug!(tool = %intent.tool, attempt = number, ?outcome, ?retry_in, "tool attempt");
        if let Some(observer) = &self.observer {
            observer(&Attempt {
                tool: intent.tool.clone(),
                key: key.clone(),
                number,
                outcome,
                retry_in,
            });
        }
    }
}

/// Statuses worth another attempt. 409 (in flight), 429 and 503 say "not now"; other 5xx may
/// be transient. Without a key only 429 is safe: the server says it did not process the request.
fn retryable_status(status: u16, repeatable: bool) -> bool {
    match status {
        429 => true,
        409 | 503 => repeatable,
        s if s >= 500 => repeatable,
        _ => false,
    }
}
