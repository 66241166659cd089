//! `shutdown`, which the language packages call as their process exits: a SQLite store is
//! left as one complete file while the package's store objects still hold it, and a call
//! after it fails closed instead of opening the store again. Alone in its test binary (its own
//! process), since it closes every store the process opened.

use std::time::Duration;

use idem_embed::{EmbedError, Report, Started, Store, ToolPolicy};
use serde_json::json;

#[test]
fn shutdown_leaves_one_sqlite_file_and_later_calls_fail_closed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idem.db");
    let store = Store::open(&format!("sqlite:{}", path.display())).expect("the store opens");
    let policy = ToolPolicy::new(
        Duration::from_secs(30),
        Duration::from_secs(600),
        None,
        "reject",
        1 << 20,
    )
    .expect("a valid policy");
    let start = |order: u64| {
        store.start(
            None,
            "run-1",
            "charge_card",
            &json!({ "order": order }),
            0,
            None,
            None,
            &policy,
        )
    };
    for order in 0..20 {
        match start(order).expect("a claim").started {
            Started::Execute(ticket) => {
                ticket
                    .finish(Report::Result {
                        status: 200,
                        body: b"{}".to_vec(),
                        media_type: "application/json".into(),
                    })
                    .expect("the result is kept");
            }
            Started::Prior(p) => panic!("a new order was answered {p:?}"),
        }
    }
    assert!(dir.path().join("idem.db-wal").exists(), "the store is open");

    idem_embed::shutdown();

    for leftover in ["idem.db-wal", "idem.db-shm"] {
        assert!(
            !dir.path().join(leftover).exists(),
            "{leftover} outlived shutdown"
        );
    }
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).expect("a copy");
    let rows: i64 = rusqlite::Connection::open(&copy)
        .and_then(|c| c.query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0)))
        .expect("the copy reads");
    assert_eq!(rows, 20, "the file alone holds every record");

    match start(0) {
        Err(EmbedError::Store(e)) => assert!(e.is_unavailable(), "{e}"),
        other => panic!("a call after shutdown was {other:?}"),
    }
    // No store is opened after it: a file opened now would keep its WAL.
    let later = dir.path().join("later.db");
    match Store::open(&format!("sqlite:{}", later.display())) {
        Err(EmbedError::Store(e)) => assert!(e.is_unavailable(), "{e}"),
        other => panic!("a store opened after shutdown: {other:?}"),
    }
    assert!(!later.exists(), "a store was opened after shutdown");
    // A second shutdown has nothing left to do.
    idem_embed::shutdown();
}
