//! Claim + complete pairs against a SQLite file that may already hold records: the writer at
//! steady state, which `benches/claim_complete.rs` (a fresh file each run) does not reach.
//! A writer's page cache fills as the file grows; costs that grow with the cache, such as
//! the one `WRITER_CACHE_KIB` in `src/schema.rs` avoids, show only on a warm, large file.
//!
//! ```sh
//! cargo run --release -p idem-store-sqlite --example pairs -- FILE PAIRS [CLAIMERS=64] [FIRST=0] [sequential|random]
//! ```
//!
//! Keys are `bench-FIRST` onwards, so a second run over the same file with a larger FIRST
//! claims fresh keys among the first run's records. These sort close together, so
//! consecutive pairs touch the same few leaf pages; `random` spreads the same numbers over
//! the whole key space (`bench-` and a 64-bit mix of the number, as fresh idempotency keys
//! are), so each pair reads a leaf the cache may not hold. docs/benchmarks.md ("Fifth pass:
//! SQLite's writer") fills a file with 600,000 pairs, then measures 800,000 more (`perf`, wall time) or
//! 4,000 under callgrind.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_conformance::load::{request, run_concurrent};
use idem_core::{Claim, Key, Store, StoredResponse};
use idem_store_sqlite::SqliteStore;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pairs: {e}");
            eprintln!("usage: pairs FILE PAIRS [CLAIMERS=64] [FIRST=0] [sequential|random]");
            ExitCode::FAILURE
        }
    }
}

fn number(arg: Option<String>, default: Option<u64>, what: &str) -> Result<u64, String> {
    match (arg, default) {
        (Some(a), _) => a.parse().map_err(|e| format!("{what} {a:?}: {e}")),
        (None, Some(d)) => Ok(d),
        (None, None) => Err(format!("{what} is missing")),
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let file = args.next().ok_or("FILE is missing")?;
    let pairs = number(args.next(), None, "PAIRS")?;
    let claimers = number(args.next(), Some(64), "CLAIMERS")?;
    let first = number(args.next(), Some(0), "FIRST")?;
    let random = match args.next().as_deref() {
        None | Some("sequential") => false,
        Some("random") => true,
        Some(other) => return Err(format!("key order {other:?}: sequential or random")),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let store = SqliteStore::open(&file).map_err(|e| e.to_string())?;
    let next = Arc::new(AtomicU64::new(first));
    let took = run_concurrent(&rt, claimers, pairs, move || {
        let (store, next) = (store.clone(), next.clone());
        async move {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let mut req = request(n);
            if random {
                req.key = Key::new(format!("bench-{:016x}", mix(n)))
                    .unwrap_or_else(|e| panic!("a generated key was refused: {e}"));
            }
            let (scope, key) = (req.scope.clone(), req.key.clone());
            let lease = match store.claim(req).await {
                Ok(Claim::Acquired(lease)) => lease,
                other => panic!("{key}: a fresh key was not acquired: {other:?}"),
            };
            let response =
                StoredResponse::new(201, br#"{"charge_id":"ch_123","amount":4900}"#.to_vec());
            if let Err(e) = store.complete(&scope, &key, lease.token, response).await {
                panic!("{key}: complete: {e}");
            }
        }
    });
    println!(
        "{pairs} pairs in {took:.2?}: {:.0} pairs/s",
        pairs as f64 / took.as_secs_f64()
    );
    Ok(())
}

/// SplitMix64's finaliser: a bijection on u64, so distinct numbers give distinct keys.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
