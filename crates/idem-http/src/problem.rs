//! Refusals, written in the envelope a service's clients read: RFC 9457 problem details
//! (`application/problem+json`) by default, Stripe's error envelope, or a template
//! ([`ProblemFormat`]).
//!
//! Every problem idem answers has a stable name (`key-reused`, [`ProblemType`]). In RFC 9457
//! documents the `type` is a URI: the configured base (default [`DEFAULT_PROBLEM_BASE`], a
//! URN: not dereferenceable, so point it at your own docs if you like) followed by the name;
//! the `title` is fixed per type and `detail` explains this occurrence. The list, with what a
//! client should do about each, is in `docs/problems.md`.
//!
//! A front end in front of an API whose clients use that API's SDK must refuse in that API's
//! envelope: the official `stripe` SDKs throw only when the body has an `error` member, and
//! read a 422 problem document as a charge with no id. [`ProblemFormat::Stripe`] writes
//! `{"error": {"type", "code", "message"}}` with the statuses and `Stripe-Should-Retry`
//! header Stripe's SDKs act on; [`ProblemFormat::Template`] writes any JSON shape.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};
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
    /// 502 (gateway): no connection to the upstream could be made; nothing was sent. The
    /// text says why.
    UpstreamUnreachable(String),
    /// 502 (gateway): the connection to the upstream failed after the request was sent.
    UpstreamFailed(String),
    /// 504 (gateway): the upstream did not answer in time.
    UpstreamTimeout(String),
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
            Problem::UpstreamUnreachable(_) => ProblemType::UpstreamUnreachable,
            Problem::UpstreamFailed(_) => ProblemType::UpstreamFailed,
            Problem::UpstreamTimeout(_) => ProblemType::UpstreamTimeout,
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
            Problem::ResponseFailed
            | Problem::UpstreamUnreachable(_)
            | Problem::UpstreamFailed(_) => StatusCode::BAD_GATEWAY,
            Problem::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
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
            Problem::UpstreamUnreachable(_) => "Upstream unreachable",
            Problem::UpstreamFailed(_) => "Upstream connection failed after the request was sent",
            Problem::UpstreamTimeout(_) => "Upstream did not answer in time",
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
            Problem::KeyReused => "This key was first used for a request with another method, path, media type or body. Use a new key for a new intent.".into(),
            Problem::InFlight(_) => "The first request with this key has not finished. Retry after the interval in Retry-After with the same key to get its result.".into(),
            Problem::OutcomeUnknown => "An earlier attempt with this key started but did not finish, so whether its effect happened is unknown. It was not retried automatically; an operator must resolve the key (idem resolve).".into(),
            Problem::ResponseTooLarge { status, len, .. } => format!("The request was executed (status {status}), but its {len}-byte response was over the size bound, so only its digest was kept."),
            Problem::StoreUnavailable => "The idempotency store could not be reached, so the request was not executed. Retry with the same key.".into(),
            Problem::ResponseFailed => "The response broke off midway, did not arrive in time, or was too large to buffer. The request may have been executed, so the key is marked outcome-unknown until an operator resolves it.".into(),
            Problem::RequestInvalid(why) => format!("{why}. Nothing was executed."),
            Problem::MethodNotAllowed(method) => format!("{method} asks for a tunnel, which a reverse proxy does not open. Nothing was executed."),
            Problem::UpstreamUnreachable(why)
            | Problem::UpstreamFailed(why)
            | Problem::UpstreamTimeout(why) => why.clone(),
        }
    }

    /// The problem as a response in the RFC 9457 format, type URIs under `base`.
    pub fn to_response(&self, base: &str) -> Response<Bytes> {
        self.render(&ProblemFormat::Rfc9457 {
            base: base.to_owned(),
        })
    }

    /// The problem as a response, written in `format`. Whatever the format, the headers a
    /// client acts on are the same: `Retry-After` on `in-flight` and `store-unavailable`,
    /// `Connection: close` on `body-timeout`, `Allow` on `method-not-allowed`, and
    /// `Idempotent-Replayed` on `response-too-large` (it is a replay).
    pub fn render(&self, format: &ProblemFormat) -> Response<Bytes> {
        let (status, content_type, body) = match format {
            ProblemFormat::Rfc9457 { base } => (
                self.status(),
                "application/problem+json",
                self.rfc9457(base).to_string(),
            ),
            ProblemFormat::Stripe => (
                self.stripe_status(),
                "application/json",
                self.stripe().to_string(),
            ),
            ProblemFormat::Template(t) => {
                let status = t
                    .statuses
                    .get(self.name())
                    .and_then(|s| StatusCode::from_u16(*s).ok())
                    .unwrap_or_else(|| self.status());
                (status, t.content_type.as_str(), t.fill(self, status))
            }
        };
        let mut resp = Response::new(Bytes::from(body));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(content_type) {
            h.insert(header::CONTENT_TYPE, v);
        }
        let retry_after = match self {
            Problem::InFlight(d) => Some(d.as_secs().max(1) + u64::from(d.subsec_nanos() > 0)),
            Problem::StoreUnavailable => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        match self {
            // The rest of the body may still be on its way: the connection cannot be reused.
            Problem::BodyTimeout(_) => {
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Problem::MethodNotAllowed(_) => {
                h.insert(header::ALLOW, HeaderValue::from_static(ALLOWED_METHODS));
            }
            Problem::ResponseTooLarge { .. } => {
                h.insert(crate::REPLAYED, HeaderValue::from_static("true"));
            }
            _ => {}
        }
        if let ProblemFormat::Stripe = format {
            let retry = matches!(self, Problem::InFlight(_) | Problem::StoreUnavailable);
            h.insert(
                STRIPE_SHOULD_RETRY,
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        resp
    }

    /// The RFC 9457 document.
    fn rfc9457(&self, base: &str) -> Value {
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
        doc
    }

    /// Stripe's status for this problem: 400 for what the request got wrong (Stripe's SDKs
    /// raise their `IdempotencyError` only on a 400 or 404 whose type is
    /// `idempotency_error`), 405 for a method, 5xx for what failed on the way.
    fn stripe_status(&self) -> StatusCode {
        match self.status() {
            s if s.is_server_error() || s == StatusCode::METHOD_NOT_ALLOWED => s,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// Stripe's envelope: `type` is what Stripe's SDKs map to an exception class
    /// (`idempotency_error` for a key used wrongly or still running, `api_error` for what
    /// failed on the way, `invalid_request_error` for the rest); `code` is the problem's
    /// name, `message` its detail.
    fn stripe(&self) -> Value {
        let kind = match self {
            Problem::KeyReused
            | Problem::InFlight(_)
            | Problem::OutcomeUnknown
            | Problem::ResponseTooLarge { .. } => "idempotency_error",
            Problem::StoreUnavailable
            | Problem::ResponseFailed
            | Problem::UpstreamUnreachable(_)
            | Problem::UpstreamFailed(_)
            | Problem::UpstreamTimeout(_) => "api_error",
            _ => "invalid_request_error",
        };
        json!({"error": {"type": kind, "code": self.name(), "message": self.detail()}})
    }
}

/// The header Stripe's SDKs read before retrying: `true` makes them retry (a conflict in
/// flight, the store away), `false` stops them.
pub const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

/// How refusals are written ([`Problem::render`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProblemFormat {
    /// RFC 9457 problem details, `application/problem+json`, type URIs under `base`.
    Rfc9457 {
        /// The base the problem's name is appended to.
        base: String,
    },
    /// Stripe's error envelope: `{"error": {"type", "code", "message"}}`, `application/json`,
    /// with Stripe's statuses (400 for the request's mistakes) and `Stripe-Should-Retry`.
    Stripe,
    /// A JSON body of the operator's ([`ProblemTemplate`]).
    Template(ProblemTemplate),
}

impl Default for ProblemFormat {
    fn default() -> Self {
        ProblemFormat::Rfc9457 {
            base: DEFAULT_PROBLEM_BASE.to_owned(),
        }
    }
}

/// A refusal body of the operator's shape: JSON text in which `{name}`, `{title}`,
/// `{detail}`, `{type}` (the RFC 9457 type URI under the base) and `{status}` are replaced,
/// the first four as JSON string contents (escaped, to sit between quotes), `{status}` as a
/// number; with its content type, and statuses per problem name where they differ from
/// idem's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProblemTemplate {
    body: String,
    content_type: String,
    base: String,
    statuses: BTreeMap<String, u16>,
}

/// Why a problem template was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// Filled in, the template is not JSON.
    #[error(
        "the problem template is not JSON once filled in ({0}); write JSON with {{name}}, {{title}}, {{detail}} and {{type}} between quotes and {{status}} as a number"
    )]
    NotJson(String),
    /// A status is given for a name that is no problem.
    #[error(
        "problem statuses name {0:?}, which is not a problem name (key-reused, in-flight, ...)"
    )]
    UnknownProblem(String),
    /// A status that is no HTTP error status.
    #[error("problem statuses give {name} the status {status}; use 400 to 599")]
    BadStatus {
        /// The problem's name.
        name: String,
        /// The status given.
        status: u16,
    },
}

impl ProblemTemplate {
    /// A template, checked: filled in for every problem it is JSON, and its statuses name
    /// problems and are error statuses.
    pub fn new(
        body: impl Into<String>,
        content_type: impl Into<String>,
        base: impl Into<String>,
        statuses: BTreeMap<String, u16>,
    ) -> Result<Self, TemplateError> {
        for (name, status) in &statuses {
            if ProblemType::from_name(name).is_none() {
                return Err(TemplateError::UnknownProblem(name.clone()));
            }
            if !(400..=599).contains(status) {
                return Err(TemplateError::BadStatus {
                    name: name.clone(),
                    status: *status,
                });
            }
        }
        let t = ProblemTemplate {
            body: body.into(),
            content_type: content_type.into(),
            base: base.into(),
            statuses,
        };
        let sample = Problem::KeyInvalid("a \"quoted\" \\ reason\n".into());
        serde_json::from_str::<Value>(&t.fill(&sample, sample.status()))
            .map_err(|e| TemplateError::NotJson(e.to_string()))?;
        Ok(t)
    }

    fn fill(&self, p: &Problem, status: StatusCode) -> String {
        // Escaped as a JSON string's contents: the quotes around it are the template's.
        let quoted = |s: &str| {
            let whole = Value::String(s.to_owned()).to_string();
            whole[1..whole.len() - 1].to_owned()
        };
        let mut out = String::with_capacity(self.body.len() + 128);
        let mut rest = self.body.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open..];
            let (name, len) = ["{name}", "{title}", "{detail}", "{type}", "{status}"]
                .iter()
                .find(|p| after.starts_with(**p))
                .map_or(("", 1), |p| (*p, p.len()));
            match name {
                "{name}" => out.push_str(&quoted(p.name())),
                "{title}" => out.push_str(&quoted(p.title())),
                "{detail}" => out.push_str(&quoted(&p.detail())),
                "{type}" => out.push_str(&quoted(&format!("{}{}", self.base, p.name()))),
                "{status}" => out.push_str(&status.as_u16().to_string()),
                _ => out.push('{'),
            }
            rest = &rest[open + len..];
        }
        out.push_str(rest);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: &Response<Bytes>) -> Value {
        serde_json::from_slice(r.body()).expect("a JSON body")
    }

    #[test]
    fn stripe_envelopes_carry_what_stripes_sdks_act_on() {
        let reused = Problem::KeyReused.render(&ProblemFormat::Stripe);
        assert_eq!(reused.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body(&reused)["error"]["type"], "idempotency_error");
        assert_eq!(body(&reused)["error"]["code"], "key-reused");
        assert_eq!(reused.headers()[STRIPE_SHOULD_RETRY], "false");
        let busy = Problem::InFlight(Duration::from_secs(1)).render(&ProblemFormat::Stripe);
        assert_eq!(busy.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body(&busy)["error"]["type"], "idempotency_error");
        assert_eq!(busy.headers()[STRIPE_SHOULD_RETRY], "true");
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        let down = Problem::StoreUnavailable.render(&ProblemFormat::Stripe);
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body(&down)["error"]["type"], "api_error");
        assert_eq!(
            body(&Problem::KeyMissing.render(&ProblemFormat::Stripe))["error"]["type"],
            "invalid_request_error"
        );
    }

    #[test]
    fn a_template_is_filled_escaped_and_checked() {
        let t = ProblemTemplate::new(
            r#"{"code": "{name}", "message": "{detail}", "status": {status}, "see": "{type}", "x": "{other}"}"#,
            "application/vnd.acme+json",
            "https://acme.example/errors/",
            BTreeMap::from([("key-reused".to_owned(), 409)]),
        )
        .expect("a valid template");
        let r = Problem::KeyInvalid("byte 0x22 \"quoted\"".into())
            .render(&ProblemFormat::Template(t.clone()));
        let v = body(&r);
        assert_eq!(v["code"], "key-invalid");
        assert!(
            v["message"]
                .as_str()
                .is_some_and(|m| m.contains("\"quoted\""))
        );
        assert_eq!(v["status"], 400);
        assert_eq!(v["see"], "https://acme.example/errors/key-invalid");
        assert_eq!(v["x"], "{other}");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "application/vnd.acme+json"
        );
        let reused = Problem::KeyReused.render(&ProblemFormat::Template(t));
        assert_eq!(reused.status(), StatusCode::CONFLICT);
        assert_eq!(body(&reused)["status"], 409);
        assert!(matches!(
            ProblemTemplate::new("{name}", "application/json", "", BTreeMap::new()),
            Err(TemplateError::NotJson(_))
        ));
        assert!(matches!(
            ProblemTemplate::new(
                "{}",
                "application/json",
                "",
                BTreeMap::from([("nope".to_owned(), 400)])
            ),
            Err(TemplateError::UnknownProblem(_))
        ));
        assert!(matches!(
            ProblemTemplate::new(
                "{}",
                "application/json",
                "",
                BTreeMap::from([("in-flight".to_owned(), 200)])
            ),
            Err(TemplateError::BadStatus { .. })
        ));
    }

    #[test]
    fn every_format_keeps_the_headers_clients_act_on() {
        for format in [ProblemFormat::default(), ProblemFormat::Stripe] {
            let busy = Problem::InFlight(Duration::from_millis(1500)).render(&format);
            assert_eq!(busy.headers()[header::RETRY_AFTER], "2");
            let slow = Problem::BodyTimeout(Duration::from_secs(30)).render(&format);
            assert_eq!(slow.headers()[header::CONNECTION], "close");
            let big = Problem::ResponseTooLarge {
                status: 201,
                len: 9,
                sha256: "ab".into(),
            }
            .render(&format);
            assert_eq!(big.headers()[crate::REPLAYED], "true");
        }
    }
}
