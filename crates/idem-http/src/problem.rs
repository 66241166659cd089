//! Refusals as RFC 9457 problem details (`application/problem+json`).
//!
//! Every problem idem answers has a stable `type` URI: the configured base (default
//! [`DEFAULT_PROBLEM_BASE`], a URN: not dereferenceable, so point it at your own docs if you
//! like) followed by the problem's name. Clients match on the name; the
//! `title` is fixed per type and `detail` explains this occurrence. The list, with what a
//! client should do about each, is in `docs/problems.md`.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use idem_core::ProblemType;
use serde_json::{Value, json};

/// The default base of problem type URIs.
pub const DEFAULT_PROBLEM_BASE: &str = "urn:idem:problem:";

/// What went wrong, as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// 400: the route requires a key and none was sent.
    KeyMissing,
    /// 400: the key is malformed, too long, or sent twice.
    KeyInvalid(String),
    /// 400: a keyed request names no caller and anonymous callers are refused; the scope
    /// headers, described for people.
    PrincipalMissing(String),
    /// 413: the body is over the route's bound (it must be buffered to be fingerprinted).
    BodyTooLarge(usize),
    /// 400: the body could not be read.
    BodyUnreadable(String),
    /// 408 with `Connection: close`: the body did not arrive within the time allowed (the
    /// bound); nothing was claimed or executed.
    BodyTimeout(Duration),
    /// 422: the key was used for another request.
    KeyReused,
    /// 409: the first request with this key is still executing.
    InFlight(Duration),
    /// 409: an earlier execution's outcome is unknown; an operator must resolve it.
    OutcomeUnknown,
    /// 409 on replay: the stored response was too large to keep; only its digest was kept.
    ResponseTooLarge {
        /// The original status.
        status: u16,
        /// The body's length.
        len: u64,
        /// The body's SHA-256, hex.
        sha256: String,
    },
    /// 503: the store could not be used; nothing was executed.
    StoreUnavailable,
    /// 502: the service's response broke off, or was over the buffer bound: the effect may
    /// have happened, so the key is marked outcome-unknown.
    ResponseFailed,
    /// 400: the request is spelled so that the service could read it differently from the
    /// route policy, or names no path to forward ([`crate::policy::screen`]); the text says how.
    RequestInvalid(String),
    /// 405 with `Allow`: a method a reverse proxy cannot forward (`CONNECT`).
    MethodNotAllowed(String),
}

/// The methods a 405 says are allowed: the standard ones a reverse proxy forwards (extension
/// methods in upper case are forwarded too, but cannot be listed).
pub const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH";

impl Problem {
    /// The kind of problem, named the same over every protocol.
    pub const fn kind(&self) -> ProblemType {
        match self {
            Problem::KeyMissing => ProblemType::KeyMissing,
            Problem::KeyInvalid(_) => ProblemType::KeyInvalid,
            Problem::PrincipalMissing(_) => ProblemType::PrincipalMissing,
            Problem::BodyTooLarge(_) => ProblemType::BodyTooLarge,
            Problem::BodyUnreadable(_) => ProblemType::BodyUnreadable,
            Problem::BodyTimeout(_) => ProblemType::BodyTimeout,
            Problem::KeyReused => ProblemType::KeyReused,
            Problem::InFlight(_) => ProblemType::InFlight,
            Problem::OutcomeUnknown => ProblemType::OutcomeUnknown,
            Problem::ResponseTooLarge { .. } => ProblemType::ResponseTooLarge,
            Problem::StoreUnavailable => ProblemType::StoreUnavailable,
            Problem::ResponseFailed => ProblemType::ResponseFailed,
            Problem::RequestInvalid(_) => ProblemType::RequestInvalid,
            Problem::MethodNotAllowed(_) => ProblemType::MethodNotAllowed,
        }
    }

    /// The name at the end of the type URI.
    pub const fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The HTTP status.
    pub const fn status(&self) -> StatusCode {
        match self {
            Problem::KeyMissing
            | Problem::KeyInvalid(_)
            | Problem::BodyUnreadable(_)
            | Problem::PrincipalMissing(_)
            | Problem::RequestInvalid(_) => StatusCode::BAD_REQUEST,
            Problem::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Problem::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight(_) | Problem::OutcomeUnknown | Problem::ResponseTooLarge { .. } => {
                StatusCode::CONFLICT
            }
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::ResponseFailed => StatusCode::BAD_GATEWAY,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key header required",
            Problem::KeyInvalid(_) => "Invalid Idempotency-Key",
            Problem::PrincipalMissing(_) => "Caller not named",
            Problem::BodyTooLarge(_) => "Request body too large",
            Problem::BodyUnreadable(_) => "Request body unreadable",
            Problem::BodyTimeout(_) => "Request body not received in time",
            Problem::KeyReused => "Idempotency-Key reused for another request",
            Problem::InFlight(_) => "Request with this Idempotency-Key in progress",
            Problem::OutcomeUnknown => "Outcome of the request with this Idempotency-Key unknown",
            Problem::ResponseTooLarge { .. } => "Stored response too large to replay",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::ResponseFailed => "Response failed",
            Problem::RequestInvalid(_) => "Request not forwarded as written",
            Problem::MethodNotAllowed(_) => "Method cannot be forwarded",
        }
    }

    fn detail(&self) -> String {
        match self {
            Problem::KeyMissing => "This endpoint requires an Idempotency-Key header on unsafe methods; send a unique key per intent and reuse it on every retry.".into(),
            Problem::KeyInvalid(why) => format!("{why}. A key is 1 to 255 characters of visible ASCII, sent once."),
            Problem::PrincipalMissing(headers) => format!("A request with an Idempotency-Key must say who its caller is, with one of these headers: {headers}. Its result is replayed only to that caller, never to another. Send your credentials; an operator can also accept callers without them in one shared scope (anonymous = \"allow\")."),
            Problem::BodyTooLarge(max) => format!("Requests with an Idempotency-Key are buffered to fingerprint them; this endpoint accepts at most {max} bytes."),
            Problem::BodyUnreadable(why) => format!("The request body could not be read: {why}."),
            Problem::BodyTimeout(bound) => format!("The request body did not arrive within {bound:?} of its headers, so the connection is closed. Nothing was executed; retry with the same key."),
            Problem::KeyReused => "This key was first used for a request with another method, path or body. Use a new key for a new intent.".into(),
            Problem::InFlight(_) => "The first request with this key has not finished. Retry after the interval in Retry-After with the same key to get its result.".into(),
            Problem::OutcomeUnknown => "An earlier attempt with this key started but did not finish, so whether its effect happened is unknown. It was not retried automatically; an operator must resolve the key (idem resolve).".into(),
            Problem::ResponseTooLarge { status, len, .. } => format!("The request was executed (status {status}), but its {len}-byte response was over the size bound, so only its digest was kept."),
            Problem::StoreUnavailable => "The idempotency store could not be reached, so the request was not executed. Retry with the same key.".into(),
            Problem::ResponseFailed => "The response broke off midway, did not arrive in time, or was too large to buffer. The request may have been executed, so the key is marked outcome-unknown until an operator resolves it.".into(),
            Problem::RequestInvalid(why) => format!("{why}. Nothing was executed."),
            Problem::MethodNotAllowed(method) => format!("{method} asks for a tunnel, which a reverse proxy does not open. Nothing was executed."),
        }
    }

    /// The problem as a response, type URIs under `base`.
    pub fn to_response(&self, base: &str) -> Response<Bytes> {
        let mut doc = json!({
            "type": format!("{base}{}", self.name()),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": self.detail(),
        });
        if let (
            Problem::ResponseTooLarge {
                status,
                len,
                sha256,
            },
            Value::Object(map),
        ) = (self, &mut doc)
        {
            map.insert("original_status".into(), json!(status));
            map.insert("body_length".into(), json!(len));
            map.insert("body_sha256".into(), json!(sha256));
        }
        let body = Bytes::from(doc.to_string());
        let mut resp = Response::new(body);
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let retry_after = match self {
            Problem::InFlight(d) => Some(d.as_secs().max(1) + u64::from(d.subsec_nanos() > 0)),
            Problem::StoreUnavailable => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Problem::BodyTimeout(_) = self {
            // The rest of the body may still be on its way: the connection cannot be reused.
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Problem::MethodNotAllowed(_) = self {
            h.insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
        }
        resp
    }
}
