//! For tests of this store and of what is built on it: the file locked by someone else, and
//! a store that answers a stall at a short bound.

use std::path::Path;
use std::time::Duration;

use idem_core::StoreError;

use crate::{SqliteOptions, SqliteStore, schema};

/// The operation timeout of [`open_bounded`]'s store.
pub const SHORT_BOUND: Duration = Duration::from_millis(500);

/// Opens the store at `path` with a [`SHORT_BOUND`] operation timeout and a busy timeout far
/// longer than any test waits: whatever stalls it (a lock held, a stuck read), the
/// operation timeout is what answers.
pub fn open_bounded(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
    SqliteStore::open_with(
        path,
        SqliteOptions {
            busy_timeout: Duration::from_secs(120),
            op_timeout: SHORT_BOUND,
            ..SqliteOptions::default()
        },
    )
}

/// Another connection holding the file's write lock (`BEGIN IMMEDIATE`), as another process
/// would, until dropped: the writer's transactions wait for it (up to the busy timeout, or
/// their callers up to the operation timeout); reads do not (WAL).
#[derive(Debug)]
pub struct WriteLock(rusqlite::Connection);

impl WriteLock {
    /// Takes the lock; returns once it is held.
    pub fn hold(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let conn =
            rusqlite::Connection::open(path).map_err(|e| schema::unavailable(path, "open", e))?;
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| schema::unavailable(path, "lock", e))?;
        Ok(WriteLock(conn))
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("ROLLBACK");
    }
}
