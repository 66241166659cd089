//! Several processes on one SQLite file, as a service under several workers runs: each
//! [`SqliteStore`] here has its own writer and connections, as each process would. Store 0
//! claims fresh keys; stores 1 – 4 replay completed keys (no completed-record cache in front,
//! as in the language packages) and poll a key in flight every 25 ms, as a waiting duplicate
//! does. It prints the replays' rate and latency, the fresh claims' rate, how many of either
//! answered `store unavailable` at the bound, the WAL's peak size, and the replays counted in
//! the file against those answered.
//!
//! ```sh
//! cargo run --release -p idem-store-sqlite --example contention -- [SECONDS=5] [BOUND_MS=500]
//! ```
//!
//! docs/benchmarks.md ("Sixth pass: every claim to the writer") compares the writer's
//! versions with it: a replay that took the file's write lock starved the claiming store.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
};
use idem_store_sqlite::{SqliteOptions, SqliteStore};

/// Completed keys the replaying stores pick from.
const COMPLETED: u64 = 2_000;
/// Replay loops per replaying store, and claim loops in the claiming one.
const REPLAYERS: usize = 4;
const CLAIMERS: usize = 16;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("contention: {e}");
            eprintln!("usage: contention [SECONDS=5] [BOUND_MS=500]");
            ExitCode::FAILURE
        }
    }
}

fn number(arg: Option<String>, default: u64, what: &str) -> Result<u64, String> {
    arg.map_or(Ok(default), |a| {
        a.parse().map_err(|e| format!("{what} {a:?}: {e}"))
    })
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let run_for = Duration::from_secs(number(args.next(), 5, "SECONDS")?);
    let bound = Duration::from_millis(number(args.next(), 500, "BOUND_MS")?);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("idem.db");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let stores = (0..5)
            .map(|_| SqliteStore::open_with(&path, SqliteOptions::with_timeout(bound)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        seed(&stores[0]).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let claimed = Arc::new(Tally::default());
        let claimers: Vec<_> = (0..CLAIMERS)
            .map(|t| {
                tokio::spawn(claim_fresh(
                    stores[0].clone(),
                    t,
                    stop.clone(),
                    claimed.clone(),
                ))
            })
            .collect();
        let replayed = Arc::new(Tally::default());
        let polled = Arc::new(Tally::default());
        let mut loops = Vec::new();
        for (i, store) in stores.iter().enumerate().skip(1) {
            for t in 0..REPLAYERS {
                let seed = (i * REPLAYERS + t) as u64;
                loops.push(tokio::spawn(replay(
                    store.clone(),
                    seed,
                    stop.clone(),
                    replayed.clone(),
                )));
            }
            loops.push(tokio::spawn(poll(
                store.clone(),
                stop.clone(),
                polled.clone(),
            )));
        }
        let wal = path.with_extension("db-wal");
        let started = Instant::now();
        let mut wal_peak = 0;
        while started.elapsed() < run_for {
            wal_peak = wal_peak.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut latencies = Vec::new();
        for l in loops {
            latencies.extend(l.await.map_err(|e| e.to_string())?);
        }
        for c in claimers {
            c.await.map_err(|e| e.to_string())?;
        }
        let secs = run_for.as_secs_f64();
        latencies.sort_unstable();
        let at = |q: f64| {
            let i = ((latencies.len().saturating_sub(1)) as f64 * q).round() as usize;
            latencies
                .get(i)
                .map_or(0.0, |d: &Duration| d.as_secs_f64() * 1e3)
        };
        println!(
            "replays and polls: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} unavailable",
            replayed.ok.load(Ordering::Relaxed) as f64 / secs,
            at(0.5),
            at(0.99),
            at(1.0),
            replayed.unavailable.load(Ordering::Relaxed)
                + polled.unavailable.load(Ordering::Relaxed),
        );
        println!(
            "fresh claims: {:.0}/s, {} unavailable; WAL peak {} MB",
            claimed.ok.load(Ordering::Relaxed) as f64 / secs,
            claimed.unavailable.load(Ordering::Relaxed),
            wal_peak / 1_000_000,
        );
        for s in &stores {
            s.close();
        }
        Ok::<_, String>(())
    })?;
    let conn = rusqlite::Connection::open(&path).map_err(|e| e.to_string())?;
    let counted: i64 = conn
        .query_row(
            "SELECT coalesce(sum(replays), 0) FROM idem_records WHERE key LIKE 'done-%'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    println!("replays counted in the file: {counted}");
    Ok(())
}

/// Answers of one kind, counted.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    unavailable: AtomicU64,
}

impl Tally {
    fn count(&self, answered: Result<bool, idem_core::StoreError>) -> Result<(), String> {
        match answered {
            Ok(true) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err(e) if e.is_unavailable() => self.unavailable.fetch_add(1, Ordering::Relaxed),
            Ok(false) => return Err("an unexpected answer".into()),
            Err(e) => return Err(e.to_string()),
        };
        Ok(())
    }
}

fn key(name: String) -> Result<Key, String> {
    Key::new(name).map_err(|e| e.to_string())
}

/// A claim of `key`, the same request every time (a lease longer than any run).
fn request(key: Key) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key,
        fingerprint: Fingerprint::http("POST", "/v1/charges", None, b"{}"),
        lease: Duration::from_secs(3600),
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// Completed keys `done-0` … and one key held in flight, `held`.
async fn seed(store: &SqliteStore) -> Result<(), String> {
    for i in 0..COMPLETED {
        let k = key(format!("done-{i}"))?;
        let Ok(Claim::Acquired(lease)) = store.claim(request(k.clone())).await else {
            return Err(format!("done-{i} was not acquired"));
        };
        store
            .complete(
                &Scope::anonymous(),
                &k,
                lease.token,
                StoredResponse::new(200, "ok"),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    match store.claim(request(key("held".into())?)).await {
        Ok(Claim::Acquired(_)) => Ok(()),
        other => Err(format!("held: {other:?}")),
    }
}

async fn claim_fresh(store: SqliteStore, t: usize, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let Ok(k) = key(format!("new-{t}-{n}")) else {
            return;
        };
        let got = store.claim(request(k)).await;
        if let Err(e) = tally.count(got.map(|c| matches!(c, Claim::Acquired(_)))) {
            eprintln!("fresh claim: {e}");
        }
    }
}

/// Replays of completed keys in a pseudo-random order; returns each one's latency.
async fn replay(
    store: SqliteStore,
    seed: u64,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<Duration> {
    let mut x = 0x9E37_79B9_7F4A_7C15 ^ seed;
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let Ok(k) = key(format!("done-{}", x % COMPLETED)) else {
            break;
        };
        let completed = |c: &Claim| matches!(c, Claim::Completed(_));
        timed_claim(&store, k, completed, &tally, &mut latencies, "replay").await;
    }
    latencies
}

/// A waiting duplicate's poll of the key in flight, every 25 ms.
async fn poll(store: SqliteStore, stop: Arc<AtomicBool>, tally: Arc<Tally>) -> Vec<Duration> {
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let Ok(k) = key("held".into()) else { break };
        let in_flight = |c: &Claim| matches!(c, Claim::InFlight(_));
        timed_claim(&store, k, in_flight, &tally, &mut latencies, "poll").await;
    }
    latencies
}

/// Claims `k`, adding its latency to `latencies` and to `tally` whether it was `expected`.
async fn timed_claim(
    store: &SqliteStore,
    k: Key,
    expected: fn(&Claim) -> bool,
    tally: &Tally,
    latencies: &mut Vec<Duration>,
    what: &str,
) {
    let started = Instant::now();
    let got = store.claim(request(k)).await;
    latencies.push(started.elapsed());
    if let Err(e) = tally.count(got.map(|c| expected(&c))) {
        eprintln!("{what}: {e}");
    }
}
