//! The shared conformance suite, run against [`SqliteStore`] on a fresh file per case.

use std::sync::Arc;

use idem_conformance::{Harness, Unavailable};
use idem_core::Clock;
use idem_store_sqlite::{SqliteOptions, SqliteStore};

struct Sqlite;

impl Harness for Sqlite {
    type Store = SqliteStore;

    async fn open(&self, clock: Arc<dyn Clock>) -> Result<SqliteStore, Unavailable> {
        // Each case gets its own directory; `cleanup` removes it once the case passed.
        let dir = tempfile::tempdir().map_err(|e| Unavailable(e.to_string()))?;
        let path = dir.keep().join("idem.db");
        SqliteStore::open_with(
            &path,
            SqliteOptions {
                clock,
                ..SqliteOptions::default()
            },
        )
        .map_err(|e| Unavailable(e.to_string()))
    }

    async fn cleanup(&self, store: &SqliteStore) {
        if let Some(dir) = store.path().parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

idem_conformance::conformance_suite!(Sqlite);
