//! [`Idempotency`]: the service the layer wraps around a handler or a proxy: the tower
//! adapter of the HTTP core ([`Front`]), which decides; this module buffers bodies, runs the
//! engine and moves tower's requests and responses in and out.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use idem_core::{Answer, Effect, Engine, Store};
use tower_service::Service;
use tracing::Instrument;

use crate::front::{Admission, BodyError, Front, Keyed};
use crate::problem::Problem;

/// What every [`Idempotency`] service built by one layer shares.
#[derive(Debug)]
pub(crate) struct Shared<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) front: Front,
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
    /// One request through the core ([`Front`]): admitted, its body buffered and
    /// fingerprinted, the inner service run by the engine at most once per key, and the
    /// engine's answer mapped back to HTTP.
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
        let front = &self.front;
        let keyed = match front.admit(req.method(), req.uri().path(), req.headers()) {
            Admission::Pass => {
                let fut = inner.call(req.map(boxed));
                return fut.await.map(|r| r.map(boxed));
            }
            Admission::Refused(resp) => return Ok(respond(resp)),
            Admission::Keyed(keyed) => keyed,
        };
        let (parts, body) = req.into_parts();
        let declared = http_body::Body::size_hint(&body).lower();
        if let Some(refused) = front.declared(&keyed, Some(declared)) {
            return Ok(respond(refused));
        }
        let body = match self.buffer(&keyed, body).await {
            Ok(body) => body,
            Err(refused) => return Ok(respond(refused)),
        };
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
        let fingerprint = Front::fingerprint(
            &parts.method,
            target,
            &parts.headers,
            &body,
            front.max_body(&keyed),
        );
        // The request's span (design §13), continuing the caller's trace; the engine fills in
        // what it decides, and the inner service (the gateway's forward) runs inside it.
        let span = idem_core::span::request(idem_core::span::Call::Http {
            method: parts.method.as_str(),
        });
        idem_telemetry::continue_remote(&span, &parts.headers);
        let work = (inner, Request::from_parts(parts, full(body)));
        let anonymous = keyed.anonymous();
        let answer = self
            .engine
            .run(
                keyed.scope.clone(),
                keyed.key.clone(),
                fingerprint,
                &front.policy(&keyed).engine,
                || execute(work, self.clone(), anonymous),
            )
            .instrument(span)
            .await;
        let Ok(answer) = answer else {
            return Ok(respond(front.store_unavailable()));
        };
        if let Some(prior) = front.prior(&keyed, &answer) {
            return Ok(respond(prior));
        }
        Ok(match answer {
            Answer::Executed {
                response,
                value: (_, withheld),
                ..
            } => respond(front.executed(&response, &withheld)),
            Answer::NotSent((unstored, _)) | Answer::Unknown((unstored, _)) => match unstored {
                Some(Ok(resp)) => respond(resp),
                Some(Err(e)) => return Err(e),
                None => respond(front.refuse(&Problem::OutcomeUnknown)),
            },
            // Answered by `prior` above.
            _ => respond(front.store_unavailable()),
        })
    }

    /// A keyed request's body, bounded in size and, where configured, in time; the refusal
    /// when it cannot be buffered (nothing is claimed then).
    async fn buffer<B>(&self, keyed: &Keyed, body: B) -> Result<Bytes, Response<Bytes>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let front = &self.front;
        let collect = Limited::new(body, front.max_body(keyed)).collect();
        // A body dripped byte by byte would hold the connection as long as the client likes;
        // on timeout the body is dropped unread and nothing has been claimed.
        let collected = match front.config().body_read {
            Some(bound) => match tokio::time::timeout(bound, collect).await {
                Ok(collected) => collected,
                Err(_) => return Err(front.body_failed(keyed, &BodyError::Timeout(bound))),
            },
            None => collect.await,
        };
        match collected {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(front.body_failed(keyed, &BodyError::TooLarge))
            }
            Err(e) => Err(front.body_failed(keyed, &BodyError::Unreadable(e.to_string()))),
        }
    }
}

/// What the request gets back when its response is not stored: the response to return (or
/// the inner service's error), beside [`Effect::NotSent`] or [`Effect::Unknown`].
type Unstored<E> = Option<Result<Response<Bytes>, E>>;

/// Headers of a stored response that were withheld from the record (in stored form): the
/// executing caller gets them, replays do not.
type Withheld = Vec<(String, Vec<u8>)>;

/// Calls the inner service once and reports what happened to the engine, with the response
/// to return when it is not to be stored; what is stored is the core's to say
/// ([`Front::capture`]).
async fn execute<S, F, E, ResBody, St>(
    (mut svc, req): (S, Request<Body>),
    shared: Arc<Shared<St>>,
    anonymous: bool,
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
    let front = &shared.front;
    let marker = resp.extensions().get::<Executed>().copied();
    let (parts, body) = resp.into_parts();
    let bytes = match Limited::new(body, front.config().max_response_bytes)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            tracing::error!(error = %e, "the response body failed midway or was over max_response_bytes; outcome unknown");
            return (
                Effect::Unknown,
                (Some(Ok(front.response_failed())), Vec::new()),
            );
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
            let captured = front.capture(anonymous, parts.status, &parts.headers, bytes);
            (Effect::Done(captured.stored), (None, captured.withheld))
        }
    }
}
