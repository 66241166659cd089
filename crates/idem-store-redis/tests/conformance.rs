//! The shared conformance suite, run against [`RedisStore`] on the real server, one key
//! prefix per case so cases run in parallel and leave nothing behind.

use std::sync::Arc;

use idem_conformance::{Harness, Unavailable};
use idem_core::Clock;
use idem_store_redis::{Durability, RedisOptions, RedisStore};

/// The server the tests use; `IDEM_TEST_REDIS` overrides it.
fn url() -> String {
    std::env::var("IDEM_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

struct Redis;

impl Harness for Redis {
    type Store = RedisStore;

    async fn open(&self, clock: Arc<dyn Clock>) -> Result<RedisStore, Unavailable> {
        let mut opts = RedisOptions::from_url(&url()).map_err(|e| Unavailable(e.to_string()))?;
        opts.prefix = format!("idem-test-{:016x}", rand::random::<u64>());
        opts.clock = Some(clock);
        opts.op_timeout = std::time::Duration::from_secs(30);
        // The test server runs without persistence: these cases check behaviour, not
        // durability, so they opt in (tests/durability.rs checks the refusal).
        opts.durability = Durability::Volatile;
        RedisStore::connect(opts)
            .await
            .map_err(|e| Unavailable(format!("Redis at {}: {e}", url())))
    }

    async fn cleanup(&self, store: &RedisStore) {
        if let Err(e) = store.delete_all().await {
            eprintln!("could not delete keys under {}: {e}", store.prefix());
        }
    }
}

idem_conformance::conformance_suite!(Redis);
