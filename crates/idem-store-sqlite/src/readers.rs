//! Read connections, pooled. In WAL mode a reader sees the last commit and never waits for the
//! writer, so lookups stay fast while a batch is being synced.
//!
//! Reads run on tokio's blocking pool (see `SqliteStore::read`), never on an async worker: a
//! read can wait for a lock (another connection recovering the WAL after a crash), up to the
//! busy timeout, or block in the kernel on a stalled file system, and its caller gives up at
//! the store's operation timeout either way.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use idem_core::StoreError;
use rusqlite::Connection;

use crate::schema;

/// Idle connections kept; more may be open while busy, and are closed when returned. Reads
/// run on the blocking pool, so as many may be under way as there are concurrent requests.
const KEEP_IDLE: usize = 32;

pub(crate) struct Readers {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    pub(crate) fn new(path: &Path, busy_timeout: Duration) -> Self {
        Readers {
            path: path.to_path_buf(),
            busy_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on a read connection, on a blocking thread.
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match pooled {
            Some(c) => c,
            None => self.open()?,
        };
        match f(&conn) {
            Ok(result) => {
                self.put_back(conn);
                result
            }
            // A connection that failed is dropped, not pooled: the next read opens afresh.
            Err(e) => Err(schema::unavailable(&self.path, "read", e)),
        }
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
