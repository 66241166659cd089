//! Read connections, pooled. In WAL mode a reader sees the last commit and never waits for the
//! writer, so lookups stay fast while a batch is being synced.
//!
//! A read is a primary-key lookup that takes microseconds, so it runs on the caller's thread:
//! handing it to a blocking pool would cost more than the read. The one case where a WAL reader
//! can wait (another connection recovering the WAL after a crash) is detected: the first
//! attempt runs with no busy timeout, and only a `SQLITE_BUSY` answer sends the read to tokio's
//! blocking pool to wait there, so an async worker never sleeps on a lock.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::{Connection, ErrorCode};

use crate::schema;

/// Idle connections kept; more may be open while busy, and are closed when returned.
const KEEP_IDLE: usize = 8;

pub(crate) struct Readers {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
}

/// How long a read may wait for a lock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// Not at all: for reads on an async worker.
    None,
    /// Up to the store's busy timeout: for reads on a blocking thread.
    Full,
}

/// A read that could not proceed without waiting.
pub(crate) struct WouldWait;

impl Readers {
    pub(crate) fn new(path: &Path, busy_timeout: Duration) -> Self {
        Readers {
            path: path.to_path_buf(),
            busy_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on a read connection.
    pub(crate) fn with<T>(
        &self,
        patience: Patience,
        f: impl FnOnce(&Connection) -> rusqlite::Result<Result<T, StoreError>>,
    ) -> Result<Result<T, StoreError>, WouldWait> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match pooled {
            Some(c) => c,
            None => match self.open() {
                Ok(c) => c,
                Err(e) => return Ok(Err(e)),
            },
        };
        let timeout = match patience {
            Patience::None => Duration::ZERO,
            Patience::Full => self.busy_timeout,
        };
        if let Err(e) = conn.busy_timeout(timeout) {
            return Ok(Err(schema::unavailable(&self.path, "busy_timeout", e)));
        }
        let out = f(&conn);
        if let Err(rusqlite::Error::SqliteFailure(e, _)) = &out
            && matches!(e.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
            && matches!(patience, Patience::None)
        {
            self.put_back(conn);
            return Err(WouldWait);
        }
        Ok(match out {
            Ok(result) => {
                self.put_back(conn);
                result
            }
            // A connection that failed is dropped, not pooled: the next read opens afresh.
            Err(e) => Err(schema::unavailable(&self.path, "read", e)),
        })
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let c = schema::connect(&self.path, self.busy_timeout)?;
        c.pragma_update(None, "query_only", true)
            .map_err(|e| schema::unavailable(&self.path, "query_only", e))?;
        Ok(c)
    }

    fn put_back(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < KEEP_IDLE {
            idle.push(conn);
        }
    }
}
