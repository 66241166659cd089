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

/// A buffered response in stored form.
pub fn to_stored(status: StatusCode, headers: &HeaderMap, body: Bytes) -> StoredResponse {
    StoredResponse {
        status: status.as_u16(),
        headers: headers
            .iter()
            .filter(|(n, _)| kept(n))
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        body: StoredBody::Full(body.to_vec()),
    }
}

/// A stored response as an HTTP response. `None` when the body was not kept (over the bound).
/// Headers that no longer parse (they were stored by something else) are skipped.
pub fn from_stored(stored: &StoredResponse) -> Option<Response<Bytes>> {
    let StoredBody::Full(body) = &stored.body else {
        return None;
    };
    let mut resp = Response::new(Bytes::copy_from_slice(body));
    *resp.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = resp.headers_mut();
    for (name, value) in &stored.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    Some(resp)
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
