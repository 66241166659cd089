//! Opening and closing files: the schema is created once and versioned; a file idem cannot
//! read is refused with a message that says why, and is left untouched; a store that was
//! closed (dropped, or `close`d while handles remain) leaves one complete file, its WAL
//! checkpointed into it.

use idem_core::{Claim, ListRecords, RecordFilter, Scope, Store, StoreError, StoredResponse};
use idem_store_sqlite::{SCHEMA_VERSION, SqliteStore};

/// After the last drop, the database file alone holds every record: anyone who copies only
/// `idem.db` of a stopped service has it all. (Reads hold connections too, on their own
/// threads; those must close before the writer's, whose close checkpoints the WAL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_store_leaves_one_complete_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_of_50_records(dir.path()).await;
    drop(store);
    assert_one_complete_file(dir.path());
}

/// `close` does what dropping the last handle does while other handles remain (a language
/// package's store lives until the interpreter ends); after it, every operation fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_stops_a_store_other_handles_still_hold() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_of_50_records(dir.path()).await;
    let other = store.clone();
    store.close();
    store.close();
    assert_one_complete_file(dir.path());
    let claim = other.claim(idem_conformance::load::request(50)).await;
    assert!(
        matches!(claim, Err(ref e) if e.is_unavailable()),
        "a closed store claimed: {claim:?}"
    );
    let read = other
        .get(&Scope::anonymous(), &idem_conformance::load::request(0).key)
        .await;
    assert!(
        matches!(read, Err(ref e) if e.is_unavailable()),
        "a closed store read: {read:?}"
    );
    // Writes that read nothing first reach the stopped writer's queue.
    let purged = other.purge_expired(10).await;
    assert!(
        matches!(purged, Err(ref e) if e.is_unavailable()),
        "a closed store purged: {purged:?}"
    );
    let listed = other.list(&RecordFilter::default()).await;
    assert!(
        matches!(listed, Err(ref e) if e.is_unavailable()),
        "a closed store listed: {listed:?}"
    );
    drop(other);
    assert_one_complete_file(dir.path());
}

/// A store at `dir/idem.db` holding 50 completed records, each read back once.
async fn store_of_50_records(dir: &std::path::Path) -> SqliteStore {
    let store = SqliteStore::open(dir.join("idem.db")).expect("the store opens");
    for i in 0..50 {
        let req = idem_conformance::load::request(i);
        let key = req.key.clone();
        let Ok(Claim::Acquired(lease)) = store.claim(req).await else {
            panic!("{key:?} is acquired");
        };
        store
            .complete(
                &Scope::anonymous(),
                &key,
                lease.token,
                StoredResponse::new(201, "ok"),
            )
            .await
            .expect("the result is stored");
        // Reads keep the reader threads' connections open.
        assert!(
            store
                .get(&Scope::anonymous(), &key)
                .await
                .expect("the record reads")
                .is_some()
        );
    }
    store
}

/// `dir/idem.db` has no WAL beside it, and a copy of it alone holds the 50 records.
fn assert_one_complete_file(dir: &std::path::Path) {
    assert!(
        !dir.join("idem.db-wal").exists(),
        "the WAL outlived the store"
    );
    let copy = dir.join("copy.db");
    std::fs::copy(dir.join("idem.db"), &copy).expect("a copy");
    let conn = rusqlite::Connection::open(&copy).expect("the copy opens");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0))
        .expect("the copy reads");
    assert_eq!(rows, 50);
    drop(conn);
    std::fs::remove_file(&copy).expect("the copy is removed");
}

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
