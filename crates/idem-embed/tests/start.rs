//! `Store::start` (a binding's one-call hot path) against the two-call path it replaces:
//! the same key as `derive_key`, the same fingerprint as `begin`, key fields applied once.

use std::time::Duration;

use idem_embed::{KeyFields, PriorKind, Report, Started, Store, ToolPolicy, derive_key};
use serde_json::json;

fn policy() -> ToolPolicy {
    ToolPolicy::new(
        Duration::from_secs(30),
        Duration::from_secs(600),
        None,
        "reject",
        1 << 20,
    )
    .expect("a valid policy")
}

fn finish(started: Started) {
    match started {
        Started::Execute(t) => {
            t.finish(Report::Result {
                status: 200,
                body: b"{}".to_vec(),
                media_type: "application/json".into(),
            })
            .expect("the memory store keeps the result");
        }
        Started::Prior(p) => panic!("expected to execute, got {p:?}"),
    }
}

fn kind(started: Started) -> PriorKind {
    match started {
        Started::Prior(p) => p.kind,
        Started::Execute(_) => panic!("expected a prior answer"),
    }
}

#[test]
fn start_derives_derive_keys_key_and_begins_like_begin() {
    let store = Store::open("memory:").unwrap();
    let args = json!({"customer": "c1", "amount": 5});
    let claimed = store
        .start(None, "run-s1", "charge", &args, 0, None, None, &policy())
        .unwrap();
    let expected = derive_key("run-s1", "charge", &args, 0, None, None).unwrap();
    assert_eq!(claimed.key, expected.as_str());
    finish(claimed.started);
    // The two-call path sees the record `start` made as the same call: a replay.
    let again = store
        .begin(&claimed.key, "charge", &args, None, &policy())
        .unwrap();
    assert_eq!(kind(again), PriorKind::Replayed);
}

#[test]
fn key_fields_select_once_for_key_and_fingerprint() {
    let store = Store::open("memory:").unwrap();
    let fields = KeyFields::parse(["customer"]).unwrap();
    let first = json!({"customer": "c2", "note": "first wording"});
    let claimed = store
        .start(
            None,
            "run-s2",
            "charge",
            &first,
            0,
            None,
            Some(&fields),
            &policy(),
        )
        .unwrap();
    let expected = derive_key("run-s2", "charge", &first, 0, None, Some(&fields)).unwrap();
    assert_eq!(claimed.key, expected.as_str());
    finish(claimed.started);
    let noisy = json!({"customer": "c2", "note": "rephrased"});
    let again = store
        .start(
            None,
            "run-s2",
            "charge",
            &noisy,
            0,
            None,
            Some(&fields),
            &policy(),
        )
        .unwrap();
    assert_eq!(again.key, claimed.key);
    assert_eq!(kind(again.started), PriorKind::Replayed);
    // An explicit key is used as is; other key-field values under it are another intent.
    let other = json!({"customer": "c3"});
    let mismatch = store
        .start(
            Some(&claimed.key),
            "",
            "charge",
            &other,
            0,
            None,
            Some(&fields),
            &policy(),
        )
        .unwrap();
    assert_eq!(mismatch.key, claimed.key);
    assert_eq!(kind(mismatch.started), PriorKind::Mismatch);
    // A key field missing from the arguments is an error, before any claim.
    assert!(
        store
            .start(
                None,
                "run-s2",
                "charge",
                &json!({"note": 1}),
                0,
                None,
                Some(&fields),
                &policy()
            )
            .is_err()
    );
}
