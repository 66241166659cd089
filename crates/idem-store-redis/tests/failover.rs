//! Duplicate executions across Redis Cluster failovers, counted: keyed load on the store
//! while masters are SIGKILLed, each while its replica lags [`LAG`] behind (`DEBUG SLEEP`: a
//! slow disk, network or pause), and their replicas promoted, once with the store as it is by
//! default on a replicated deployment (each claim and completion waits for a replica:
//! `WAIT 1`) and once with `durability=volatile` (Redis's asynchronous replication as it
//! is). Each intent runs as an agent runs it: claim, retried on an unavailable store; if
//! acquired, the effect, then the completion, retried too. After the failovers, every intent
//! is retried once more, as by an agent that lost the answer: a key whose result was
//! acknowledged must replay. An execution is counted each time a claim is acquired for a key.
//! The durable store must show 0 duplicates; the volatile count is printed (and published in
//! docs/benchmarks.md), not asserted: it depends on what was in flight at each kill.
//!
//! `#[ignore]`d: `.ci/run` runs it in its own step
//! (`cargo test -p idem-store-redis --test failover -- --ignored --nocapture`).
//! `IDEM_FAILOVERS` sets the number of failovers per run (default 3).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use idem_conformance::redis_servers::RedisCluster;
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoreError,
    StoredResponse,
};
use idem_store_redis::RedisStore;

const WORKERS: usize = 16;

/// How far the failed master's replica has fallen behind when the master is killed.
const LAG: Duration = Duration::from_millis(300);

#[derive(Debug, Default)]
struct Count {
    intents: u64,
    executions: u64,
    duplicated_keys: u64,
    unknown: u64,
}

fn request(key: &Key) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes([7; 32]),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// Runs the effect under `lease` and stores its result, retrying an unavailable store.
async fn execute(store: &RedisStore, key: &Key, lease: &idem_core::Lease) {
    loop {
        match store
            .complete(
                &Scope::anonymous(),
                key,
                lease.token,
                StoredResponse::new(201, "charged"),
            )
            .await
        {
            Ok(_) | Err(StoreError::Stale(_)) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// One intent until a definite answer; how many times its effect ran, or `None` when its
/// outcome is unknown (the record abandoned: nothing more runs without an operator).
async fn intent(store: &RedisStore, key: &Key) -> Option<u64> {
    loop {
        match store.claim(request(key)).await {
            Ok(Claim::Acquired(lease)) => {
                execute(store, key, &lease).await;
                return Some(1);
            }
            Ok(Claim::Completed(_)) => return Some(0),
            Ok(Claim::Abandoned(_)) => return None,
            Ok(Claim::InFlight(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Ok(Claim::Mismatch(r)) => panic!("{key}: mismatch: {r:?}"),
        }
    }
}

/// The retry of an agent that lost the answer, after the failovers: a key whose result was
/// acknowledged must replay; acquired again, the effect runs a second time.
async fn retry(store: &RedisStore, key: &Key) -> u64 {
    loop {
        match store.claim(request(key)).await {
            Ok(Claim::Acquired(lease)) => {
                execute(store, key, &lease).await;
                return 1;
            }
            Ok(_) => return 0,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Load on `url` through `failovers` failovers; the count.
async fn run(cluster: &Arc<Mutex<RedisCluster>>, url: &str, failovers: usize) -> Count {
    let store = RedisStore::connect_url(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let runs: Arc<Mutex<HashMap<u64, Option<u64>>>> = Arc::default();
    let run_id = rand::random::<u32>();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (store, stop, next, runs) = (store.clone(), stop.clone(), next.clone(), runs.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let key = Key::new(format!("failover-{run_id:08x}-{n}"))
                    .unwrap_or_else(|e| panic!("{e}"));
                let ran = intent(&store, &key).await;
                runs.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(n, ran);
            }
        }));
    }
    for _ in 0..failovers {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .fail_over_a_master(LAG);
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let runs = std::mem::take(&mut *runs.lock().unwrap_or_else(|e| e.into_inner()));
    let mut count = Count::default();
    let retried = futures_util::stream::iter(runs)
        .map(|(n, ran)| {
            let store = &store;
            async move {
                let first = ran?;
                let key = Key::new(format!("failover-{run_id:08x}-{n}"))
                    .unwrap_or_else(|e| panic!("{e}"));
                Some(first + retry(store, &key).await)
            }
        })
        .buffer_unordered(WORKERS)
        .collect::<Vec<Option<u64>>>()
        .await;
    for ran in retried {
        count.intents += 1;
        match ran {
            Some(n) => {
                count.executions += n;
                count.duplicated_keys += u64::from(n > 1);
            }
            None => count.unknown += 1,
        }
    }
    let _ = store.delete_all().await;
    count
}

fn failovers() -> usize {
    std::env::var("IDEM_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "failover counts: run by .ci/run's own step"]
async fn duplicates_across_cluster_failovers() {
    let test = "duplicates_across_cluster_failovers";
    let Some(cluster) = tokio::task::spawn_blocking(move || RedisCluster::start(test))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    else {
        return;
    };
    let cluster = Arc::new(Mutex::new(cluster));
    let url = |params: &str| {
        cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .url(params)
    };
    let n = failovers();
    let durable = run(&cluster, &url("?prefix=idem-failover-w"), n).await;
    let volatile = run(
        &cluster,
        &url("?prefix=idem-failover-v&durability=volatile"),
        n,
    )
    .await;
    for (name, c) in [
        ("WAIT 1 (the default)", &durable),
        ("durability=volatile", &volatile),
    ] {
        eprintln!(
            "failover on a Redis Cluster, {name}: {n} master failovers, {} intents, {} executions, \
             {} keys executed more than once, {} unknown outcomes",
            c.intents, c.executions, c.duplicated_keys, c.unknown
        );
    }
    assert!(durable.intents > 0 && volatile.intents > 0, "no load ran");
    assert_eq!(
        durable.duplicated_keys, 0,
        "a claim the durable store acknowledged was lost in a failover: {durable:?}"
    );
    drop(cluster);
}
