//! The writer's promises that only SQLite has: every claim is committed under an fsync; the
//! time of a decision is read after the file lock is taken; a locked file fails a batch once,
//! not once per command; a claim whose caller went away is released; a stalled writer answers
//! at the operation timeout; replays beside a batch retried one by one are counted once; and
//! another process's write lock does not hold up the claims a read can answer.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
    SystemClock,
};
use idem_store_sqlite::testing::{WriteLock, open_bounded};
use idem_store_sqlite::{SqliteOptions, SqliteStore};

fn req(k: &str, lease: Duration, on_abandoned: AbandonedPolicy) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: Key::new(k).expect("test key"),
        fingerprint: Fingerprint::http("POST", "/x", None, b""),
        lease,
        retention: Duration::from_secs(3600),
        on_abandoned,
    }
}

/// A claim of `k` with a 30 s lease, under `reject`: the claim most tests make.
fn claim_of(k: &str) -> ClaimRequest {
    req(k, Duration::from_secs(30), AbandonedPolicy::Reject)
}

/// The record's replay count once it reaches `n`, or as it stands after two seconds: counts
/// are written every 250 ms, after their round.
async fn replays_reaching(store: &SqliteStore, scope: &Scope, key: &Key, n: u32) -> u32 {
    let mut replays = 0;
    for _ in 0..100 {
        let record = store.get(scope, key).await.expect("a read");
        replays = record.expect("the record").replays;
        if replays >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replays
}

/// A store's options on the system clock with these two bounds.
fn options(busy_timeout: Duration, op_timeout: Duration) -> SqliteOptions {
    SqliteOptions {
        clock: Arc::new(SystemClock),
        busy_timeout,
        op_timeout,
    }
}

/// Claims `k` and completes it with a 200: a record that replays find.
async fn completed(store: &SqliteStore, k: &str) -> (Scope, Key) {
    let r = claim_of(k);
    let (scope, key) = (r.scope.clone(), r.key.clone());
    let Ok(Claim::Acquired(l)) = store.claim(r).await else {
        panic!("{k}: a fresh key is acquired");
    };
    store
        .complete(&scope, &key, l.token, StoredResponse::new(200, "ok"))
        .await
        .unwrap_or_else(|e| panic!("{k}: {e}"));
    (scope, key)
}

/// A claim of `k` in a task of its own.
fn spawn_claim(
    store: &SqliteStore,
    k: &'static str,
) -> tokio::task::JoinHandle<Result<Claim, idem_core::StoreError>> {
    let store = store.clone();
    tokio::spawn(async move { store.claim(claim_of(k)).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_is_committed_under_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            // Completions are committed without fsync; they must not drag claims along.
            tokio::spawn(async move { completed(&store, &format!("k{i}")).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let stats = store.writer_stats();
    assert_eq!(stats.claims_committed, 200, "{stats:?}");
    assert_eq!(
        stats.claims_fsynced, 200,
        "a claim was answered without an fsync: {stats:?}"
    );
}

/// A lease is measured from when the decision was made under the lock, so a claim that waited
/// for another process's lock is not handed a lease that is already over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_starts_when_the_lock_is_held_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let a = SqliteStore::open(&path).unwrap();
    let b = SqliteStore::open(&path).unwrap(); // another process
    let lease = Duration::from_millis(1000);
    let lock = WriteLock::hold(&path).unwrap();
    let claim = tokio::spawn({
        let a = a.clone();
        async move { a.claim(req("k", lease, AbandonedPolicy::Retry)).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await; // longer than the lease
    drop(lock);
    let got = claim.await.unwrap();
    assert!(matches!(got, Ok(Claim::Acquired(_))), "{got:?}");
    let got_b = b.claim(req("k", lease, AbandonedPolicy::Retry)).await;
    assert!(
        matches!(got_b, Ok(Claim::InFlight(_))),
        "two executors acquired one key: {got_b:?}"
    );
}

/// When another process holds the lock past the busy timeout, the queued claims fail closed
/// together: the writer does not retry them one by one, each waiting out the timeout again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_file_fails_a_batch_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let options = SqliteOptions {
        clock: Arc::new(SystemClock),
        busy_timeout: Duration::from_millis(300),
        // The lock's own timeout fails these claims, not the caller's bound.
        op_timeout: Duration::from_secs(30),
    };
    let store = SqliteStore::open_with(&path, options).unwrap();
    let lock = WriteLock::hold(&path).unwrap();
    let before = store.writer_stats().transactions;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move {
                s.claim(req(
                    &format!("k{i}"),
                    Duration::from_secs(30),
                    AbandonedPolicy::Reject,
                ))
                .await
            })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert!(matches!(r, Err(ref e) if e.is_unavailable()), "{r:?}");
    }
    drop(lock);
    let attempts = store.writer_stats().transactions - before;
    // 20 claims arrive in a few batches; one-by-one retries would make it 20 or more.
    assert!(
        attempts < 10,
        "{attempts} transactions for 20 claims on a locked file"
    );
}

/// A caller that drops its claim before hearing the answer will not execute: the writer
/// releases what it granted, so the key is free instead of turning abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_caller_went_away_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).unwrap();
    let lock = WriteLock::hold(&path).unwrap();
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim(claim_of("k")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // queued behind the lock
    claim.abort();
    let _ = claim.await;
    drop(lock);
    // Let the writer commit the claim and release it.
    let mut last = None;
    for _ in 0..100 {
        last = Some(
            store
                .get(&Scope::anonymous(), &Key::new("k").unwrap())
                .await,
        );
        if matches!(last, Some(Ok(None))) && store.writer_stats().claims_committed == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        store.writer_stats().claims_committed,
        1,
        "the dropped claim was never applied"
    );
    assert!(
        matches!(last, Some(Ok(None))),
        "the orphaned claim was not released: {last:?}"
    );
    let again = store.claim(claim_of("k")).await;
    assert!(
        matches!(again, Ok(Claim::Acquired(ref l)) if l.attempt == 1),
        "{again:?}"
    );
}

/// A write lock held by someone else (here another connection; in the field also a slow disk
/// or a frozen file system) stalls the writer far longer than the operation timeout: each
/// caller hears `Unavailable` at the bound, not when the stall ends. Neither stalled claim is
/// left holding a lease: the one the writer had taken into its transaction is released when
/// it finds its caller gone, the one still queued is never applied; once the lock is
/// released, both keys are free and execute once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_writer_answers_unavailable_at_the_bound_and_grants_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    // The busy timeout is far longer than the test waits: without the operation timeout a
    // claim would wait all of it.
    let store = open_bounded(&path).unwrap();
    let lock = WriteLock::hold(&path).unwrap();
    let claim = |k: &'static str| spawn_claim(&store, k);
    // "a" is taken into a batch and waits on the lock; "b" queues behind it.
    let a = claim("a");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = claim("b");
    for (name, task) in [("a", a), ("b", b)] {
        let answer = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .unwrap_or_else(|_| panic!("claim {name} still waits on the stalled writer"))
            .unwrap();
        match answer {
            Err(e @ idem_core::StoreError::Unavailable(_)) => {
                assert!(e.to_string().contains("no answer within"), "{e}")
            }
            other => panic!("claim {name}: expected Unavailable, got {other:?}"),
        }
    }
    // A read is bounded too, and still answers while the writer is stalled (WAL).
    assert!(matches!(
        store
            .get(&Scope::anonymous(), &Key::new("a").unwrap())
            .await,
        Ok(None)
    ));
    drop(lock);
    for k in ["a", "b"] {
        let again = store.claim(claim_of(k)).await;
        assert!(
            matches!(again, Ok(Claim::Acquired(ref l)) if l.attempt == 1),
            "{k}: {again:?}"
        );
    }
}

/// Replays queued beside a batch that one bad command rolls back (and the writer retries one
/// by one) are answered, and counted once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_beside_a_batch_retried_one_by_one_are_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).unwrap();
    let (scope, key) = completed(&store, "done").await;
    // A command that fails on its own (a constraint), to roll back the batch it is in.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER no_bad BEFORE INSERT ON idem_records WHEN NEW.key = 'bad' \
             BEGIN SELECT RAISE(ABORT, 'bad key'); END;",
        )
        .unwrap();
    let lock = WriteLock::hold(&path).unwrap();
    let claim = |k: &'static str| spawn_claim(&store, k);
    // "first" is taken into a batch that waits on the lock; the rest queue into the next one.
    let first = claim("first");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let replays: Vec<_> = (0..5).map(|_| claim("done")).collect();
    let bad = claim("bad");
    let good = claim("good");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(lock);
    assert!(matches!(first.await.unwrap(), Ok(Claim::Acquired(_))));
    for r in replays {
        let got = r.await.unwrap();
        assert!(matches!(got, Ok(Claim::Completed(_))), "{got:?}");
    }
    let got = bad.await.unwrap();
    assert!(matches!(got, Err(ref e) if e.is_unavailable()), "{got:?}");
    // Acquired only if the batch it shared with "bad" was retried one by one.
    let got = good.await.unwrap();
    assert!(matches!(got, Ok(Claim::Acquired(_))), "{got:?}");
    // Counted within a quarter second or so; then the count must stay exact.
    let replays = replays_reaching(&store, &scope, &key, 5).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let settled = store.get(&scope, &key).await.unwrap().unwrap().replays;
    assert_eq!((replays, settled), (5, 5), "each replay counted once");
}

/// Another process's writer holding the write lock does not hold up what a read can answer:
/// replays, a lease in flight and another fingerprint are answered while the lock stays taken
/// (each would otherwise wait out the busy timeout and fail), a fresh key waits for the lock,
/// and the replays are counted once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_elsewhere_does_not_hold_up_what_a_read_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let options = options(Duration::from_secs(3), Duration::from_secs(30));
    let store = SqliteStore::open_with(&path, options).unwrap();
    let (scope, key) = completed(&store, "done").await;
    assert!(matches!(
        store.claim(claim_of("held")).await,
        Ok(Claim::Acquired(_))
    ));

    let lock = WriteLock::hold(&path).unwrap();
    for _ in 0..3 {
        let got = store.claim(claim_of("done")).await;
        assert!(matches!(got, Ok(Claim::Completed(_))), "{got:?}");
    }
    let got = store.claim(claim_of("held")).await;
    assert!(matches!(got, Ok(Claim::InFlight(_))), "{got:?}");
    let mut other = claim_of("done");
    other.fingerprint = Fingerprint::from_bytes([9; 32]);
    let got = store.claim(other).await;
    assert!(matches!(got, Ok(Claim::Mismatch(_))), "{got:?}");
    // A fresh key must write: it waits for the lock, which outlasts the busy timeout.
    let got = store.claim(claim_of("fresh")).await;
    assert!(matches!(got, Err(ref e) if e.is_unavailable()), "{got:?}");
    drop(lock);

    // The next round writes the replays kept while the lock was taken.
    assert!(matches!(
        store.claim(claim_of("after")).await,
        Ok(Claim::Acquired(_))
    ));
    let replays = replays_reaching(&store, &scope, &key, 3).await;
    assert_eq!(replays, 3);
}

/// A replay queued behind this process's own write, which waits for another process's lock,
/// is answered by a reader thread meanwhile: here the wait (30 s of busy timeout) outlasts the
/// replay's caller (a 1 s bound), so a replay queued behind it would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_behind_a_write_waiting_for_the_lock_is_answered_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let options = options(Duration::from_secs(30), Duration::from_secs(1));
    let store = SqliteStore::open_with(&path, options).unwrap();
    let (scope, key) = completed(&store, "done").await;
    assert!(matches!(
        store.claim(claim_of("held")).await,
        Ok(Claim::Acquired(_))
    ));
    let lock = WriteLock::hold(&path).unwrap();
    let fresh = spawn_claim(&store, "fresh");
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let got = store.claim(claim_of("done")).await;
        assert!(matches!(got, Ok(Claim::Completed(_))), "{got:?}");
    }
    let got = store.claim(claim_of("held")).await;
    assert!(matches!(got, Ok(Claim::InFlight(_))), "{got:?}");
    drop(lock);
    // Acquired, or refused if its caller's bound passed first: either is right here.
    let _ = fresh.await.unwrap();
    let replays = replays_reaching(&store, &scope, &key, 3).await;
    assert_eq!(replays, 3);
}
