//! What only real OS processes can show: two processes racing on one file, and a process killed
//! with SIGKILL losing no claim it had been told was acquired.
//!
//! The children are this same test binary, re-run with `--ignored --exact child_*` and a role
//! in the environment; the `child_*` entries are ignored in a normal run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Clock, Fingerprint, Key, ManualClock, RecordState, Scope,
    Store, StoredBody, StoredResponse, SystemClock, Timestamp,
};
use idem_store_sqlite::{SqliteOptions, SqliteStore};

const RACE_KEYS: usize = 1000;
const RACE_TASKS: usize = 32;
const CHILD_LEASE: Duration = Duration::from_secs(120);

fn scope() -> Scope {
    Scope::new("processes").expect("test scope")
}

fn key(name: String) -> Key {
    Key::new(name).expect("test key")
}

fn fp(k: &Key) -> Fingerprint {
    Fingerprint::http("POST", &format!("/charge/{k}"), None, b"")
}

fn req(k: Key) -> ClaimRequest {
    ClaimRequest {
        scope: scope(),
        fingerprint: fp(&k),
        key: k,
        lease: CHILD_LEASE,
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

fn spawn_child(entry: &str, db: &Path, extra: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads=1",
    ])
    .env("IDEM_TEST_DB", db)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// The text after `marker` in a child's output line. libtest prints `test child_x ... ` before
/// the child's first line without a newline, so the marker is searched, not expected first.
fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|i| &line[i + marker.len()..])
}

fn child_db() -> PathBuf {
    std::env::var_os("IDEM_TEST_DB")
        .map(PathBuf::from)
        .expect("child entry run without IDEM_TEST_DB; it is started by the process tests")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Child: opens the file, says `READY`, waits for a line on stdin, then claims every race key
/// from 32 tasks, completing the ones it wins with its pid, and prints `WON <pid> <key>` each.
#[test]
#[ignore = "child process entry, run by two_processes_race_on_one_file"]
fn child_race() {
    let db = child_db();
    let rt = runtime();
    let store = SqliteStore::open(&db).expect("open");
    let pid = std::process::id();
    // The second child walks the keys from the other end, so the two meet in the middle
    // even when one starts late.
    let reverse = std::env::var("IDEM_RACE_REVERSE").is_ok_and(|v| v == "1");
    println!("\nREADY");
    let mut go = String::new();
    let _ = std::io::stdin().read_line(&mut go);
    let won: Vec<String> = rt.block_on(async {
        let tasks: Vec<_> = (0..RACE_TASKS)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut won = Vec::new();
                    for j in 0..RACE_KEYS {
                        let i = (j + t * 13) % RACE_KEYS;
                        let i = if reverse { RACE_KEYS - 1 - i } else { i };
                        let k = key(format!("race-{i}"));
                        match store.claim(req(k.clone())).await {
                            Ok(Claim::Acquired(lease)) => {
                                let body = format!("{pid}");
                                if let Err(e) = store
                                    .complete(
                                        &scope(),
                                        &k,
                                        lease.token,
                                        StoredResponse::new(200, body),
                                    )
                                    .await
                                {
                                    panic!("complete {k}: {e}");
                                }
                                won.push(k.to_string());
                            }
                            Ok(Claim::InFlight(_) | Claim::Completed(_)) => {}
                            other => panic!("claim {k}: {other:?}"),
                        }
                    }
                    won
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        all
    });
    for k in won {
        println!("WON {pid} {k}");
    }
}

/// Two processes, 32 tasks each, race over the same 1000 keys in one file: every key is
/// acquired by exactly one of them, and the file holds that winner's result. SQLite does not
/// queue waiting writers fairly: now and then one process's writer takes the lock back after
/// every commit and the other waits until all keys are gone, which is safe but no race. So
/// the race is run again (on a new file, every check repeated) until both processes have won
/// keys, at most three times.
#[test]
fn two_processes_race_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut wins = Vec::new();
    for attempt in 0..3 {
        let per_process = race_once(&dir.path().join(format!("race-{attempt}.db")));
        if per_process.len() == 2 {
            return;
        }
        wins.push(per_process);
    }
    panic!("both processes must win keys for this to be a race; keys won per process: {wins:?}");
}

/// One race on a new file at `db`, every key checked; returns how many keys each process won.
fn race_once(db: &Path) -> std::collections::BTreeMap<String, usize> {
    // Create the file first so the children race on claims, not on creating the schema.
    drop(SqliteStore::open(db).expect("open"));
    let mut children: Vec<Child> = (0..2)
        .map(|i| spawn_child("child_race", db, &[("IDEM_RACE_REVERSE", i.to_string())]))
        .collect();
    // Both children have opened the file before either starts, so they really race.
    let mut outputs: Vec<BufReader<std::process::ChildStdout>> = Vec::new();
    for child in &mut children {
        let mut out = BufReader::new(child.stdout.take().expect("no stdout"));
        let mut line = String::new();
        while !line.contains("READY") {
            line.clear();
            let n = out.read_line(&mut line).expect("read child");
            assert!(n > 0, "a child exited before it was ready");
        }
        outputs.push(out);
    }
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("no stdin");
        writeln!(stdin, "GO").expect("start child");
    }
    let mut winners: std::collections::HashMap<String, Vec<String>> = Default::default();
    for (mut child, out) in children.into_iter().zip(outputs) {
        for line in out.lines() {
            let line = line.expect("read child");
            if let Some(rest) = after(&line, "WON ") {
                let (pid, k) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("bad line {line}"));
                winners
                    .entry(k.to_owned())
                    .or_default()
                    .push(pid.to_owned());
            }
        }
        let status = child.wait().expect("wait");
        assert!(status.success(), "a racing child failed: {status:?}");
    }
    let mut per_process: std::collections::BTreeMap<String, usize> = Default::default();
    for pids in winners.values() {
        for pid in pids {
            *per_process.entry(pid.clone()).or_default() += 1;
        }
    }
    eprintln!("keys won per process: {per_process:?}");
    assert_eq!(winners.len(), RACE_KEYS, "every key is won");
    let rt = runtime();
    let store = SqliteStore::open(db).expect("open");
    for (k, pids) in &winners {
        assert_eq!(pids.len(), 1, "{k} acquired by {pids:?}");
        let rec = rt
            .block_on(store.get(&scope(), &key(k.clone())))
            .expect("get")
            .unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(rec.attempts, 1);
        let body = rec.response.map(|r| r.body);
        assert_eq!(
            body,
            Some(StoredBody::Full(pids[0].clone().into_bytes().into())),
            "{k}"
        );
    }
    per_process
}

/// Child: claims keys from 16 tasks as fast as it can and prints `CLAIMED <key>` as soon as
/// each claim returns Acquired, until it is killed.
#[test]
#[ignore = "child process entry, run by sigkill_loses_no_acknowledged_claim"]
fn child_claim_until_killed() {
    let db = child_db();
    let rt = runtime();
    let store = SqliteStore::open(&db).expect("open");
    rt.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let k = key(format!("kill-{t}-{i}"));
                        match store.claim(req(k.clone())).await {
                            Ok(Claim::Acquired(_)) => {
                                let mut out = std::io::stdout().lock();
                                let _ = writeln!(out, "CLAIMED {k}");
                                let _ = out.flush();
                            }
                            other => panic!("claim {k}: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
}

/// A process claiming keys is killed with SIGKILL mid-stream. Every key it had been told was
/// acquired is in the file, in flight; once the lease ends, each reads as abandoned.
#[test]
fn sigkill_loses_no_acknowledged_claim() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kill.db");
    let mut child = spawn_child("child_claim_until_killed", &db, &[]);
    let stdout = child.stdout.take().expect("no stdout");
    let mut claimed = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child");
        if let Some(k) = after(&line, "CLAIMED ") {
            claimed.push(k.to_owned());
        }
        if claimed.len() == 500 {
            // std's kill() is SIGKILL on Unix: no destructor, no flush, no clean shutdown.
            child.kill().expect("kill");
            break;
        }
    }
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the child was killed, not finished");
    assert_eq!(
        claimed.len(),
        500,
        "the child died before claiming enough keys"
    );

    let now = SystemClock.now();
    let clock = ManualClock::new(now);
    let options = SqliteOptions {
        clock: clock.clone() as Arc<dyn Clock>,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_with(&db, options).expect("reopen");
    let rt = runtime();
    let read_all = |want: RecordState| {
        for k in &claimed {
            let k = key(k.clone());
            let rec = rt
                .block_on(store.get(&scope(), &k))
                .expect("get")
                .unwrap_or_else(|| panic!("acknowledged claim {k} was lost"));
            assert_eq!(rec.fingerprint, fp(&k));
            assert_eq!(rec.state(clock.now()), want, "{k}");
        }
    };
    read_all(RecordState::InFlight);
    clock.set(
        Timestamp::from_millis(now.as_millis())
            .saturating_add(CHILD_LEASE + Duration::from_secs(1)),
    );
    read_all(RecordState::Abandoned);
}
