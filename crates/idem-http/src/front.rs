//! [`Front`]: everything idem decides about an HTTP request, as plain functions of the
//! request's and the response's parts, with no I/O
//! ([design §3](docs/design.md#3-what-a-request-with-a-key-gets),
//! [§4](docs/design.md#4-which-results-are-kept)).
//!
//! Every HTTP front end is an adapter of this one core: the tower layer ([`crate::service`]),
//! `idem serve` (the layer around a proxy), and the Python and Node middleware (through
//! `idem-embed`'s `http` module). An adapter moves bytes and runs the engine; what a request
//! gets is decided here, once:
//!
//! 1. [`Front::admit`], before the body: screening, safe methods, the route's policy (read
//!    every way the service may read the path), the key, the caller's scope (the anonymous
//!    rule included). The answer is [`Admission::Pass`] (hand the request on untouched), a
//!    refusal, or [`Admission::Keyed`].
//! 2. The adapter buffers the body, up to [`Front::max_body`] (a declared length over it is
//!    refused first, [`Front::declared`]; a failed read is [`Front::body_failed`]), and
//!    takes its [`Front::fingerprint`].
//! 3. The engine claims the key (`Engine::run`, or `Engine::begin` and
//!    `Execution::finish`). A request that did not execute is answered
//!    [`Front::prior`]: a replay marked `Idempotent-Replayed`, or a refusal.
//! 4. The request that executes hands the service's response to [`Front::capture`], which
//!    says what is stored (per-caller headers withheld in the shared anonymous scope); once
//!    the engine has kept it, [`Front::executed`] is what the caller is sent.
//!
//! Refusals are written in the configured envelope ([`crate::ProblemFormat`]).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use idem_core::{
    Anonymous, Answer, Fingerprint, Key, Outcome, Record, Scope, StoredBody, StoredResponse,
};

use crate::capture::{
    append_headers, content_type, from_stored, is_per_caller, mark_replayed, to_stored,
    withhold_per_caller,
};
use crate::config::Config;
use crate::policy::{RouteId, RoutePolicy};
use crate::problem::Problem;

/// The HTTP semantics of idem over one configuration.
#[derive(Debug, Clone)]
pub struct Front {
    config: Config,
}

/// What a request gets before its body is read.
#[derive(Debug)]
pub enum Admission {
    /// Not idem's to judge (a safe method; an unsafe one without a key on a route that does
    /// not require one): hand it to the service as it came.
    Pass,
    /// Refused: answer this. Nothing was claimed or executed.
    Refused(Response<Bytes>),
    /// Keyed: buffer the body (at most [`Front::max_body`] bytes), fingerprint it, claim.
    Keyed(Keyed),
}

/// A keyed request admitted: its key, whose it is, and its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    /// The request's key.
    pub key: Key,
    /// The caller's scope.
    pub scope: Scope,
    route: RouteId,
}

impl Keyed {
    /// Whether the caller named no one and shares the `anonymous` scope, where per-caller
    /// headers are never stored or replayed ([design §4](docs/design.md#4-which-results-are-kept)).
    pub fn anonymous(&self) -> bool {
        self.scope.as_str() == idem_core::scope::ANONYMOUS
    }
}

/// Why a keyed request's body could not be buffered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Over [`Front::max_body`].
    TooLarge,
    /// It failed while being read.
    Unreadable(String),
    /// It did not arrive within this bound.
    Timeout(Duration),
}

/// What the executing request's response comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// What the record keeps: the status, the headers but hop-by-hop ones, `Date` and
    /// `Content-Length` (and, in the anonymous scope, the per-caller ones), the body.
    pub stored: StoredResponse,
    /// Per-caller headers kept out of the record: the executing caller still gets them.
    pub withheld: Vec<(String, Vec<u8>)>,
}

/// The request header that carries the key (a `HeaderName`, so no lookup parses it again).
const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// Methods that never need a key ([design §3](docs/design.md#3-what-a-request-with-a-key-gets);
/// TRACE is safe too, RFC 9110 §9.2.1).
pub fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

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

impl Front {
    /// The core over `config`.
    pub const fn new(config: Config) -> Self {
        Front { config }
    }

    /// The configuration.
    pub const fn config(&self) -> &Config {
        &self.config
    }

    /// What a request with this method, path (without the query) and headers gets before its
    /// body is read. Counts the refusals it makes and the unkeyed requests it passes
    /// (`idem_requests_total`, design §13).
    pub fn admit(&self, method: &Method, path: &str, headers: &HeaderMap) -> Admission {
        // Before anything else, safe methods included: what the routes judge must be what the
        // service runs ([design §3](docs/design.md#3-what-a-request-with-a-key-gets)).
        if let Err(why) = crate::policy::screen(method, path, headers) {
            Outcome::Invalid.count();
            return Admission::Refused(self.refuse(&Problem::RequestInvalid(why.to_string())));
        }
        if is_safe(method) {
            return Admission::Pass;
        }
        let route = self.config.routes.route_for(method, path);
        let key = match key_from(headers) {
            Ok(Some(key)) => key,
            Ok(None) if self.config.routes.policy(route).require_key => {
                Outcome::Missing.count();
                return Admission::Refused(self.refuse(&Problem::KeyMissing));
            }
            Ok(None) => {
                Outcome::Passthrough.count();
                return Admission::Pass;
            }
            Err(why) => {
                Outcome::Invalid.count();
                return Admission::Refused(self.refuse(&Problem::KeyInvalid(why)));
            }
        };
        let scope = match (self.config.scope.principal(headers), self.config.anonymous) {
            (Some(scope), _) => scope,
            (None, Anonymous::Allow) => Scope::anonymous(),
            (None, Anonymous::Refuse) => {
                Outcome::Invalid.count();
                return Admission::Refused(
                    self.refuse(&Problem::PrincipalMissing(self.config.scope.describe())),
                );
            }
        };
        Admission::Keyed(Keyed { key, scope, route })
    }

    /// The policy of a keyed request's route.
    pub fn policy(&self, keyed: &Keyed) -> &RoutePolicy {
        self.config.routes.policy(keyed.route)
    }

    /// The most of a keyed request's body that is buffered.
    pub fn max_body(&self, keyed: &Keyed) -> usize {
        self.policy(keyed).max_body
    }

    /// The refusal of a body whose declared length is over the bound, before any of it is
    /// read (so a client that sent `Expect: 100-continue` is not told to go on).
    pub fn declared(&self, keyed: &Keyed, declared: Option<u64>) -> Option<Response<Bytes>> {
        let max = self.max_body(keyed);
        declared
            .filter(|len| *len > max as u64)
            .map(|_| self.body_failed(keyed, &BodyError::TooLarge))
    }

    /// The refusal of a body that could not be buffered; nothing was claimed.
    pub fn body_failed(&self, keyed: &Keyed, error: &BodyError) -> Response<Bytes> {
        Outcome::Invalid.count();
        self.refuse(&match error {
            BodyError::TooLarge => Problem::BodyTooLarge(self.max_body(keyed)),
            BodyError::Unreadable(why) => Problem::BodyUnreadable(why.clone()),
            BodyError::Timeout(bound) => Problem::BodyTimeout(*bound),
        })
    }

    /// The fingerprint of a request: method, path with query as received (`target`), the
    /// media type, and the body decoded from its `Content-Encoding` (within `max_body` bytes,
    /// [`crate::encoding`]), canonicalised when it is JSON
    /// ([design §1](docs/design.md#1-words)).
    pub fn fingerprint(
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
        max_body: usize,
    ) -> Fingerprint {
        let encoding = headers
            .get(http::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok());
        let body = crate::encoding::decoded(encoding, body, max_body);
        Fingerprint::http(method.as_str(), target, content_type(headers), &body)
    }

    /// A refusal, in the configured envelope.
    pub fn refuse(&self, problem: &Problem) -> Response<Bytes> {
        problem.render(&self.config.problems)
    }

    /// The answer to a request that did not execute: the stored response replayed, or the
    /// refusal the engine's answer calls for. `None` for the answers of the request that
    /// executed ([`Front::capture`] says what it sends).
    pub fn prior<T>(&self, keyed: &Keyed, answer: &Answer<T>) -> Option<Response<Bytes>> {
        Some(match answer {
            Answer::Replayed(record) => self.replay(keyed, record),
            Answer::InFlight(_) => self.refuse(&Problem::InFlight(Duration::from_secs(1))),
            Answer::Mismatch(_) => self.refuse(&Problem::KeyReused),
            Answer::Abandoned(_) => self.refuse(&Problem::OutcomeUnknown),
            Answer::Executed { .. } | Answer::NotSent(_) | Answer::Unknown(_) => return None,
        })
    }

    /// A completed record's response, replayed to `keyed`'s caller with
    /// `Idempotent-Replayed: true`; `response-too-large` when only its digest was kept.
    pub fn replay(&self, keyed: &Keyed, record: &Record) -> Response<Bytes> {
        let mut resp = match record.response.as_ref().map(|r| (from_stored(r), &r.body)) {
            Some((Some(resp), _)) => resp,
            Some((None, StoredBody::Omitted { len, sha256 })) => {
                let status = record.response.as_ref().map_or(0, |r| r.status);
                self.refuse(&Problem::ResponseTooLarge {
                    status,
                    len: *len,
                    sha256: sha256.iter().map(|b| format!("{b:02x}")).collect(),
                })
            }
            _ => self.refuse(&Problem::StoreUnavailable),
        };
        if keyed.anonymous() {
            // A record stored before per-caller headers were withheld, or by an operator.
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

    /// What of the executing request's response is stored, and what of it is withheld from
    /// the record for its caller alone; `anonymous` is [`Keyed::anonymous`].
    pub fn capture(
        &self,
        anonymous: bool,
        status: http::StatusCode,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Captured {
        let mut stored = to_stored(status, headers, body);
        let withheld = if anonymous {
            withhold_per_caller(&mut stored)
        } else {
            Vec::new()
        };
        Captured { stored, withheld }
    }

    /// What the executing caller gets once the engine has kept `response` (the whole one,
    /// even when only its digest was stored), with the headers `withheld` from the record.
    pub fn executed(
        &self,
        response: &StoredResponse,
        withheld: &[(String, Vec<u8>)],
    ) -> Response<Bytes> {
        match from_stored(response) {
            Some(mut resp) => {
                append_headers(&mut resp, withheld);
                resp
            }
            None => self.refuse(&Problem::StoreUnavailable),
        }
    }

    /// The answer when the service's response broke off or was over
    /// `max_response_bytes`: the effect may have happened, the record is abandoned.
    pub fn response_failed(&self) -> Response<Bytes> {
        self.refuse(&Problem::ResponseFailed)
    }

    /// The answer when the store could not be used: nothing ran.
    pub fn store_unavailable(&self) -> Response<Bytes> {
        self.refuse(&Problem::StoreUnavailable)
    }
}
