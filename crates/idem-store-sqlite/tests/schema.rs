//! Opening files: the schema is created once and versioned; a file idem cannot read is refused
//! with a message that says why, and is left untouched.

use idem_core::StoreError;
use idem_store_sqlite::{SCHEMA_VERSION, SqliteStore};

#[test]
fn a_new_file_gets_the_current_schema_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    drop(SqliteStore::open(&path).expect("create"));
    drop(SqliteStore::open(&path).expect("reopen"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_file_from_a_newer_idem_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    drop(SqliteStore::open(&path).expect("create"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    match SqliteStore::open(&path) {
        Err(StoreError::Corrupt(msg)) => {
            assert!(
                msg.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
                "{msg}"
            );
            assert!(msg.contains("upgrade idem"), "{msg}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    std::fs::write(&path, b"this is not a database, it is a shopping list: eggs, milk, more eggs, and some more words to fill a page header").unwrap();
    match SqliteStore::open(&path) {
        Err(e @ StoreError::Unavailable(_)) => assert!(e.to_string().contains("idem.db"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let after = std::fs::read(&path).unwrap();
    assert!(
        after.starts_with(b"this is not a database"),
        "the file was changed"
    );
}
