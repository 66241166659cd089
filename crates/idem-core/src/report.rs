//! A record's whole story as JSON: what `idem inspect --json` prints and the gateway's admin
//! `GET /keys/{key}` answers. Field names are stable; times are given both in RFC 3339 and in
//! epoch milliseconds; bodies as text when they are printable UTF-8, else as hex.

use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::record::{CompletedBy, Record, StoredBody};

/// Text when the bytes are printable UTF-8 (newlines and tabs allowed).
pub fn printable(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok().filter(|s| {
        s.chars()
            .all(|c| !c.is_control() || c == '\n' || c == '\t' || c == '\r')
    })
}

/// A header value for display: as text when printable, else `0x` and hex.
pub fn header_value(v: &[u8]) -> String {
    printable(v).map_or_else(|| format!("0x{}", hex::encode(v)), str::to_owned)
}

/// The record as seen at `now`.
pub fn to_json(r: &Record, now: Timestamp) -> Value {
    let time = |t: Timestamp| json!({ "at": t.to_string(), "ms": t.as_millis() });
    let response = r.response.as_ref().map(|resp| {
        let headers: Vec<Value> = resp
            .headers
            .iter()
            .map(|(n, v)| json!({ "name": n, "value": header_value(v) }))
            .collect();
        let body = match &resp.body {
            StoredBody::Full(b) => match printable(b) {
                Some(s) => json!({ "kind": "full", "len": b.len(), "text": s }),
                None => json!({ "kind": "full", "len": b.len(), "hex": hex::encode(b) }),
            },
            StoredBody::Omitted { len, sha256 } => {
                json!({ "kind": "omitted", "len": len, "sha256": hex::encode(sha256) })
            }
        };
        json!({ "status": resp.status, "headers": headers, "body": body })
    });
    json!({
        "key": r.key.as_str(),
        "scope": r.scope.as_str(),
        "state": r.state(now).as_str(),
        "completed_by": r.completed_by.map(|b| match b {
            CompletedBy::Executor => "executor",
            CompletedBy::Operator => "operator",
        }),
        "fingerprint": r.fingerprint.to_string(),
        "token": r.token.to_string(),
        "created": time(r.created_at),
        "acquired": time(r.acquired_at),
        "lease_expires": time(r.lease_expires_at),
        "completed": r.completed_at.map(time),
        "expires": (r.expires_at != Timestamp::NEVER).then(|| time(r.expires_at)),
        "retention_ms": u64::try_from(r.retention.as_millis()).unwrap_or(u64::MAX),
        "attempts": r.attempts,
        "replays": r.replays,
        "response": response,
    })
}
