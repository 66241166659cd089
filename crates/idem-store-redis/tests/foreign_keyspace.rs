//! The whole conformance suite on a Redis that also holds 150,000 keys that are not this
//! store's: another idem prefix's records and another application's keys, as a shared Redis
//! does. A listing reads this store's own indexes, so it returns the same full pages (with
//! abandoned records first) as on an empty server; it used to SCAN the keyspace, stop after
//! a bounded number of keys and skip records. Runs a private `redis-server`; skips without
//! one unless IDEM_REQUIRE_SERVICES=1.

mod support;

use idem_conformance::redis_servers::{Persistence, RedisServer};
use idem_store_redis::Durability;
use support::OnRedis;

const FOREIGN: usize = 150_000;

/// Writes `FOREIGN` keys: a third as records of another idem prefix in this version's
/// layout, a third in the layout before shards, a third another application's strings.
async fn crowd(url: &str) {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("{e}"));
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for start in (0..FOREIGN).step_by(10_000) {
        let mut pipe = redis::pipe();
        for i in start..start + 10_000 {
            match i % 3 {
                0 => pipe
                    .hset(
                        format!("idem-bench:{{idem-bench.{}}}:r:9:anonymous:k{i}", i % 64),
                        "tok",
                        "1",
                    )
                    .ignore(),
                1 => pipe
                    .hset(format!("idem:r:9:anonymous:k{i}"), "tok", "1")
                    .ignore(),
                _ => pipe.set(format!("sessions:{i}"), "x").ignore(),
            };
        }
        let () = pipe
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let size: usize = redis::cmd("DBSIZE")
        .query_async(&mut con)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(size, FOREIGN);
}

#[test]
fn the_conformance_suite_passes_beside_a_large_foreign_keyspace() {
    let Some(server) = RedisServer::start(
        "the_conformance_suite_passes_beside_a_large_foreign_keyspace",
        Persistence::None,
    ) else {
        return;
    };
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(crowd(&url));
    drop(rt);
    let harness = OnRedis {
        url,
        durability: Some(Durability::Volatile),
    };
    idem_conformance::conformance_sequence!(harness);
    drop(server);
}
