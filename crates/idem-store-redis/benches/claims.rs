//! Claims per second on Redis: RedisStore against a raw `SET key value NX PX` per request on
//! the same multiplexed connection (the least a client can send to take a key). 32
//! concurrent claimers. `bench/stores.sh` runs redis-benchmark's SET NX beside it.
//!
//! Run: `cargo bench -p idem-store-redis --bench claims` (server from IDEM_TEST_REDIS,
//! default redis://127.0.0.1:6379; keys under a prefix of their own, deleted after).

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idem_conformance::load::{claim_fresh, fresh_request, prepare_replay, replay, run_concurrent};
use idem_store_redis::{Durability, RedisOptions, RedisStore};
use redis::aio::ConnectionManager;

const CONCURRENCY: u64 = 32;

#[derive(Clone, Copy)]
enum Op {
    Claim,
    Pair,
    Replay,
    SetNx,
}

async fn one(store: &RedisStore, raw: &ConnectionManager, op: Op) {
    match op {
        Op::Claim => claim_fresh(store, false).await,
        Op::Pair => claim_fresh(store, true).await,
        Op::Replay => replay(store).await,
        Op::SetNx => {
            let r = fresh_request();
            let mut con = raw.clone();
            let set: Option<String> = redis::cmd("SET")
                .arg(format!("idem-bench-raw:{}", r.key.as_str()))
                .arg(r.fingerprint.as_bytes().as_slice())
                .arg("NX")
                .arg("PX")
                .arg(60_000)
                .query_async(&mut con)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(set.is_some(), "a fresh key was taken");
        }
    }
}

fn claims(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let url =
        std::env::var("IDEM_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let mut opts = RedisOptions::from_url(&url).unwrap_or_else(|e| panic!("{e}"));
    opts.prefix = "idem-bench".into();
    // Measured on whatever the server is configured to do (the machines here: no persistence,
    // which a store refuses by default); docs/benchmarks.md says which.
    opts.durability = Durability::Volatile;
    let (store, raw) = rt.block_on(async {
        let store = RedisStore::connect(opts.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let idem_store_redis::Server::Single(server) = &opts.server else {
            panic!("this benchmark's raw rows need one server, not a cluster")
        };
        let client = redis::Client::open(server.as_str()).unwrap_or_else(|e| panic!("{e}"));
        let raw = ConnectionManager::new(client)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        prepare_replay(&store).await;
        (store, raw)
    });
    let mut group = c.benchmark_group("redis");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(10);
    for (name, op) in [
        ("claim", Op::Claim),
        ("raw_set_nx", Op::SetNx),
        ("claim_complete", Op::Pair),
        ("replay", Op::Replay),
    ] {
        group.bench_with_input(BenchmarkId::new(name, CONCURRENCY), &op, |b, &op| {
            let (store, raw) = (store.clone(), raw.clone());
            let rt = &rt;
            b.iter_custom(move |iters| {
                let (store, raw) = (store.clone(), raw.clone());
                run_concurrent(rt, CONCURRENCY, iters, move || {
                    let (store, raw) = (store.clone(), raw.clone());
                    async move { one(&store, &raw, op).await }
                })
            });
        });
    }
    group.finish();
    rt.block_on(async {
        let _ = store.delete_all().await;
        let mut con = raw.clone();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("idem-bench-raw:*")
            .query_async(&mut con)
            .await
            .unwrap_or_default();
        for chunk in keys.chunks(1000) {
            let _: Result<(), _> = redis::cmd("DEL").arg(chunk).query_async(&mut con).await;
        }
    });
}

criterion_group!(benches, claims);
criterion_main!(benches);
