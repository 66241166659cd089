//! The shared conformance suite, run against [`idem_store_redis::RedisStore`] on the real
//! server, one key prefix per case so cases run in parallel and leave nothing behind.

mod support;

use idem_store_redis::Durability;
use support::OnRedis;

/// The server the tests use; `IDEM_TEST_REDIS` overrides it.
fn url() -> String {
    std::env::var("IDEM_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

idem_conformance::conformance_suite!(OnRedis {
    url: url(),
    durability: Some(Durability::Volatile),
});
