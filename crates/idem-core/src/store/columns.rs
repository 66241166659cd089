//! A record as the flat columns every database backend stores, and back.
//!
//! SQLite, PostgreSQL and Redis all keep the same fourteen fields as integers, text and bytes.
//! The conversion (and the refusal of a row idem cannot read) lives here once, so a backend
//! only moves columns in and out of its driver.

use std::time::Duration;

use crate::clock::{Timestamp, duration_millis};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{CompletedBy, FencingToken, Record, StoredResponse};
use crate::scope::Scope;
use crate::store::StoreError;
use crate::store::list::Listed;

/// A record's columns, as stored. Times are milliseconds since the Unix epoch;
/// `expires_at == i64::MAX` means never.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    /// The scope label.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The fingerprint's 32 bytes.
    pub fingerprint: Vec<u8>,
    /// The fencing token, as a signed 64-bit integer (databases have no u64).
    pub token: i64,
    /// When the key was first claimed.
    pub created_at: i64,
    /// When the current lease was granted.
    pub acquired_at: i64,
    /// When the current lease ends.
    pub lease_expires_at: i64,
    /// When the result was stored.
    pub completed_at: Option<i64>,
    /// 0: the executor stored it; 1: an operator did.
    pub completed_by: Option<i64>,
    /// When the record stops existing.
    pub expires_at: i64,
    /// How long a result is kept once completed.
    pub retention_ms: i64,
    /// How many leases were granted.
    pub attempts: i64,
    /// How many replays were served.
    pub replays: i64,
    /// The stored response, encoded by [`StoredResponse::encode`].
    pub response: Option<Vec<u8>>,
}

/// The code stored for who completed a record.
pub const fn completed_by_code(by: CompletedBy) -> i64 {
    match by {
        CompletedBy::Executor => 0,
        CompletedBy::Operator => 1,
    }
}

impl Columns {
    /// The columns of `r`.
    pub fn of(r: &Record) -> Self {
        Columns {
            scope: r.scope.as_str().to_owned(),
            key: r.key.as_str().to_owned(),
            fingerprint: r.fingerprint.as_bytes().to_vec(),
            token: r.token.as_i64(),
            created_at: r.created_at.as_millis(),
            acquired_at: r.acquired_at.as_millis(),
            lease_expires_at: r.lease_expires_at.as_millis(),
            completed_at: r.completed_at.map(Timestamp::as_millis),
            completed_by: r.completed_by.map(completed_by_code),
            expires_at: r.expires_at.as_millis(),
            retention_ms: duration_millis(r.retention),
            attempts: i64::from(r.attempts),
            replays: i64::from(r.replays),
            response: r.response.as_ref().map(StoredResponse::encode),
        }
    }

    /// The record these columns hold. `backend` names the store in the error when a column
    /// holds what idem never writes: such a row is reported as corrupt, never guessed.
    pub fn into_record(self, backend: &str) -> Result<Record, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("{backend} record: {what}"));
        let fingerprint: [u8; 32] = self
            .fingerprint
            .try_into()
            .map_err(|_| corrupt("fingerprint is not 32 bytes".into()))?;
        let response = self
            .response
            .map(|b| StoredResponse::decode(&b))
            .transpose()
            .map_err(|e| corrupt(e.to_string()))?;
        let completed_by = match self.completed_by {
            None => None,
            Some(0) => Some(CompletedBy::Executor),
            Some(1) => Some(CompletedBy::Operator),
            Some(n) => return Err(corrupt(format!("completed_by {n}"))),
        };
        let count =
            |n: i64, what: &str| u32::try_from(n).map_err(|_| corrupt(format!("{what} {n}")));
        let retention = u64::try_from(self.retention_ms)
            .map_err(|_| corrupt(format!("retention {}", self.retention_ms)))?;
        Ok(Record {
            scope: Scope::new(self.scope).map_err(|e| corrupt(e.to_string()))?,
            key: Key::new(self.key).map_err(|e| corrupt(e.to_string()))?,
            fingerprint: Fingerprint::from_bytes(fingerprint),
            token: FencingToken::from_i64(self.token),
            created_at: Timestamp::from_millis(self.created_at),
            acquired_at: Timestamp::from_millis(self.acquired_at),
            lease_expires_at: Timestamp::from_millis(self.lease_expires_at),
            completed_at: self.completed_at.map(Timestamp::from_millis),
            completed_by,
            expires_at: Timestamp::from_millis(self.expires_at),
            retention: Duration::from_millis(retention),
            attempts: count(self.attempts, "attempts")?,
            replays: count(self.replays, "replays")?,
            response,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            scope: Scope::new("s").expect("scope"),
            key: Key::new("k").expect("key"),
            fingerprint: Fingerprint::from_bytes([7; 32]),
            token: FencingToken::from_u64(u64::MAX),
            created_at: Timestamp::from_millis(1),
            acquired_at: Timestamp::from_millis(2),
            lease_expires_at: Timestamp::from_millis(3),
            completed_at: Some(Timestamp::from_millis(4)),
            completed_by: Some(CompletedBy::Operator),
            expires_at: Timestamp::NEVER,
            retention: Duration::from_millis(5),
            attempts: u32::MAX,
            replays: 6,
            response: Some(StoredResponse::new(201, b"ok".to_vec())),
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(Columns::of(&r).into_record("test").ok(), Some(r));
    }

    #[test]
    fn refuses_what_idem_never_writes() {
        let mut c = Columns::of(&sample());
        c.completed_by = Some(2);
        assert!(matches!(c.into_record("t"), Err(StoreError::Corrupt(_))));
        let mut c = Columns::of(&sample());
        c.fingerprint.pop();
        assert!(matches!(c.into_record("t"), Err(StoreError::Corrupt(_))));
        let mut c = Columns::of(&sample());
        c.attempts = -1;
        assert!(matches!(c.into_record("t"), Err(StoreError::Corrupt(_))));
    }
}

/// The columns a listing reads ([`Listed`]): no fingerprint, token or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedColumns {
    /// The scope label.
    pub scope: String,
    /// The key.
    pub key: String,
    /// When the key was first claimed.
    pub created_at: i64,
    /// When the current lease ends.
    pub lease_expires_at: i64,
    /// When the result was stored.
    pub completed_at: Option<i64>,
    /// When the record stops existing.
    pub expires_at: i64,
    /// How many leases were granted.
    pub attempts: i64,
    /// How many replays were served.
    pub replays: i64,
}

impl ListedColumns {
    /// What a listing shows of these columns; a column idem never writes is corrupt, as in
    /// [`Columns::into_record`].
    pub fn into_listed(self, backend: &str) -> Result<Listed, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("{backend} record: {what}"));
        let count =
            |n: i64, what: &str| u32::try_from(n).map_err(|_| corrupt(format!("{what} {n}")));
        Ok(Listed {
            scope: Scope::new(self.scope).map_err(|e| corrupt(e.to_string()))?,
            key: Key::new(self.key).map_err(|e| corrupt(e.to_string()))?,
            created_at: Timestamp::from_millis(self.created_at),
            lease_expires_at: Timestamp::from_millis(self.lease_expires_at),
            completed_at: self.completed_at.map(Timestamp::from_millis),
            expires_at: Timestamp::from_millis(self.expires_at),
            attempts: count(self.attempts, "attempts")?,
            replays: count(self.replays, "replays")?,
        })
    }
}
