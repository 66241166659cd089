//! A record as a row, and back. A row idem cannot read is reported as corrupt, never guessed.

use idem_core::clock::duration_millis;
use idem_core::store::columns::{Columns, ListedColumns, completed_by_code};
use idem_core::store::list::state_rank;
use idem_core::{
    FencingToken, Key, Listed, Record, RecordFilter, Scope, StoreError, StoredResponse, Timestamp,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

/// The columns a record is read from and written to, as a literal: the statements below are
/// built with `concat!` at compile time, not formatted on every call (the writer runs one per
/// claim and per completion).
macro_rules! columns {
    () => {
        "scope, key, fingerprint, token, created_at, acquired_at, lease_expires_at, \
         completed_at, completed_by, expires_at, retention_ms, attempts, replays, response"
    };
}

/// `INTO idem_records (...) VALUES (...)` with a record's columns as `?1` to `?15`, the
/// parameters [`write()`] binds: the one body of every statement that writes a whole record.
macro_rules! into_records {
    () => {
        concat!(
            "INTO idem_records (",
            columns!(),
            ", status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
        )
    };
}

fn raw(r: &Row<'_>) -> rusqlite::Result<Columns> {
    Ok(Columns {
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

/// Reads (scope, key). The outer error is the database's; the inner, a row idem cannot read.
pub(crate) fn select(
    conn: &Connection,
    scope: &Scope,
    key: &Key,
) -> rusqlite::Result<Result<Option<Record>, StoreError>> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        columns!(),
        " FROM idem_records WHERE scope = ?1 AND key = ?2"
    ))?;
    let row = stmt
        .query_row(params![scope.as_str(), key.as_str()], raw)
        .optional()?;
    Ok(row.map(|c| c.into_record("sqlite")).transpose())
}

/// A record's state as `listing_order` ranks it, at `?1`.
const RANK: &str = "(CASE WHEN completed_at IS NOT NULL THEN 2 \
     WHEN lease_expires_at > ?1 THEN 1 ELSE 0 END)";

/// Up to `limit` unexpired records matching `filter` at `now`, in the listing's order
/// (`substr` compares prefixes without LIKE's wildcards; BINARY collation orders bytewise,
/// as `listing_order` does).
/// Only the columns a listing shows ([`Listed`]): never the response.
pub(crate) fn list(
    conn: &Connection,
    filter: &RecordFilter,
    now: Timestamp,
    limit: usize,
) -> rusqlite::Result<Result<Vec<Listed>, StoreError>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT scope, key, created_at, lease_expires_at, completed_at, expires_at, attempts, \
         replays FROM idem_records WHERE expires_at > ?1 \
         AND substr(key, 1, length(?2)) = ?2 AND substr(scope, 1, length(?3)) = ?3 \
         AND (?4 IS NULL OR {RANK} = ?4) \
         ORDER BY {RANK}, created_at DESC, scope, key LIMIT ?5"
    ))?;
    let rank = filter.state.map(|s| i64::from(state_rank(s)));
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt
        .query_map(
            params![
                now.as_millis(),
                filter.key_prefix,
                filter.scope_prefix,
                rank,
                limit
            ],
            |r| {
                Ok(ListedColumns {
                    scope: r.get(0)?,
                    key: r.get(1)?,
                    created_at: r.get(2)?,
                    lease_expires_at: r.get(3)?,
                    completed_at: r.get(4)?,
                    expires_at: r.get(5)?,
                    attempts: r.get(6)?,
                    replays: r.get(7)?,
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<ListedColumns>>>()?;
    Ok(rows.into_iter().map(|c| c.into_listed("sqlite")).collect())
}

/// Writes `r`, over any row of the same (scope, key).
pub(crate) fn upsert(conn: &Connection, r: &Record) -> rusqlite::Result<()> {
    write(conn, r, concat!("INSERT OR REPLACE ", into_records!()))?;
    Ok(())
}

/// Writes `r` only if no row of its (scope, key) exists; whether it did. (`ON CONFLICT ... DO
/// NOTHING` passes over the primary key's conflict alone, where `INSERT OR IGNORE` would also
/// pass over a broken `NOT NULL`.)
pub(crate) fn insert_new(conn: &Connection, r: &Record) -> rusqlite::Result<bool> {
    let sql = concat!(
        "INSERT ",
        into_records!(),
        " ON CONFLICT (scope, key) DO NOTHING"
    );
    let inserted = write(conn, r, sql)?;
    Ok(inserted == 1)
}

/// Runs `sql`, a statement built on [`into_records!`]; the rows it changed.
fn write(conn: &Connection, r: &Record, sql: &str) -> rusqlite::Result<usize> {
    let mut stmt = conn.prepare_cached(sql)?;
    // Borrowed from the record, not copied into `Columns`: this runs for every claim and
    // completion on the writer thread.
    stmt.execute(params![
        r.scope.as_str(),
        r.key.as_str(),
        r.fingerprint.as_bytes().as_slice(),
        r.token.as_i64(),
        r.created_at.as_millis(),
        r.acquired_at.as_millis(),
        r.lease_expires_at.as_millis(),
        r.completed_at.map(Timestamp::as_millis),
        r.completed_by.map(completed_by_code),
        r.expires_at.as_millis(),
        duration_millis(r.retention),
        i64::from(r.attempts),
        i64::from(r.replays),
        r.response.as_ref().map(StoredResponse::encode),
        r.response.as_ref().map(|x| i64::from(x.status)),
    ])
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
