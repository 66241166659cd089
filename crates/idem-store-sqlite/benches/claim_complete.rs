//! Claim + complete pairs per second: MemoryStore, SqliteStore (durable, group-committed), and
//! a naive SQLite path as the baseline group commit has to beat: one connection behind a
//! mutex, one fsynced transaction per claim and one per completion. 1 and 32 concurrent
//! claimers.
//!
//! Run: `cargo bench -p idem-store-sqlite --bench claim_complete`
//! Files go to `IDEM_BENCH_DIR` (default: the system temp dir); put it on the disk you deploy
//! on, since the fsync is what is being measured.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idem_conformance::load::{fresh_request as fresh_req, run_concurrent};
use idem_core::{Claim, MemoryStore, Store, StoredResponse};
use idem_store_sqlite::SqliteStore;
use rusqlite::{Connection, TransactionBehavior, params};

async fn pair<S: Store>(store: &S) {
    let req = fresh_req();
    let (scope, key) = (req.scope.clone(), req.key.clone());
    let Ok(Claim::Acquired(lease)) = store.claim(req).await else {
        panic!("a fresh key was not acquired");
    };
    let resp = StoredResponse::new(201, br#"{"charge_id":"ch_123","amount":4900}"#.to_vec());
    if let Err(e) = store.complete(&scope, &key, lease.token, resp).await {
        panic!("complete: {e}");
    }
}

/// `iters` pairs spread over `concurrency` tasks; returns the wall time.
fn run_pairs<S: Store + Clone>(
    rt: &tokio::runtime::Runtime,
    store: &S,
    concurrency: u64,
    iters: u64,
) -> Duration {
    let store = store.clone();
    run_concurrent(rt, concurrency, iters, move || {
        let store = store.clone();
        async move { pair(&store).await }
    })
}

fn bench_dir() -> PathBuf {
    std::env::var_os("IDEM_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from)
}

/// The naive baseline: what a service writes without idem's writer.
fn naive_open(path: &Path) -> Connection {
    let c = Connection::open(path).unwrap_or_else(|e| panic!("{e}"));
    c.busy_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let _: String = c
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{e}"));
    c.pragma_update(None, "synchronous", "FULL")
        .unwrap_or_else(|e| panic!("{e}"));
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS naive (key TEXT PRIMARY KEY, fingerprint BLOB, state INTEGER, response BLOB) WITHOUT ROWID",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    c
}

fn naive_pair(c: &mut Connection) {
    let req = fresh_req();
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap_or_else(|e| panic!("{e}"));
    let exists: bool = tx
        .query_row(
            "SELECT count(*) FROM naive WHERE key = ?1",
            [req.key.as_str()],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!exists);
    tx.execute(
        "INSERT INTO naive (key, fingerprint, state) VALUES (?1, ?2, 0)",
        params![req.key.as_str(), req.fingerprint.as_bytes().as_slice()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    tx.commit().unwrap_or_else(|e| panic!("{e}"));
    c.execute(
        "UPDATE naive SET state = 1, response = ?2 WHERE key = ?1",
        params![req.key.as_str(), b"{\"charge_id\":\"ch_123\"}".as_slice()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

fn naive_run(conn: &Mutex<Connection>, concurrency: u64, iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..concurrency {
            let share = iters / concurrency + u64::from(t < iters % concurrency);
            s.spawn(move || {
                for _ in 0..share {
                    let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
                    naive_pair(&mut c);
                }
            });
        }
    });
    start.elapsed()
}

fn claim_complete(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir_in(bench_dir()).unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("claim_complete");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(20);

    let memory = MemoryStore::new();
    let sqlite = SqliteStore::open(dir.path().join("idem.db")).unwrap_or_else(|e| panic!("{e}"));
    let naive = Mutex::new(naive_open(&dir.path().join("naive.db")));
    for concurrency in [1u64, 32] {
        group.bench_with_input(
            BenchmarkId::new("memory", concurrency),
            &concurrency,
            |b, &n| {
                b.iter_custom(|iters| run_pairs(&rt, &memory, n, iters));
            },
        );
        group.bench_with_input(
            BenchmarkId::new("sqlite", concurrency),
            &concurrency,
            |b, &n| {
                b.iter_custom(|iters| run_pairs(&rt, &sqlite, n, iters));
            },
        );
        group.bench_with_input(
            BenchmarkId::new("sqlite_naive", concurrency),
            &concurrency,
            |b, &n| {
                b.iter_custom(|iters| naive_run(&naive, n, iters));
            },
        );
    }
    group.finish();
}

criterion_group!(benches, claim_complete);
criterion_main!(benches);
