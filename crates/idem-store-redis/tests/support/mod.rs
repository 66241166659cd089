//! The conformance harness every Redis test uses: a store on `url` (one server or a cluster),
//! a fresh key prefix per case so cases run side by side and leave nothing behind.

use std::sync::Arc;
use std::time::Duration;

use idem_conformance::{Harness, Unavailable};
use idem_core::Clock;
use idem_store_redis::{Durability, RedisOptions, RedisStore};

pub(crate) struct OnRedis {
    pub(crate) url: String,
    /// Overrides the URL's: the shared test server runs without persistence, and the cases
    /// check behaviour, not durability, so they opt in (tests/durability.rs checks the
    /// refusal).
    pub(crate) durability: Option<Durability>,
}

impl Harness for OnRedis {
    type Store = RedisStore;

    async fn open(&self, clock: Arc<dyn Clock>) -> Result<RedisStore, Unavailable> {
        let mut opts = RedisOptions::from_url(&self.url).map_err(|e| Unavailable(e.to_string()))?;
        opts.prefix = format!("idem-test-{:016x}", rand::random::<u64>());
        opts.clock = Some(clock);
        opts.op_timeout = Duration::from_secs(30);
        if let Some(d) = self.durability {
            opts.durability = d;
        }
        RedisStore::connect(opts)
            .await
            .map_err(|e| Unavailable(format!("Redis at {}: {e}", self.url)))
    }

    async fn cleanup(&self, store: &RedisStore) {
        if let Err(e) = store.delete_all().await {
            eprintln!("could not delete keys under {}: {e}", store.prefix());
        }
    }
}
