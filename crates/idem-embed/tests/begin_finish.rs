//! The blocking halves on real stores: what a binding's call comes to.

use std::time::Duration;

use idem_embed::{KeyFields, PriorKind, Report, Saved, Started, Store, ToolPolicy};
use serde_json::json;

mod support;
use support::returned;

fn policy(wait: Option<Duration>) -> ToolPolicy {
    support::policy(Duration::from_secs(5), wait, "reject")
}

fn execute(store: &Store, key: &str, args: serde_json::Value) -> idem_embed::Ticket {
    match store
        .begin(key, "charge", &args, None, &policy(None))
        .expect("the store answers")
    {
        Started::Execute(t) => t,
        Started::Prior(p) => panic!("expected to execute, got {p:?}"),
    }
}

fn prior(store: &Store, key: &str, args: serde_json::Value) -> idem_embed::Prior {
    match store
        .begin(key, "charge", &args, None, &policy(None))
        .expect("the store answers")
    {
        Started::Prior(p) => p,
        Started::Execute(_) => panic!("expected a prior answer"),
    }
}

fn each_store(test: impl Fn(&Store)) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    test(&Store::open("memory:").expect("memory store"));
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    test(&Store::open(&url).expect("SQLite store"));
}

#[test]
fn a_result_is_stored_and_replayed_with_its_counters() {
    each_store(|store| {
        let t = execute(store, "k-result", json!({"a": 1}));
        assert_eq!(
            t.finish(returned(r#"{"id":"ch_1"}"#)).unwrap(),
            Saved::Stored
        );
        let p = prior(store, "k-result", json!({"a": 1}));
        assert_eq!(p.kind, PriorKind::Replayed);
        assert_eq!(p.body.as_deref(), Some(br#"{"id":"ch_1"}"#.as_slice()));
        assert_eq!(p.media_type.as_deref(), Some("application/json"));
        assert_eq!((p.status, p.attempts, p.state), (Some(200), 1, "completed"));
        let found = store.record("k-result").unwrap().unwrap();
        assert_eq!(found.kind, PriorKind::Found);
        assert!(found.expires_at_ms.is_some());
        assert!(store.record("k-absent").unwrap().is_none());
    });
}

#[test]
fn not_run_releases_and_unknown_abandons() {
    each_store(|store| {
        let t = execute(store, "k-release", json!({}));
        assert_eq!(t.finish(Report::NotRun).unwrap(), Saved::Released);
        // Released: the retry runs.
        let _ = execute(store, "k-release", json!({}));

        let t = execute(store, "k-unknown", json!({}));
        assert_eq!(t.finish(Report::Unknown).unwrap(), Saved::MarkedUnknown);
        let p = prior(store, "k-unknown", json!({}));
        assert_eq!((p.kind, p.state), (PriorKind::Unknown, "abandoned"));
    });
}

#[test]
fn other_arguments_under_one_key_are_a_mismatch_unless_outside_the_key_fields() {
    each_store(|store| {
        let t = execute(store, "k-mismatch", json!({"a": 1}));
        t.finish(returned("1")).unwrap();
        assert_eq!(
            prior(store, "k-mismatch", json!({"a": 2})).kind,
            PriorKind::Mismatch
        );

        let fields = KeyFields::parse(["a"]).unwrap();
        let begin = |args| {
            store
                .begin("k-fields", "charge", &args, Some(&fields), &policy(None))
                .unwrap()
        };
        match begin(json!({"a": 1, "at": "10:00"})) {
            Started::Execute(t) => t.finish(returned("1")).unwrap(),
            Started::Prior(p) => panic!("{p:?}"),
        };
        match begin(json!({"a": 1, "at": "10:05"})) {
            Started::Prior(p) => assert_eq!(p.kind, PriorKind::Replayed),
            Started::Execute(_) => panic!("noise outside the key fields ran the call again"),
        }
    });
}

#[test]
fn a_duplicate_in_flight_is_answered_at_once_without_a_wait_and_waits_with_one() {
    each_store(|store| {
        let t = execute(store, "k-flight", json!({}));
        assert_eq!(
            prior(store, "k-flight", json!({})).kind,
            PriorKind::InFlight
        );
        let waiter = {
            let store = store.clone();
            std::thread::spawn(move || {
                store
                    .begin(
                        "k-flight",
                        "charge",
                        &json!({}),
                        None,
                        &policy(Some(Duration::from_secs(10))),
                    )
                    .unwrap()
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        t.finish(returned("\"done\"")).unwrap();
        match waiter.join().unwrap() {
            Started::Prior(p) => {
                assert_eq!(p.kind, PriorKind::Replayed);
                assert_eq!(p.body.as_deref(), Some(b"\"done\"".as_slice()));
            }
            Started::Execute(_) => panic!("the waiter ran the call again"),
        }
    });
}

#[test]
fn a_dropped_ticket_leaves_the_record_to_be_abandoned() {
    let store = Store::open("memory:").unwrap();
    let short = ToolPolicy::new(
        Duration::from_secs(1),
        Duration::from_secs(3600),
        None,
        "reject",
        1024,
    )
    .unwrap();
    match store
        .begin("k-drop", "t", &json!({}), None, &short)
        .unwrap()
    {
        Started::Execute(t) => drop(t),
        Started::Prior(p) => panic!("{p:?}"),
    }
    std::thread::sleep(Duration::from_millis(1300));
    let p = store.record("k-drop").unwrap().unwrap();
    assert_eq!(p.state, "abandoned");
}

#[test]
fn bad_values_are_refused_before_anything_runs() {
    assert!(Store::open("nope").is_err());
    assert!(
        ToolPolicy::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
            None,
            "reject",
            1
        )
        .is_err()
    );
    let e = ToolPolicy::new(
        Duration::from_secs(5),
        Duration::from_secs(60),
        None,
        "maybe",
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("maybe"), "{e}");
    let store = Store::open("memory:").unwrap();
    assert!(
        store
            .begin("bad key", "t", &json!({}), None, &policy(None))
            .is_err()
    );
}

/// The halves that do not block (`begin_then`, `finish_then`: Node's event loop calls them)
/// come to what the blocking ones do, and a duplicate waiting through them holds no thread:
/// more waiters than the runtime has workers all get the first call's result, which a wait
/// that blocked a worker would have held back until their wait ran out.
#[test]
fn the_halves_that_do_not_block_answer_alike_and_their_waits_hold_no_thread() {
    each_store(|store| {
        let (tx, rx) = std::sync::mpsc::channel();
        let begin = |key: &str, wait: Option<Duration>, tx: std::sync::mpsc::Sender<_>| {
            store
                .begin_then(
                    key,
                    "charge",
                    &json!({"a": 1}),
                    None,
                    &policy(wait),
                    move |r| {
                        tx.send(r.expect("the store answers"))
                            .expect("the test listens");
                    },
                )
                .expect("a valid call");
        };
        begin("k-then", None, tx.clone());
        let Started::Execute(ticket) = rx.recv_timeout(Duration::from_secs(5)).expect("answered")
        else {
            panic!("the first call executes");
        };
        // Eight duplicates wait (the runtime has two workers) while the first runs.
        for _ in 0..8 {
            begin("k-then", Some(Duration::from_secs(10)), tx.clone());
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            rx.try_recv().is_err(),
            "the duplicates wait for the first call"
        );
        let (saved_tx, saved_rx) = std::sync::mpsc::channel();
        ticket.finish_then(returned(r#"{"id":"ch_then"}"#), move |s| {
            saved_tx.send(s).expect("the test listens");
        });
        assert_eq!(
            saved_rx
                .recv_timeout(Duration::from_secs(5))
                .expect("finished"),
            Saved::Stored
        );
        for _ in 0..8 {
            match rx
                .recv_timeout(Duration::from_secs(5))
                .expect("every waiter is answered")
            {
                Started::Prior(p) => {
                    assert_eq!(p.kind, PriorKind::Replayed);
                    assert_eq!(p.body.as_deref(), Some(&br#"{"id":"ch_then"}"#[..]));
                }
                Started::Execute(_) => panic!("a duplicate executed"),
            }
        }
        // A value of the call's own that is wrong is refused at once, and `done` never runs.
        let refused =
            store.begin_then("bad key", "charge", &json!({}), None, &policy(None), |_| {
                panic!("done must not run for a refused call")
            });
        assert!(refused.is_err());
    });
}
