//! [`Idempotency`]: the service the layer wraps around a handler or a proxy.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use idem_core::{Answer, Effect, Fingerprint, Kept, Key, Scope, Store, StoredBody};
use tower_service::Service;

use crate::capture::{content_type, from_stored, mark_replayed, to_stored};
use crate::layer::Shared;
use crate::problem::Problem;
use crate::waiters::Running;

/// A value the effect hands back to the request once the engine is done with it. Shared
/// rather than borrowed, so the effect's future owns everything it touches.
struct Slot<T>(Arc<std::sync::Mutex<Option<T>>>);

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot(Arc::default())
    }
}

impl<T> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Slot(self.0.clone())
    }
}

impl<T> Slot<T> {
    fn put(&self, v: T) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
    }

    fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The boxed error of bodies passed through the layer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The body type the layer hands to the inner service and returns.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// What an inner service can tell the layer about a response it made without the effect
/// having run normally, by inserting it into the response's extensions. The gateway uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executed {
    /// The request never reached the side effect (connection refused): release the key, so
    /// a retry executes. The response is returned, not stored.
    NotSent,
    /// The request may have reached the side effect but no answer came (timeout, reset): the
    /// record becomes abandoned. The response is returned, not stored.
    Unknown,
}

/// The service made by [`crate::IdempotencyLayer`].
pub struct Idempotency<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, St> Idempotency<S, St> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St>>) -> Self {
        Idempotency { inner, shared }
    }
}

fn full(bytes: Bytes) -> Body {
    UnsyncBoxBody::new(Full::new(bytes).map_err(|never| match never {}))
}

fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    UnsyncBoxBody::new(body.map_err(Into::into))
}

fn respond(resp: Response<Bytes>) -> Response<Body> {
    resp.map(full)
}

/// The scope of a request: the hash of the values of `names` (each value with its header's
/// name, in the order of `names`), or the anonymous scope when none is present. `idem inspect
/// --principal` computes the same, so an operator can find a caller's records.
pub fn scope_of(headers: &HeaderMap, names: &[http::HeaderName]) -> Scope {
    let parts: Vec<&[u8]> = names
        .iter()
        .flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .flat_map(move |v| [name.as_str().as_bytes(), v.as_bytes()])
        })
        .collect();
    if parts.is_empty() {
        Scope::anonymous()
    } else {
        Scope::from_principal(parts)
    }
}

/// Methods that never need a key (DESIGN §3; TRACE is safe too, RFC 9110 §9.2.1).
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

fn count(outcome: &'static str) {
    metrics::counter!("idem_requests_total", "outcome" => outcome).increment(1);
}

/// The key, if one was sent; `Err` when it is malformed or sent more than once.
fn key_from(headers: &HeaderMap) -> Result<Option<Key>, String> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("The Idempotency-Key header was sent more than once".into());
    }
    Key::from_header(first.as_bytes())
        .map(Some)
        .map_err(|e| capitalise(&e.to_string()))
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, St>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    St: Store,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The ready service goes into the future; a fresh clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(shared.handle(inner, req))
    }
}

impl<St: Store> Shared<St> {
    fn problem(&self, p: &Problem) -> Response<Body> {
        respond(p.to_response(&self.config.problem_base))
    }

    fn scope_of(&self, headers: &HeaderMap) -> Scope {
        scope_of(headers, &self.config.scope_headers)
    }

    async fn handle<S, F, E, ReqBody, ResBody>(
        self: Arc<Self>,
        mut inner: S,
        req: Request<ReqBody>,
    ) -> Result<Response<Body>, E>
    where
        S: Service<Request<Body>, Response = Response<ResBody>, Future = F, Error = E>,
        F: Future<Output = Result<Response<ResBody>, E>> + Send + 'static,
        E: Send + 'static,
        ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
        ReqBody::Error: Into<BoxError>,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let passthrough = |inner: &mut S, req: Request<ReqBody>| {
            let fut = inner.call(req.map(boxed));
            async move { fut.await.map(|r| r.map(boxed)) }
        };
        if is_safe(req.method()) {
            return passthrough(&mut inner, req).await;
        }
        let policy = self
            .config
            .routes
            .policy_for(req.method(), req.uri().path())
            .clone();
        let key = match key_from(req.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if policy.require_key => {
                count("missing");
                return Ok(self.problem(&Problem::KeyMissing));
            }
            Ok(None) => {
                count("passthrough");
                return passthrough(&mut inner, req).await;
            }
            Err(why) => {
                count("invalid");
                return Ok(self.problem(&Problem::KeyInvalid(why)));
            }
        };
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, policy.max_body).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                count("invalid");
                return Ok(self.problem(&Problem::BodyTooLarge(policy.max_body)));
            }
            Err(e) => {
                count("invalid");
                return Ok(self.problem(&Problem::BodyUnreadable(e.to_string())));
            }
        };
        let scope = self.scope_of(&parts.headers);
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
        let fingerprint = Fingerprint::http(
            parts.method.as_str(),
            target,
            content_type(&parts.headers),
            &body,
        );
        let deadline = policy.wait.map(|w| Instant::now() + w);

        // The request and the service wait here until an attempt acquires the key: a duplicate
        // that waited and then finds the key free executes with them.
        let work: Slot<(S, Request<Body>)> = Slot::default();
        work.put((inner, Request::from_parts(parts, full(body))));
        loop {
            // Listen before claiming, so a finish between the claim and the wait is not missed.
            // Only routes that wait need to know about executions in this process.
            let waits = policy.wait.is_some();
            let local = waits.then(|| self.waiters.get(&scope, &key)).flatten();
            let notified = local.as_ref().map(|n| {
                let mut n = Box::pin(n.notified());
                n.as_mut().enable();
                n
            });
            let unstored: Slot<Result<Response<Bytes>, E>> = Slot::default();
            let running: Slot<Running> = Slot::default();
            let max_response = self.config.max_response_bytes;
            let problem_base = self.config.problem_base.clone();
            let effect = {
                let (waiters, scope, key) = (self.waiters.clone(), scope.clone(), key.clone());
                let (unstored, running) = (unstored.clone(), running.clone());
                let work = work.clone();
                move || {
                    if waits {
                        running.put(waiters.executing(&scope, &key));
                    }
                    execute(work.take(), unstored, max_response, problem_base)
                }
            };
            let answer = self
                .engine
                .run(
                    scope.clone(),
                    key.clone(),
                    fingerprint,
                    &policy.engine,
                    effect,
                )
                .await;
            let answer = match answer {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, key = %key, scope = %scope, "store unavailable; request not executed");
                    count("store_error");
                    return Ok(self.problem(&Problem::StoreUnavailable));
                }
            };
            // Waiters wake once the result is stored, not before.
            drop(running.take());
            let unstored = unstored.take();
            match answer {
                Answer::Executed { response, kept } => {
                    if let Kept::Lost(e) = &kept {
                        metrics::counter!("idem_completions_lost_total").increment(1);
                        tracing::error!(error = %e, key = %key, scope = %scope, "executed, but the result was not stored; the key will read as abandoned");
                    }
                    count("executed");
                    return Ok(from_stored(&response)
                        .map_or_else(|| self.problem(&Problem::StoreUnavailable), respond));
                }
                Answer::NotSent | Answer::Unknown => {
                    if matches!(answer, Answer::Unknown) {
                        metrics::counter!("idem_abandoned_records_total").increment(1);
                        tracing::warn!(key = %key, scope = %scope, "outcome unknown: the record is abandoned until resolved (idem inspect / idem resolve)");
                    }
                    count(if matches!(answer, Answer::NotSent) {
                        "not_sent"
                    } else {
                        "outcome_unknown"
                    });
                    return match unstored {
                        Some(Ok(resp)) => Ok(respond(resp)),
                        Some(Err(e)) => Err(e),
                        None => Ok(self.problem(&Problem::OutcomeUnknown)),
                    };
                }
                Answer::Replayed(record) => {
                    count("replayed");
                    let mut resp = match record.response.as_ref().map(|r| (from_stored(r), &r.body))
                    {
                        Some((Some(resp), _)) => respond(resp),
                        Some((None, StoredBody::Omitted { len, sha256 })) => {
                            let status = record.response.as_ref().map_or(0, |r| r.status);
                            self.problem(&Problem::ResponseTooLarge {
                                status,
                                len: *len,
                                sha256: sha256.iter().map(|b| format!("{b:02x}")).collect(),
                            })
                        }
                        _ => self.problem(&Problem::StoreUnavailable),
                    };
                    mark_replayed(&mut resp);
                    return Ok(resp);
                }
                Answer::InFlight(_) => {
                    let Some(deadline) = deadline.filter(|d| *d > Instant::now()) else {
                        count("conflict");
                        return Ok(self.problem(&Problem::InFlight(Duration::from_secs(1))));
                    };
                    let nap = self
                        .config
                        .poll_interval
                        .min(deadline.saturating_duration_since(Instant::now()));
                    match notified {
                        Some(n) => {
                            let _ = tokio::time::timeout(nap, n).await;
                        }
                        None => tokio::time::sleep(nap).await,
                    }
                }
                Answer::Mismatch(_) => {
                    count("mismatch");
                    return Ok(self.problem(&Problem::KeyReused));
                }
                Answer::Abandoned(_) => {
                    count("outcome_unknown");
                    return Ok(self.problem(&Problem::OutcomeUnknown));
                }
            }
        }
    }
}

/// Calls the inner service once and reports what happened to the engine. Responses that are
/// not to be stored (and errors) go back to the caller through `unstored`.
async fn execute<S, F, E, ResBody>(
    work: Option<(S, Request<Body>)>,
    unstored: Slot<Result<Response<Bytes>, E>>,
    max_response: usize,
    problem_base: String,
) -> Effect
where
    S: Service<Request<Body>, Response = Response<ResBody>, Future = F, Error = E>,
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // The engine runs the effect at most once per request, so the work is always there; if
    // it were not, the key must not be released as if nothing could have happened.
    let Some((mut svc, req)) = work else {
        tracing::error!("internal: an acquired key found no request to execute");
        let mut failed = Response::new(Bytes::from_static(b""));
        *failed.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        unstored.put(Ok(failed));
        return Effect::Unknown;
    };
    let resp = match svc.call(req).await {
        Ok(resp) => resp,
        Err(e) => {
            // The handler failed: whatever it did before failing is unknown.
            unstored.put(Err(e));
            return Effect::Unknown;
        }
    };
    let marker = resp.extensions().get::<Executed>().copied();
    let (parts, body) = resp.into_parts();
    let bytes = match Limited::new(body, max_response).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            tracing::error!(error = %e, "the response body failed midway or was over max_response_bytes; outcome unknown");
            unstored.put(Ok(Problem::ResponseFailed.to_response(&problem_base)));
            return Effect::Unknown;
        }
    };
    match marker {
        Some(Executed::NotSent) => {
            unstored.put(Ok(Response::from_parts(parts, bytes)));
            Effect::NotSent
        }
        Some(Executed::Unknown) => {
            unstored.put(Ok(Response::from_parts(parts, bytes)));
            Effect::Unknown
        }
        None => Effect::Done(to_stored(parts.status, &parts.headers, bytes)),
    }
}
