//! A record as a row, and back. A row idem cannot read is reported as corrupt, never guessed.

use std::time::Duration;

use idem_core::{
    CompletedBy, FencingToken, Fingerprint, Key, Record, Scope, StoreError, StoredResponse,
    Timestamp,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

const COLUMNS: &str = "scope, key, fingerprint, token, created_at, acquired_at, lease_expires_at, \
     completed_at, completed_by, expires_at, retention_ms, attempts, replays, response";

/// A row as read, before validation.
struct RawRow {
    scope: String,
    key: String,
    fingerprint: Vec<u8>,
    token: i64,
    created_at: i64,
    acquired_at: i64,
    lease_expires_at: i64,
    completed_at: Option<i64>,
    completed_by: Option<i64>,
    expires_at: i64,
    retention_ms: i64,
    attempts: i64,
    replays: i64,
    response: Option<Vec<u8>>,
}

fn raw(r: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        scope: r.get(0)?,
        key: r.get(1)?,
        fingerprint: r.get(2)?,
        token: r.get(3)?,
        created_at: r.get(4)?,
        acquired_at: r.get(5)?,
        lease_expires_at: r.get(6)?,
        completed_at: r.get(7)?,
        completed_by: r.get(8)?,
        expires_at: r.get(9)?,
        retention_ms: r.get(10)?,
        attempts: r.get(11)?,
        replays: r.get(12)?,
        response: r.get(13)?,
    })
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("sqlite row: {what}"))
}

impl TryFrom<RawRow> for Record {
    type Error = StoreError;

    fn try_from(r: RawRow) -> Result<Self, StoreError> {
        let fingerprint: [u8; 32] = r
            .fingerprint
            .try_into()
            .map_err(|_| corrupt("fingerprint is not 32 bytes"))?;
        let response = r
            .response
            .map(|b| StoredResponse::decode(&b))
            .transpose()
            .map_err(corrupt)?;
        let completed_by = match r.completed_by {
            None => None,
            Some(0) => Some(CompletedBy::Executor),
            Some(1) => Some(CompletedBy::Operator),
            Some(n) => return Err(corrupt(format!("completed_by {n}"))),
        };
        let count =
            |n: i64, what: &str| u32::try_from(n).map_err(|_| corrupt(format!("{what} {n}")));
        Ok(Record {
            scope: Scope::new(r.scope).map_err(corrupt)?,
            key: Key::new(r.key).map_err(corrupt)?,
            fingerprint: Fingerprint::from_bytes(fingerprint),
            token: FencingToken::from_i64(r.token),
            created_at: Timestamp::from_millis(r.created_at),
            acquired_at: Timestamp::from_millis(r.acquired_at),
            lease_expires_at: Timestamp::from_millis(r.lease_expires_at),
            completed_at: r.completed_at.map(Timestamp::from_millis),
            completed_by,
            expires_at: Timestamp::from_millis(r.expires_at),
            retention: Duration::from_millis(
                u64::try_from(r.retention_ms).map_err(|_| corrupt("negative retention"))?,
            ),
            attempts: count(r.attempts, "attempts")?,
            replays: count(r.replays, "replays")?,
            response,
        })
    }
}

/// Reads (scope, key). The outer error is the database's; the inner, a row idem cannot read.
pub(crate) fn select(
    conn: &Connection,
    scope: &Scope,
    key: &Key,
) -> rusqlite::Result<Result<Option<Record>, StoreError>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM idem_records WHERE scope = ?1 AND key = ?2"
    ))?;
    let row = stmt
        .query_row(params![scope.as_str(), key.as_str()], raw)
        .optional()?;
    Ok(row.map(Record::try_from).transpose())
}

pub(crate) fn upsert(conn: &Connection, r: &Record) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(&format!(
        "INSERT OR REPLACE INTO idem_records ({COLUMNS}, status) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
    ))?;
    let retention_ms = i64::try_from(r.retention.as_millis()).unwrap_or(i64::MAX);
    stmt.execute(params![
        r.scope.as_str(),
        r.key.as_str(),
        r.fingerprint.as_bytes().as_slice(),
        r.token.as_i64(),
        r.created_at.as_millis(),
        r.acquired_at.as_millis(),
        r.lease_expires_at.as_millis(),
        r.completed_at.map(Timestamp::as_millis),
        r.completed_by.map(|b| match b {
            CompletedBy::Executor => 0i64,
            CompletedBy::Operator => 1,
        }),
        r.expires_at.as_millis(),
        retention_ms,
        i64::from(r.attempts),
        i64::from(r.replays),
        r.response.as_ref().map(StoredResponse::encode),
        r.response.as_ref().map(|x| i64::from(x.status)),
    ])?;
    Ok(())
}

pub(crate) fn delete(conn: &Connection, scope: &Scope, key: &Key) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM idem_records WHERE scope = ?1 AND key = ?2")?
        .execute(params![scope.as_str(), key.as_str()])?;
    Ok(())
}

pub(crate) fn count_replays(
    conn: &Connection,
    scope: &Scope,
    key: &Key,
    token: FencingToken,
    n: u32,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE idem_records SET replays = min(replays + ?4, 4294967295) \
         WHERE scope = ?1 AND key = ?2 AND token = ?3",
    )?
    .execute(params![
        scope.as_str(),
        key.as_str(),
        token.as_i64(),
        i64::from(n)
    ])?;
    Ok(())
}

pub(crate) fn purge(conn: &Connection, now: Timestamp, limit: usize) -> rusqlite::Result<usize> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "DELETE FROM idem_records WHERE (scope, key) IN \
         (SELECT scope, key FROM idem_records WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)",
    )?
    .execute(params![now.as_millis(), limit])
}
