//! For tests of this store and of what is built on it: the file locked by someone else.

use std::path::Path;

use idem_core::StoreError;

use crate::schema;

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
