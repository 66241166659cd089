//! Responses into stored form and back: what is kept for replay, byte for byte.

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use idem_core::{StoredBody, StoredResponse};

/// The header that marks a replay (IETF draft, Stripe).
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Headers never stored: hop-by-hop ones (RFC 9110 §7.6.1), and those the server sets anew on
/// every response (`date`) or that describe framing (`content-length`, recomputed).
fn kept(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "date"
            | "content-length"
    )
}

/// Response headers that carry one caller's state: a session (`Set-Cookie`, and the obsolete
/// `Set-Cookie2`) or authentication parameters for the next request (`Authentication-Info`,
/// `Proxy-Authentication-Info`, RFC 9110 §11.6.3 and §11.7.3). They are replayed only within a
/// caller's own scope, never in the shared anonymous one
/// ([design §4](docs/design.md#4-which-results-are-kept)).
pub fn is_per_caller(name: &str) -> bool {
    name.eq_ignore_ascii_case("set-cookie")
        || name.eq_ignore_ascii_case("set-cookie2")
        || name.eq_ignore_ascii_case("authentication-info")
        || name.eq_ignore_ascii_case("proxy-authentication-info")
}

/// Takes the per-caller headers ([`is_per_caller`]) out of a stored response and returns
/// them, in order.
pub fn withhold_per_caller(stored: &mut StoredResponse) -> Vec<(String, Vec<u8>)> {
    let (withheld, kept) = std::mem::take(&mut stored.headers)
        .into_iter()
        .partition(|(name, _)| is_per_caller(name));
    stored.headers = kept;
    withheld
}

/// A buffered response in stored form.
pub fn to_stored(status: StatusCode, headers: &HeaderMap, body: Bytes) -> StoredResponse {
    StoredResponse {
        status: status.as_u16(),
        headers: headers
            .iter()
            .filter(|(n, _)| kept(n))
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        // Not copied here: the engine's stored form makes the body's one copy (`bounded`).
        body: StoredBody::Full(body),
    }
}

/// A stored response as an HTTP response. `None` when the body was not kept (over the bound).
/// Headers that no longer parse (they were stored by something else) are skipped.
pub fn from_stored(stored: &StoredResponse) -> Option<Response<Bytes>> {
    let StoredBody::Full(body) = &stored.body else {
        return None;
    };
    let mut resp = Response::new(body.clone());
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    append_headers(&mut resp, &stored.headers);
    Some(resp)
}

/// Appends headers in stored form to a response; those that do not parse are skipped.
pub fn append_headers<B>(resp: &mut Response<B>, stored: &[(String, Vec<u8>)]) {
    let headers = resp.headers_mut();
    for (name, value) in stored {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
}

/// Marks a response as a replay.
pub fn mark_replayed<B>(resp: &mut Response<B>) {
    resp.headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
}

/// `content-type` of a request, if it is text.
pub fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}
