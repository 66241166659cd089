//! The shared conformance suite, run against [`PgStore`] on the real server, one schema per
//! case so cases run in parallel and leave nothing behind.

use std::sync::Arc;

use idem_conformance::{Harness, Unavailable};
use idem_core::Clock;
use idem_store_postgres::{PgOptions, PgStore};

/// The server the tests use; `IDEM_TEST_POSTGRES` overrides it.
fn url() -> String {
    std::env::var("IDEM_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

struct Postgres;

impl Harness for Postgres {
    type Store = PgStore;

    async fn open(&self, clock: Arc<dyn Clock>) -> Result<PgStore, Unavailable> {
        let mut opts = PgOptions::from_url(&url()).map_err(|e| Unavailable(e.to_string()))?;
        opts.schema = format!("idem_test_{:016x}", rand::random::<u64>());
        opts.clock = Some(clock);
        opts.op_timeout = std::time::Duration::from_secs(30);
        PgStore::connect(opts)
            .await
            .map_err(|e| Unavailable(format!("PostgreSQL at {}: {e}", url())))
    }

    async fn cleanup(&self, store: &PgStore) {
        if let Err(e) = store.drop_schema().await {
            eprintln!("could not drop schema {}: {e}", store.schema());
        }
    }
}

idem_conformance::conformance_suite!(Postgres);
