//! A PostgreSQL standby promoted under keyed load: a private primary and streaming standby
//! ([`idem_conformance::pgcluster`]), a store on a URL naming both
//! (`target_session_attrs=read-write`), the primary crashed (every process SIGKILLed at once)
//! and the standby promoted while workers claim, execute and complete keys. The store must
//! move to the new primary by itself. Then every executed key is retried once, through a
//! fresh store, as a client whose answer was lost would: a retry that acquires is a second
//! execution, the claim having been lost in the failover.
//!
//! With asynchronous replication the store is refused at connect unless the URL says
//! `durability=volatile`, and a few claims may be lost; with `synchronous_standby_names` set
//! it is accepted, and none may be: each claim's commit waited for the standby. Counts are
//! printed (`--nocapture`): docs/benchmarks.md, "PostgreSQL failover". Each mode runs twice:
//! with the standby streaming to the end, and with it lagging 300 ms (the primary's WAL
//! sender stopped), as across a slow link. And with the synchronous standby stalled (no
//! promotion), claims fail closed and leave no backend waiting for it. Skips without `initdb`
//! unless IDEM_REQUIRE_SERVICES=1.
//! About 10 to 25 s per case, so `#[ignore]`d; `.ci/run` runs them in their own step:
//! `cargo test -p idem-store-postgres --test failover -- --ignored --nocapture --test-threads 1`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_conformance::pgbouncer::{PgBouncer, PoolMode};
use idem_conformance::pgcluster::{Cluster, Replication};
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
};
use idem_store_postgres::{PgOptions, PgStore};

/// Concurrent workers, each running one key after another.
const WORKERS: usize = 32;
/// Load before the crash.
const BEFORE: Duration = Duration::from_millis(1500);
/// Load once the store serves again on the new primary.
const AFTER: Duration = Duration::from_millis(1000);
/// The bound on the store finding the new primary.
const MOVE_BOUND: Duration = Duration::from_secs(20);

/// One case at a time: each runs two servers and a loaded store on a small machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e:?}"))
}

fn req(key: &str) -> ClaimRequest {
    ClaimRequest {
        scope: ok(Scope::new("failover")),
        key: ok(Key::new(key)),
        fingerprint: Fingerprint::from_bytes([7; 32]),
        lease: Duration::from_secs(2),
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

async fn open(url: &str) -> Result<PgStore, idem_core::StoreError> {
    let mut opts = ok(PgOptions::from_url(url));
    opts.schema = "idem_failover".into();
    opts.op_timeout = Duration::from_secs(2);
    PgStore::connect(opts).await
}

/// How one key ended for its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Executed,
    Replayed,
    Unknown,
}

/// Runs `key` until a definite answer: retried on store errors (the failover) and while in
/// flight, as a client retries.
async fn run_key(store: &PgStore, key: &str, executions: &Mutex<HashMap<String, u32>>) -> End {
    loop {
        match store.claim(req(key)).await {
            Ok(Claim::Acquired(lease)) => {
                *executions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(key.to_owned())
                    .or_default() += 1;
                // A completion lost to the failover leaves the key in flight, then abandoned.
                let _ = store
                    .complete(
                        &req(key).scope,
                        &req(key).key,
                        lease.token,
                        StoredResponse::new(201, key.as_bytes().to_vec()),
                    )
                    .await;
                return End::Executed;
            }
            Ok(Claim::Completed(_)) => return End::Replayed,
            Ok(Claim::Abandoned(_)) => return End::Unknown,
            Ok(Claim::Mismatch(_)) => panic!("{key}: mismatch"),
            Ok(Claim::InFlight(_)) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// What a failover case found.
#[derive(Debug, Default)]
struct Counts {
    intents: usize,
    executed: usize,
    unknown: usize,
    moved_after: Duration,
    /// Executed keys whose retry acquired again: a second execution.
    duplicates: usize,
    /// Executed keys whose retry found the record in flight or abandoned: the completion
    /// was lost, the claim was not (an unknown outcome, never a second execution).
    completions_lost: usize,
}

/// Runs one case. `lag`: the primary's WAL sender is stopped that long before the crash, as
/// across a slow link; `None`: the standby streams to the end.
async fn failover(test: &str, replication: Replication, lag: Option<Duration>) -> Option<Counts> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = match tokio::task::block_in_place(|| Cluster::start(replication)) {
        Ok(c) => c,
        Err(why) => {
            idem_conformance::skip(test, &why);
            return None;
        }
    };
    let mut url = cluster.url();
    match replication {
        Replication::Asynchronous => {
            let e = open(&url)
                .await
                .map(|_| ())
                .expect_err("an asynchronous standby behind a multi-host URL was accepted");
            assert!(
                e.to_string().contains("synchronous_standby_names")
                    && e.to_string().contains("durability=volatile"),
                "{e}"
            );
            url.push_str("&durability=volatile");
        }
        Replication::Synchronous => {}
    }
    let store = ok(open(&url).await);
    if replication == Replication::Synchronous {
        assert!(store.durability_warnings().is_empty());
    }
    let executions: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let ends: Arc<Mutex<HashMap<String, End>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (store, executions, ends, stop, next) = (
                store.clone(),
                executions.clone(),
                ends.clone(),
                stop.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("k{}", next.fetch_add(1, Ordering::SeqCst));
                    let end = run_key(&store, &key, &executions).await;
                    ends.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key, end);
                }
            })
        })
        .collect();
    tokio::time::sleep(BEFORE).await;
    if let Some(lag) = lag {
        ok(cluster.stall_replication(true));
        tokio::time::sleep(lag).await;
    }
    ok(tokio::task::block_in_place(|| cluster.crash_primary()));
    let crashed = Instant::now();
    ok(tokio::task::block_in_place(|| cluster.promote()));
    // The store moves by itself: a new key acquires once it reaches the new primary.
    let moved_after = loop {
        let probe = format!("probe-{:x}", rand::random::<u64>());
        if let Ok(Claim::Acquired(_)) = store.claim(req(&probe)).await {
            break crashed.elapsed();
        }
        assert!(
            crashed.elapsed() < MOVE_BOUND,
            "the store did not move to the promoted standby within {MOVE_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        ok(tokio::time::timeout(Duration::from_secs(30), w).await)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let executions = executions.lock().map(|m| m.clone()).unwrap_or_default();
    let ends = ends.lock().map(|m| m.clone()).unwrap_or_default();
    for (key, n) in &executions {
        assert_eq!(*n, 1, "{key} executed {n} times during the load");
    }
    // Every executed key retried once through a fresh store, as a client whose answer was
    // lost: nothing carried over from the store that ran it. The promoted standby runs with
    // no standby of its own, which the store refuses on a multi-host URL unless told: the
    // retries accept that.
    let retry_url = if url.contains("durability=volatile") {
        url.clone()
    } else {
        let e = open(&url)
            .await
            .map(|_| ())
            .expect_err("the promoted standby, alone, was accepted on a multi-host URL");
        assert!(e.to_string().contains("synchronous_standby_names"), "{e}");
        format!("{url}&durability=volatile")
    };
    let fresh = ok(open(&retry_url).await);
    let mut counts = Counts {
        intents: ends.len(),
        executed: executions.len(),
        unknown: ends.values().filter(|e| **e == End::Unknown).count(),
        moved_after,
        ..Counts::default()
    };
    for key in executions.keys() {
        match ok(fresh.claim(req(key)).await) {
            Claim::Acquired(_) => counts.duplicates += 1,
            Claim::Completed(_) => {}
            Claim::InFlight(_) | Claim::Abandoned(_) => counts.completions_lost += 1,
            Claim::Mismatch(_) => panic!("{key}: mismatch on retry"),
        }
    }
    eprintln!(
        "failover ({replication:?} replication, standby lagging {lag:?}): {} intents, {} executed, {} unknown outcomes; \
         the store served again {} ms after the crash; retried after: {} duplicate executions \
         (claims lost), {} completions lost (unknown outcome, no second execution)",
        counts.intents,
        counts.executed,
        counts.unknown,
        counts.moved_after.as_millis(),
        counts.duplicates,
        counts.completions_lost
    );
    drop(fresh);
    drop(store);
    drop(cluster);
    Some(counts)
}

/// How long the standby lags before the crash in the lagging cases.
const LAG: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "failover: run by .ci/run's own step (about 10 s a case)"]
async fn a_synchronous_standby_promoted_loses_no_acknowledged_claim() {
    let test = "a_synchronous_standby_promoted_loses_no_acknowledged_claim";
    for lag in [None, Some(LAG)] {
        let Some(counts) = failover(test, Replication::Synchronous, lag).await else {
            return;
        };
        assert!(counts.executed > 0, "no load ran: {counts:?}");
        assert_eq!(counts.duplicates, 0, "lag {lag:?}: {counts:?}");
    }
}

/// Refused without `durability=volatile`; with it, the counts. A lagging asynchronous
/// standby lacks claims the primary acknowledged, and their retries run again: the loss the
/// refusal is about must show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "failover: run by .ci/run's own step (about 10 s a case)"]
async fn an_asynchronous_standby_is_refused_unless_volatile_and_counted() {
    let test = "an_asynchronous_standby_is_refused_unless_volatile_and_counted";
    for lag in [None, Some(LAG)] {
        let Some(counts) = failover(test, Replication::Asynchronous, lag).await else {
            return;
        };
        assert!(counts.executed > 0, "no load ran: {counts:?}");
        if lag.is_some() {
            assert!(
                counts.duplicates > 0,
                "no claim lost by a lagging standby: {counts:?}"
            );
        }
    }
}

/// A synchronous standby that stops acknowledging (its WAL sender stalled) holds every claim's
/// commit: the caller gives up at the operation timeout and the store closes the connection.
/// PostgreSQL's backend does not notice a closed connection while it waits for the standby,
/// and `statement_timeout` does not end that wait, so without a cancel each closed connection
/// would leave a backend waiting for as long as the standby stays away, one more per timeout,
/// until the server's connection slots ran out for every application that shares it. The
/// store cancels the statement of a connection it gives up on before closing it: the wait
/// ends (the commit stays local, its caller having been told the store was unavailable) and
/// the backend exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "failover: run by .ci/run's own step (about 10 s)"]
async fn a_stalled_synchronous_standby_leaves_no_backend_waiting() {
    stalled_standby(
        "a_stalled_synchronous_standby_leaves_no_backend_waiting",
        None,
    )
    .await;
}

/// The same through PgBouncer in transaction mode, where the store sends no cancel (see
/// `Inner::checkout`: PgBouncer 1.18 exits on tokio-postgres's cancel requests). The
/// backends of the claims given up on wait for the standby (which shows no cancel went
/// through), the pooler comes through the stall, and the store serves again once the
/// standby is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "failover: run by .ci/run's own step (about 10 s)"]
async fn behind_pgbouncer_a_stalled_standby_is_waited_out_without_a_cancel() {
    stalled_standby(
        "behind_pgbouncer_a_stalled_standby_is_waited_out_without_a_cancel",
        Some(PoolMode::Transaction),
    )
    .await;
}

async fn stalled_standby(test: &str, pooler: Option<PoolMode>) {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = match tokio::task::block_in_place(|| Cluster::start(Replication::Synchronous)) {
        Ok(c) => c,
        Err(why) => return idem_conformance::skip(test, &why),
    };
    let (url, bouncer) = match pooler {
        None => (cluster.url(), None),
        Some(mode) => {
            let primary = format!("127.0.0.1:{}", cluster.primary);
            match PgBouncer::start_in_front_of(mode, &primary) {
                Ok(b) => (
                    format!("postgres://postgres@127.0.0.1:{}/postgres", b.port),
                    Some(b),
                ),
                Err(why) => return idem_conformance::skip(test, &why),
            }
        }
    };
    let mut opts = ok(PgOptions::from_url(&url));
    opts.schema = "idem_stalled".into();
    opts.op_timeout = Duration::from_millis(400);
    let store = ok(PgStore::connect(opts).await);
    assert_eq!(store.behind_pooler(), bouncer.is_some(), "the route found");
    let waiting = || {
        ok(cluster.psql(
            cluster.primary,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        ))
        .trim()
        .parse::<u32>()
        .unwrap_or(u32::MAX)
    };
    assert!(matches!(
        ok(store.claim(req("before")).await),
        Claim::Acquired(_)
    ));
    ok(cluster.stall_replication(true));
    for round in 0..3 {
        let claims: Vec<_> = (0..4)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.claim(req(&format!("stalled-{round}-{i}"))).await })
            })
            .collect();
        for claim in claims {
            let answer = ok(claim.await);
            assert!(
                answer.is_err(),
                "a claim was acknowledged while its standby was stalled: {answer:?}"
            );
        }
    }
    // The batches give up at their own bound (five operation timeouts) and close their
    // connections; then no backend may be left waiting for the standby.
    // Behind the pooler nothing ends those waits but the standby: the batches are given
    // time to give up and close their connections, which is what PgBouncer must come
    // through.
    let deadline = Instant::now() + Duration::from_secs(if bouncer.is_none() { 10 } else { 3 });
    let mut left = waiting();
    while (left > 0 || bouncer.is_some()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = waiting();
    }
    ok(cluster.stall_replication(false));
    if bouncer.is_none() {
        assert_eq!(
            left, 0,
            "backends still waiting for the stalled standby after the store gave up on them"
        );
    } else {
        assert!(
            left > 0 && left != u32::MAX,
            "no backend waiting for the stalled standby behind the pooler: a cancel went through it?"
        );
    }
    // Replication resumed, the store serves again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Claim::Acquired(_)) = store.claim(req("after")).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no claim acquired after the stall"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
