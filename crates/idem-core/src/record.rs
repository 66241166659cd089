//! What a store keeps for one (scope, key): the [`Record`], and the response it replays.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::scope::Scope;

/// Proof of holding a record's lease. `complete`, `release` and `extend` succeed only with the
/// current token, so an executor that lost its lease (it stalled, another took over) cannot
/// write over the winner's result ([design §2](docs/design.md#2-the-records-life)).
///
/// Tokens are random 64-bit values, not counters: a counter restarts when a record is purged
/// and created again, and a stale executor could then hold a token that looks current.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A fresh random token (never zero, so zero can mean "none" in storage).
    pub fn random() -> Self {
        loop {
            let t: u64 = rand::random();
            if t != 0 {
                return FencingToken(t);
            }
        }
    }

    /// From its stored form.
    pub const fn from_u64(v: u64) -> Self {
        FencingToken(v)
    }

    /// Its stored form.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Its stored form in backends with signed 64-bit integers only (SQLite, PostgreSQL).
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// From a signed 64-bit stored form.
    pub const fn from_i64(v: i64) -> Self {
        FencingToken(v as u64)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({:016x})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Where a record stands in its life ([design §2](docs/design.md#2-the-records-life)). Derived from
/// the record and the time, never stored, so a lease that ends needs no write to turn into
/// `Abandoned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed; the lease is running.
    InFlight,
    /// Claimed, but the lease ended without a completion: the outcome is unknown
    /// ([design §5](docs/design.md#5-unknown-outcomes)).
    Abandoned,
    /// A result is stored and is replayed until retention ends.
    Completed,
}

impl RecordState {
    /// The state at `now` of a record completed at `completed_at` (if ever) whose lease ends at
    /// `lease_expires_at`: completed once a result is stored, else in flight while the lease
    /// runs, else abandoned.
    pub fn of(
        completed_at: Option<Timestamp>,
        lease_expires_at: Timestamp,
        now: Timestamp,
    ) -> Self {
        if completed_at.is_some() {
            RecordState::Completed
        } else if lease_expires_at > now {
            RecordState::InFlight
        } else {
            RecordState::Abandoned
        }
    }

    /// The lowercase name used in CLI output and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordState::InFlight => "in_flight",
            RecordState::Abandoned => "abandoned",
            RecordState::Completed => "completed",
        }
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who stored a completed record's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompletedBy {
    /// The executor that held the lease.
    Executor,
    /// An operator, with `idem resolve`, settling an abandoned record.
    Operator,
}

/// One idempotency record: everything the store knows about (scope, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Whose key.
    pub scope: Scope,
    /// The key.
    pub key: Key,
    /// The request the key was first used for.
    pub fingerprint: Fingerprint,
    /// The current lease's token.
    pub token: FencingToken,
    /// When the key was first claimed.
    pub created_at: Timestamp,
    /// When the current lease was taken (differs from `created_at` after a takeover).
    pub acquired_at: Timestamp,
    /// When the lease ends; meaningless once completed.
    pub lease_expires_at: Timestamp,
    /// When the result was stored.
    pub completed_at: Option<Timestamp>,
    /// Who stored it.
    pub completed_by: Option<CompletedBy>,
    /// When retention ends and the record reads as absent; [`Timestamp::NEVER`] until
    /// completed, so an unknown outcome is never forgotten silently.
    pub expires_at: Timestamp,
    /// Retention asked for at claim time; counts from completion.
    pub retention: Duration,
    /// How many times an executor acquired the lease (1, plus takeovers of abandoned records).
    pub attempts: u32,
    /// How many times the stored result was replayed.
    pub replays: u32,
    /// The stored result, once completed.
    pub response: Option<StoredResponse>,
}

impl Record {
    /// The record's state at `now`.
    pub fn state(&self, now: Timestamp) -> RecordState {
        RecordState::of(self.completed_at, self.lease_expires_at, now)
    }

    /// Whether retention has ended: an expired record is absent to every reader
    /// ([design §2](docs/design.md#2-the-records-life)).
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }
}

/// A stored result, replayed byte for byte. HTTP statuses and headers are the common shape;
/// the MCP proxy stores its `CallToolResult` as a JSON body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// The headers kept for replay, in order, values as raw bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, or its digest when it was over the size bound
    /// ([design §4](docs/design.md#4-which-results-are-kept)).
    pub body: StoredBody,
}

/// A stored body.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredBody {
    /// The whole body. `Bytes`, so the record, the completed-record cache and every answer
    /// sent from them share one buffer: cloning a record or replaying it copies no body.
    Full(Bytes),
    /// Over the size bound: only its length and SHA-256 were kept, and a replay says so.
    Omitted {
        /// Length in bytes.
        len: u64,
        /// SHA-256 of the body.
        sha256: [u8; 32],
    },
}

impl fmt::Debug for StoredBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoredBody::Full(b) => write!(f, "Full({} bytes)", b.len()),
            StoredBody::Omitted { len, sha256 } => {
                write!(f, "Omitted({len} bytes, sha256 {})", hex::encode(sha256))
            }
        }
    }
}

/// The version byte in front of every encoded response, so a later format can read old rows.
const RESPONSE_FORMAT_V1: u8 = 1;

/// Why a stored response could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("stored response is unreadable: {0}")]
pub struct DecodeError(String);

impl StoredResponse {
    /// A response with a full body and no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: StoredBody::Full(body.into()),
        }
    }

    /// The compact binary form every backend stores.
    pub fn encode(&self) -> Vec<u8> {
        let out = vec![RESPONSE_FORMAT_V1];
        // Serialising owned vectors and integers into a Vec cannot fail.
        match postcard::to_extend(self, out) {
            Ok(v) => v,
            Err(_) => vec![RESPONSE_FORMAT_V1],
        }
    }

    /// Reads the form written by [`StoredResponse::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        match bytes.split_first() {
            Some((&RESPONSE_FORMAT_V1, rest)) => {
                postcard::from_bytes(rest).map_err(|e| DecodeError(e.to_string()))
            }
            Some((v, _)) => Err(DecodeError(format!("unknown format version {v}"))),
            None => Err(DecodeError("empty".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_round_trip() {
        let r = StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-bin".into(), vec![0xff, 0]),
            ],
            body: StoredBody::Full(Bytes::from_static(b"{\"id\":\"ch_1\"}")),
        };
        assert_eq!(StoredResponse::decode(&r.encode()).ok(), Some(r));
        let big = StoredResponse {
            status: 200,
            headers: vec![],
            body: StoredBody::Omitted {
                len: 1 << 40,
                sha256: [7; 32],
            },
        };
        assert_eq!(StoredResponse::decode(&big.encode()).ok(), Some(big));
    }

    /// Rows written while the body was a `Vec<u8>` read back, and new rows are byte for byte
    /// what that version wrote: postcard writes a sequence of `u8` and a byte string alike.
    #[test]
    fn the_encoding_is_the_one_a_vec_body_had() {
        #[derive(Serialize)]
        struct Before {
            status: u16,
            headers: Vec<(String, Vec<u8>)>,
            body: BodyBefore,
        }
        #[derive(Serialize)]
        enum BodyBefore {
            Full(Vec<u8>),
        }
        let body: Vec<u8> = (0..=255u8).cycle().take(300).collect();
        let before = Before {
            status: 201,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: BodyBefore::Full(body.clone()),
        };
        let mut written = vec![RESPONSE_FORMAT_V1];
        written.extend(postcard::to_allocvec(&before).expect("encode"));
        let now = StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: StoredBody::Full(body.into()),
        };
        assert_eq!(now.encode(), written);
        assert_eq!(StoredResponse::decode(&written).ok(), Some(now));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(StoredResponse::decode(&[]).is_err());
        assert!(StoredResponse::decode(&[9, 1, 2]).is_err());
        assert!(StoredResponse::decode(&[1, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn tokens_are_nonzero_and_round_trip_through_i64() {
        for _ in 0..1000 {
            let t = FencingToken::random();
            assert_ne!(t.as_u64(), 0);
            assert_eq!(FencingToken::from_i64(t.as_i64()), t);
        }
    }
}
