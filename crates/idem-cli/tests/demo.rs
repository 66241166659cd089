//! `idem demo` end to end: the real binary, real sockets, the real gateway on SQLite. The
//! figures it prints must agree with the payment API's database.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn demo(dir: &Path, loss: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "demo",
            "--intents",
            "40",
            "--seed",
            "7",
            "--json",
            "--loss",
            loss,
            "--dir",
        ])
        .arg(dir)
        .output()
        .expect("run idem demo");
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// (charges, duplicate charges) counted straight from a payment API database.
fn recount(db: &Path) -> (u64, u64) {
    let conn = rusqlite::Connection::open(db).expect("open the payment database");
    let (all, customers): (i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT customer_id) FROM charges",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("count the charges");
    (all as u64, (all - customers) as u64)
}

#[test]
fn with_losses_naive_retries_double_charge_and_keys_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let r = demo(dir.path(), "0.3");
    let (naive, keyed) = (&r["naive"], &r["keyed"]);
    assert!(naive["duplicate_charges"].as_u64() > Some(0), "{r}");
    assert!(naive["customers_double_charged"].as_u64() > Some(0), "{r}");
    assert_eq!(keyed["charges"], 40, "{r}");
    assert_eq!(keyed["duplicate_charges"], 0, "{r}");
    assert_eq!(keyed["customers_double_charged"], 0, "{r}");
    assert!(keyed["replays_served"].as_u64() > Some(0), "{r}");
    assert_eq!(naive["intents_with_charge_id"], 40);
    assert_eq!(keyed["intents_with_charge_id"], 40);
    // The JSON is what the databases say.
    for (run, db) in [("naive", "naive.db"), ("keyed", "keyed.db")] {
        let (charges, dupes) = recount(&dir.path().join(db));
        assert_eq!(r[run]["charges"].as_u64(), Some(charges), "{run}");
        assert_eq!(r[run]["duplicate_charges"].as_u64(), Some(dupes), "{run}");
    }
    let story = r["story"].as_array().map(|s| s.len()).unwrap_or(0);
    assert!(story > 0, "no story told: {r}");
}

#[test]
fn without_losses_both_runs_charge_once_per_intent() {
    let dir = tempfile::tempdir().unwrap();
    let r = demo(dir.path(), "0");
    for run in ["naive", "keyed"] {
        assert_eq!(r[run]["charges"], 40, "{r}");
        assert_eq!(r[run]["duplicate_charges"], 0, "{r}");
        assert_eq!(r[run]["attempts"], 40, "{r}");
    }
}

#[test]
fn bad_flags_are_refused() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--loss", "1.5", "--intents", "1"],
            "--loss must be from 0 to 0.9",
        ),
        (
            &["--loss", "-0.1", "--intents", "1"],
            "--loss must be from 0 to 0.9",
        ),
        (&["--intents", "0"], "--intents"),
        (&["--store", "nope", "--intents", "1"], "no scheme"),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("demo")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
