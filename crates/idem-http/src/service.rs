//! [`Idempotency`]: the service the layer wraps around a handler or a proxy.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use idem_core::{
    Anonymous, Answer, Effect, Engine, Fingerprint, Key, Outcome, Scope, Store, StoredBody,
};
use tower_service::Service;
use tracing::Instrument;

use crate::capture::{
    append_headers, content_type, from_stored, is_per_caller, mark_replayed, to_stored,
    withhold_per_caller,
};
use crate::config::Config;
use crate::problem::Problem;

/// What every [`Idempotency`] service built by one layer shares.
#[derive(Debug)]
pub(crate) struct Shared<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) config: Config,
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

/// Methods that never need a key ([design §3](docs/design.md#3-what-a-request-with-a-key-gets);
/// TRACE is safe too, RFC 9110 §9.2.1).
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// The request header that carries the key (a `HeaderName`, so no lookup parses it again).
const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The key, if one was sent; `Err` when it is malformed or sent more than once.
fn key_from(headers: &HeaderMap) -> Result<Option<Key>, String> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
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

    /// The caller's scope, or the refusal of a request that names none when anonymous
    /// callers are refused ([design §1](docs/design.md#1-words)).
    fn scope_of(&self, headers: &HeaderMap) -> Result<Scope, Problem> {
        match (self.config.scope.principal(headers), self.config.anonymous) {
            (Some(scope), _) => Ok(scope),
            (None, Anonymous::Allow) => Ok(Scope::anonymous()),
            (None, Anonymous::Refuse) => {
                Err(Problem::PrincipalMissing(self.config.scope.describe()))
            }
        }
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
        // Before anything else, safe methods included: what the routes judge must be what the
        // service runs ([design §3](docs/design.md#3-what-a-request-with-a-key-gets)).
        if let Err(why) = crate::policy::screen(req.method(), req.uri().path(), req.headers()) {
            Outcome::Invalid.count();
            return Ok(self.problem(&Problem::RequestInvalid(why.to_string())));
        }
        if is_safe(req.method()) {
            return passthrough(&mut inner, req).await;
        }
        let policy = self
            .config
            .routes
            .policy_for(req.method(), req.uri().path());
        let key = match key_from(req.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if policy.require_key => {
                Outcome::Missing.count();
                return Ok(self.problem(&Problem::KeyMissing));
            }
            Ok(None) => {
                Outcome::Passthrough.count();
                return passthrough(&mut inner, req).await;
            }
            Err(why) => {
                Outcome::Invalid.count();
                return Ok(self.problem(&Problem::KeyInvalid(why)));
            }
        };
        let scope = match self.scope_of(req.headers()) {
            Ok(scope) => scope,
            Err(refused) => {
                Outcome::Invalid.count();
                return Ok(self.problem(&refused));
            }
        };
        let (parts, body) = req.into_parts();
        // A declared length over the bound is refused before the body is read, so a client
        // that sent `Expect: 100-continue` gets 413 instead of being told to go on.
        if http_body::Body::size_hint(&body).lower() > policy.max_body as u64 {
            Outcome::Invalid.count();
            return Ok(self.problem(&Problem::BodyTooLarge(policy.max_body)));
        }
        let collect = Limited::new(body, policy.max_body).collect();
        // A body dripped byte by byte would hold the connection as long as the client likes;
        // on timeout the body is dropped unread and nothing has been claimed.
        let collected = match self.config.body_read {
            Some(bound) => match tokio::time::timeout(bound, collect).await {
                Ok(collected) => collected,
                Err(_) => {
                    Outcome::Invalid.count();
                    return Ok(self.problem(&Problem::BodyTimeout(bound)));
                }
            },
            None => collect.await,
        };
        let body = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Outcome::Invalid.count();
                return Ok(self.problem(&Problem::BodyTooLarge(policy.max_body)));
            }
            Err(e) => {
                Outcome::Invalid.count();
                return Ok(self.problem(&Problem::BodyUnreadable(e.to_string())));
            }
        };
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
        // The request's span (design §13), continuing the caller's trace; the engine fills in
        // what it decides, and the inner service (the gateway's forward) runs inside it.
        let span = idem_core::span::request(idem_core::span::Call::Http {
            method: parts.method.as_str(),
        });
        idem_telemetry::continue_remote(&span, &parts.headers);
        let work = (inner, Request::from_parts(parts, full(body)));
        let (max_response, problem_base) = (
            self.config.max_response_bytes,
            self.config.problem_base.clone(),
        );
        // In the scope every anonymous caller shares, nothing that carries one caller's state
        // is kept for the others (design §4).
        let shared = scope == Scope::anonymous();
        let answer = self
            .engine
            .run(scope, key, fingerprint, &policy.engine, move || {
                execute(work, max_response, problem_base, shared)
            })
            .instrument(span)
            .await;
        let Ok(answer) = answer else {
            return Ok(self.problem(&Problem::StoreUnavailable));
        };
        Ok(match answer {
            Answer::Executed {
                response,
                value: (_, withheld),
                ..
            } => match from_stored(&response) {
                Some(mut resp) => {
                    // The executing caller's own state goes to it, though it was not stored.
                    append_headers(&mut resp, &withheld);
                    respond(resp)
                }
                None => self.problem(&Problem::StoreUnavailable),
            },
            Answer::NotSent((unstored, _)) | Answer::Unknown((unstored, _)) => match unstored {
                Some(Ok(resp)) => respond(resp),
                Some(Err(e)) => return Err(e),
                None => self.problem(&Problem::OutcomeUnknown),
            },
            Answer::Replayed(record) => {
                let mut resp = match record.response.as_ref().map(|r| (from_stored(r), &r.body)) {
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
                if shared {
                    // A record stored before per-caller headers were withheld.
                    let names: Vec<_> = resp
                        .headers()
                        .keys()
                        .filter(|n| is_per_caller(n.as_str()))
                        .cloned()
                        .collect();
                    for name in names {
                        resp.headers_mut().remove(name);
                    }
                }
                mark_replayed(&mut resp);
                resp
            }
            Answer::InFlight(_) => self.problem(&Problem::InFlight(Duration::from_secs(1))),
            Answer::Mismatch(_) => self.problem(&Problem::KeyReused),
            Answer::Abandoned(_) => self.problem(&Problem::OutcomeUnknown),
        })
    }
}

/// What the request gets back when its response is not stored: the response to return (or
/// the inner service's error), beside [`Effect::NotSent`] or [`Effect::Unknown`].
type Unstored<E> = Option<Result<Response<Bytes>, E>>;

/// Headers of a stored response that were withheld from the record (in stored form): the
/// executing caller gets them, replays do not.
type Withheld = Vec<(String, Vec<u8>)>;

/// Calls the inner service once and reports what happened to the engine, with the response
/// to return when it is not to be stored. In the `shared` (anonymous) scope, per-caller
/// headers are withheld from what is stored.
async fn execute<S, F, E, ResBody>(
    (mut svc, req): (S, Request<Body>),
    max_response: usize,
    problem_base: String,
    shared: bool,
) -> (Effect, (Unstored<E>, Withheld))
where
    S: Service<Request<Body>, Response = Response<ResBody>, Future = F, Error = E>,
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let resp = match svc.call(req).await {
        Ok(resp) => resp,
        Err(e) => {
            // The handler failed: whatever it did before failing is unknown.
            return (Effect::Unknown, (Some(Err(e)), Vec::new()));
        }
    };
    let marker = resp.extensions().get::<Executed>().copied();
    let (parts, body) = resp.into_parts();
    let bytes = match Limited::new(body, max_response).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            tracing::error!(error = %e, "the response body failed midway or was over max_response_bytes; outcome unknown");
            let failed = Problem::ResponseFailed.to_response(&problem_base);
            return (Effect::Unknown, (Some(Ok(failed)), Vec::new()));
        }
    };
    match marker {
        Some(Executed::NotSent) => (
            Effect::NotSent,
            (Some(Ok(Response::from_parts(parts, bytes))), Vec::new()),
        ),
        Some(Executed::Unknown) => (
            Effect::Unknown,
            (Some(Ok(Response::from_parts(parts, bytes))), Vec::new()),
        ),
        None => {
            let mut stored = to_stored(parts.status, &parts.headers, bytes);
            let withheld = if shared {
                withhold_per_caller(&mut stored)
            } else {
                Vec::new()
            };
            (Effect::Done(stored), (None, withheld))
        }
    }
}
