//! Claims per second on PostgreSQL: PgStore against the naive path a service writes by hand,
//! one `INSERT ... ON CONFLICT DO NOTHING` (and for pairs, one `UPDATE`) per request on a
//! pool of the same size. 32 concurrent claimers.
//!
//! Run: `cargo bench -p idem-store-postgres --bench claims` (server from IDEM_TEST_POSTGRES,
//! default postgres://postgres@127.0.0.1:5432/test; a schema of its own, dropped after).
//! IDEM_BENCH_BATCHES sets how many batched statements run at once (default 2).
//!
//! Behind a pooler: `IDEM_BENCH_PGBOUNCER=transaction` (or `session`) starts a private
//! PgBouncer in that mode in front of the server ([`idem_conformance::pgbouncer`]) and runs
//! the store's operations through it (the naive path's named statements would not survive
//! transaction pooling, so it is left out); `?pooler=transaction` in IDEM_TEST_POSTGRES runs
//! the pooled path (unnamed statements, settings per transaction) on a direct connection.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use idem_conformance::load::{
    BODY, claim_fresh, fresh_request as fresh, prepare_replay, replay, run_concurrent,
};
use idem_store_postgres::{PgOptions, PgStore};

const CONCURRENCY: u64 = 32;

#[derive(Clone, Copy)]
enum Op {
    Claim,
    Pair,
    Replay,
    NaiveClaim,
    NaivePair,
}

async fn one(store: &PgStore, naive: &Pool, op: Op) {
    match op {
        Op::Claim => claim_fresh(store, false).await,
        Op::Pair => claim_fresh(store, true).await,
        Op::Replay => replay(store).await,
        Op::NaiveClaim | Op::NaivePair => {
            let r = fresh();
            let c = naive.get().await.unwrap_or_else(|e| panic!("{e}"));
            let stmt = c
                .prepare_cached(
                    "INSERT INTO idem_bench_naive.records (key, fingerprint) VALUES ($1, $2) \
                     ON CONFLICT DO NOTHING",
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let n = c
                .execute(
                    &stmt,
                    &[&r.key.as_str(), &r.fingerprint.as_bytes().as_slice()],
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(n, 1);
            if matches!(op, Op::NaivePair) {
                let stmt = c
                    .prepare_cached(
                        "UPDATE idem_bench_naive.records SET response = $2 WHERE key = $1",
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                c.execute(&stmt, &[&r.key.as_str(), &BODY])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

fn run(
    rt: &tokio::runtime::Runtime,
    store: &PgStore,
    naive: &Pool,
    op: Op,
    iters: u64,
) -> Duration {
    let (store, naive) = (store.clone(), naive.clone());
    run_concurrent(rt, CONCURRENCY, iters, move || {
        let (store, naive) = (store.clone(), naive.clone());
        async move { one(&store, &naive, op).await }
    })
}

fn claims(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut url = std::env::var("IDEM_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let bouncer = std::env::var("IDEM_BENCH_PGBOUNCER").ok().map(|mode| {
        use idem_conformance::pgbouncer::{PgBouncer, PoolMode};
        let mode = match mode.as_str() {
            "transaction" => PoolMode::Transaction,
            "session" => PoolMode::Session,
            other => panic!("IDEM_BENCH_PGBOUNCER={other}: transaction or session"),
        };
        let bouncer = PgBouncer::start(mode).unwrap_or_else(|e| panic!("{e}"));
        url = format!("{}?pooler=transaction", PgBouncer::url(bouncer.port));
        bouncer
    });
    let ops: &[(&str, Op)] = if bouncer.is_some() {
        &[
            ("claim", Op::Claim),
            ("claim_complete", Op::Pair),
            ("replay", Op::Replay),
        ]
    } else {
        &[
            ("claim", Op::Claim),
            ("naive_claim", Op::NaiveClaim),
            ("claim_complete", Op::Pair),
            ("naive_claim_complete", Op::NaivePair),
            ("replay", Op::Replay),
        ]
    };
    let mut opts = PgOptions::from_url(&url).unwrap_or_else(|e| panic!("{e}"));
    opts.schema = "idem_bench".into();
    if let Some(n) = std::env::var("IDEM_BENCH_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        opts.batches_in_flight = n;
    }
    let (store, naive) = rt.block_on(async {
        let store = PgStore::connect(opts.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let manager = Manager::from_config(
            opts.config.clone(),
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let naive = Pool::builder(manager)
            .max_size(opts.pool_size)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        store
            .pool()
            .get()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .batch_execute(
                "DROP SCHEMA IF EXISTS idem_bench_naive CASCADE; CREATE SCHEMA idem_bench_naive;
                 CREATE TABLE idem_bench_naive.records (key text PRIMARY KEY, fingerprint bytea, response bytea);",
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        prepare_replay(&store).await;
        (store, naive)
    });
    let mut group = c.benchmark_group("postgres");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(10);
    for &(name, op) in ops {
        group.bench_with_input(BenchmarkId::new(name, CONCURRENCY), &op, |b, &op| {
            b.iter_custom(|iters| run(&rt, &store, &naive, op, iters));
        });
    }
    group.finish();
    rt.block_on(async {
        let _ = store.drop_schema().await;
        if let Ok(c) = store.pool().get().await {
            let _ = c
                .batch_execute("DROP SCHEMA idem_bench_naive CASCADE")
                .await;
        }
    });
    drop(bouncer);
}

criterion_group!(benches, claims);
criterion_main!(benches);
