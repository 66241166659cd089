//! The shared conformance suite, run against [`PgStore`] on the real server, one schema per
//! case so cases run in parallel and leave nothing behind; and again through PgBouncer in
//! transaction mode (the store finds out by itself: PgBouncer refuses its startup options)
//! and in session mode (the URL says `pooler=transaction`), each a private PgBouncer in
//! front of the same server ([`idem_conformance::pgbouncer`]).

use std::sync::Arc;

use idem_conformance::pgbouncer::{PgBouncer, PoolMode};
use idem_conformance::{Harness, Unavailable};
use idem_core::Clock;
use idem_store_postgres::{PgOptions, PgStore};

/// The server the tests use; `IDEM_TEST_POSTGRES` overrides it.
fn url() -> String {
    std::env::var("IDEM_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The server itself, or a private PgBouncer in front of it.
struct Postgres(Route);

enum Route {
    Direct,
    Bouncer(PoolMode, &'static str),
}

impl Postgres {
    fn url(&self) -> Result<String, Unavailable> {
        match self.0 {
            Route::Direct => Ok(url()),
            Route::Bouncer(mode, params) => PgBouncer::shared(mode)
                .map(|port| format!("{}{params}", PgBouncer::url(port)))
                .map_err(Unavailable),
        }
    }
}

impl Harness for Postgres {
    type Store = PgStore;

    async fn open(&self, clock: Arc<dyn Clock>) -> Result<PgStore, Unavailable> {
        let url = self.url()?;
        let mut opts = PgOptions::from_url(&url).map_err(|e| Unavailable(e.to_string()))?;
        opts.schema = format!("idem_test_{:016x}", rand::random::<u64>());
        opts.clock = Some(clock);
        opts.op_timeout = std::time::Duration::from_secs(30);
        PgStore::connect(opts)
            .await
            .map_err(|e| Unavailable(format!("PostgreSQL at {url}: {e}")))
    }

    async fn cleanup(&self, store: &PgStore) {
        if let Err(e) = store.drop_schema().await {
            eprintln!("could not drop schema {}: {e}", store.schema());
        }
    }
}

idem_conformance::conformance_suite!(Postgres(Route::Direct));

mod through_pgbouncer_in_transaction_mode {
    use super::*;
    idem_conformance::conformance_suite!(Postgres(Route::Bouncer(PoolMode::Transaction, "")));
}

mod through_pgbouncer_in_session_mode {
    use super::*;
    idem_conformance::conformance_suite!(Postgres(Route::Bouncer(
        PoolMode::Session,
        "?pooler=transaction"
    )));
}
