//! Opening a file: pragmas, and the schema created or checked under a write lock so that two
//! processes opening a new file at once do not both create it.

use std::path::Path;
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

/// The schema version this build writes, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 1;

const SCHEMA_V1: &str = "
CREATE TABLE idem_records (
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    token            INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    acquired_at      INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    completed_at     INTEGER,
    completed_by     INTEGER,
    expires_at       INTEGER NOT NULL,
    retention_ms     INTEGER NOT NULL,
    attempts         INTEGER NOT NULL,
    replays          INTEGER NOT NULL,
    status           INTEGER,
    response         BLOB,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX idem_records_by_expiry ON idem_records (expires_at);
";

pub(crate) fn unavailable(path: &Path, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("sqlite {}: {what}: {e}", path.display()).into())
}

/// The same failure again, for each of several callers that one failure answers (a batch
/// whose transaction or connection failed).
pub(crate) fn unavailable_again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(cause) => StoreError::Unavailable(cause.to_string().into()),
        other => StoreError::Unavailable(other.to_string().into()),
    }
}

/// The writer's page cache, in KiB (about 2,000 pages of 4 KiB with their overhead).
///
/// A larger cache costs more than it saves. After a commit whose b-tree balance swapped two
/// pages' numbers (SQLite's `balance_nonroot` swaps them through the pending-byte page's
/// number, 262,145 with 4 KiB pages, which lies past the end of a file under 1 GiB), the
/// commit drops the cached pages past the file's end by walking every slot of the cache's
/// hash table. The walk grows with the cache: at 64 MiB (16,384 slots) it was 18% of a warm
/// writer's time, and the writer ran 16% fewer claim + complete pairs per second than at
/// 8 MiB. Pages the cache misses come from the WAL or the OS's page cache; with random keys
/// 8 MiB was also 8-10% ahead of 64 MiB on a 1.24 GB file, past where the walk happens
/// (docs/benchmarks.md, "Fifth pass: SQLite's writer").
const WRITER_CACHE_KIB: i64 = 8_192;

/// Opens a connection with the pragmas every idem connection uses.
pub(crate) fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn =
        Connection::open_with_flags(path, flags).map_err(|e| unavailable(path, "open", e))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| unavailable(path, "busy_timeout", e))?;
    Ok(conn)
}

/// Prepares the writer's connection: WAL, fsync on every commit, and the schema.
pub(crate) fn prepare_writer(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| unavailable(path, "enable WAL", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable(
            format!(
                "sqlite {}: WAL mode refused (journal_mode is {mode})",
                path.display()
            )
            .into(),
        ));
    }
    // FULL: the WAL is fsynced at every commit, so an acquired claim survives power loss.
    // (The writer switches to NORMAL for commits that need no fsync; see writer.rs.)
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| unavailable(path, "synchronous", e))?;
    // Checkpoints run on their own thread (checkpoint.rs); this is only the backstop.
    conn.pragma_update(None, "wal_autocheckpoint", 10_000)
        .map_err(|e| unavailable(path, "wal_autocheckpoint", e))?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .map_err(|e| unavailable(path, "cache_size", e))?;
    // A WAL that grew during a burst is cut back to this size once checkpointed.
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
        .map_err(|e| unavailable(path, "journal_size_limit", e))?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| unavailable(path, "lock for schema", e))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| unavailable(path, "read schema version", e))?;
    match version {
        0 => {
            tx.execute_batch(SCHEMA_V1)
                .map_err(|e| unavailable(path, "create schema", e))?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| unavailable(path, "set schema version", e))?;
        }
        SCHEMA_VERSION => {}
        newer => {
            return Err(StoreError::Corrupt(format!(
                "{} has schema version {newer}; this idem reads version {SCHEMA_VERSION} (upgrade idem)",
                path.display()
            )));
        }
    }
    tx.commit()
        .map_err(|e| unavailable(path, "commit schema", e))
}
