//! The reader threads' promises: a read stuck behind a lock answers `Unavailable` at the
//! operation timeout, reads stuck together hold a fixed number of threads (not one each), and
//! reads work again once the lock is gone; a read sees every commit made before it was asked,
//! while other reads' batches are under way. Linux only: the lock is an open file description
//! lock, and threads are counted in /proc.
#![cfg(target_os = "linux")]

use std::path::Path;
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoreError,
    StoredResponse,
};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::testing::open_bounded;

fn req(k: &str) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: Key::new(k).expect("test key"),
        fingerprint: Fingerprint::http("POST", "/x", None, b""),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// This process's threads whose name starts with `prefix` (the kernel keeps 15 bytes of it).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The WAL index's read locks held by someone else, as a crashed process recovering the WAL
/// or a stalled file system would hold up readers: write locks on the five read-mark bytes of
/// `-shm` (offsets 123-127, SQLite's WAL_READ_LOCK(0..4)). They are open file description
/// locks, which conflict with SQLite's POSIX locks even inside this process. Released on drop.
struct ReadLocks {
    /// The locks belong to this open file description: closing it releases them.
    _shm: std::fs::File,
}

impl ReadLocks {
    fn hold(db: &Path) -> Self {
        use nix::fcntl::{FcntlArg, fcntl};
        use nix::libc;
        let shm = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(db.with_extension("db-shm"))
            .expect("open the WAL index");
        let lock = libc::flock {
            l_type: libc::F_WRLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 123,
            l_len: 5,
            l_pid: 0,
        };
        fcntl(&shm, FcntlArg::F_OFD_SETLKW(&lock)).expect("lock the read marks");
        ReadLocks { _shm: shm }
    }
}

/// The tests here count this process's threads, so they take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_reads_answer_at_the_bound_on_a_fixed_set_of_threads() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    // A read stuck on the WAL's read locks retries for about 10 s, whatever the busy
    // timeout, then fails; the operation timeout answers first.
    let store = open_bounded(&path).unwrap();
    let Ok(Claim::Acquired(lease)) = store.claim(req("done")).await else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(
            &Scope::anonymous(),
            &Key::new("done").unwrap(),
            lease.token,
            StoredResponse::new(201, b"ok".to_vec()),
        )
        .await
        .unwrap();
    let readers = threads_named("idem-sqlite-rd");
    assert!(readers >= 2, "{readers} reader threads");

    let tokio_threads = threads_named("tokio-");
    let lock = ReadLocks::hold(&path);
    let started = std::time::Instant::now();
    let reads: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = Key::new(if i == 0 {
                    "done".into()
                } else {
                    format!("k{i}")
                })
                .unwrap();
                store.get(&Scope::anonymous(), &key).await
            })
        })
        .collect();
    for read in reads {
        match read.await.unwrap() {
            Err(e @ StoreError::Unavailable(_)) => {
                assert!(e.to_string().contains("no answer within"), "{e}")
            }
            other => panic!("expected Unavailable at the bound, got {other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the reads waited for the lock, not for their bound"
    );
    // The blocking pool would have started a thread for each stuck read. (The counts are of
    // this process: the other test here waits for `ONE_AT_A_TIME`.)
    assert_eq!(threads_named("idem-sqlite-rd"), readers);
    assert!(
        threads_named("tokio-") <= tokio_threads,
        "reads ran on tokio's blocking pool"
    );

    drop(lock);
    // The threads come back once the lock is gone (the stuck batch's reads were abandoned
    // by their callers), and see the committed record.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match store
            .get(&Scope::anonymous(), &Key::new("done").unwrap())
            .await
        {
            Ok(Some(r)) => {
                assert!(r.response.is_some(), "{r:?}");
                break;
            }
            Err(StoreError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("after the lock: {other:?}"),
        }
    }
}

/// Each task completes a key and reads it straight back, while the other tasks' reads keep the
/// reader threads' batches going: every read must see the completion made before it was asked
/// (a snapshot kept across batches, or taken before the read was queued, would not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_sees_every_commit_made_before_it_was_asked() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).unwrap();
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let name = format!("t{t}-{i}");
                    let key = Key::new(name.as_str()).unwrap();
                    let Ok(Claim::Acquired(lease)) = store.claim(req(&name)).await else {
                        panic!("{name}: a fresh key is acquired");
                    };
                    let in_flight = store.get(&Scope::anonymous(), &key).await.unwrap();
                    assert!(
                        in_flight.is_some_and(|r| r.response.is_none()),
                        "{name}: the claim is visible"
                    );
                    store
                        .complete(
                            &Scope::anonymous(),
                            &key,
                            lease.token,
                            StoredResponse::new(201, name.clone().into_bytes()),
                        )
                        .await
                        .unwrap();
                    let done = store.get(&Scope::anonymous(), &key).await.unwrap();
                    assert!(
                        done.as_ref().is_some_and(|r| r.response.is_some()),
                        "{name}: the completion is visible: {done:?}"
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}
