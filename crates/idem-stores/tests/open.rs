//! Every backend opens from its URL, and a claim made through [`AnyStore`] reaches it and
//! replays. The PostgreSQL and Redis cases skip without a server, unless
//! `IDEM_REQUIRE_SERVICES=1`.

use std::time::Duration;

use idem_conformance::{fp, key, response};
use idem_core::{AbandonedPolicy, Claim, ClaimRequest, Scope, Store, StoreError};
use idem_stores::{AnyStore, NoStoreFile, StoreUrl};

fn parse(url: &str) -> StoreUrl {
    url.parse().unwrap_or_else(|e| panic!("{url}: {e}"))
}

async fn open(url: &StoreUrl) -> AnyStore {
    url.open().await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Claim, complete, claim again: the second claim replays what the first stored.
async fn claims_replay(store: &AnyStore) {
    let scope =
        Scope::new(format!("t{:016x}", rand::random::<u64>())).unwrap_or_else(|e| panic!("{e}"));
    let req = ClaimRequest {
        scope: scope.clone(),
        key: key("k"),
        fingerprint: fp(1),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(60),
        on_abandoned: AbandonedPolicy::Reject,
    };
    let lease = match store.claim(req.clone()).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    store
        .complete(&scope, &key("k"), lease.token, response("{\"id\":1}"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    match store.claim(req).await {
        Ok(Claim::Completed(r)) => assert_eq!(r.response, Some(response("{\"id\":1}"))),
        other => panic!("expected a replay, got {other:?}"),
    }
    // A backend may count the replay after answering (SQLite does), so only the stored
    // result is checked here.
    match store.get(&scope, &key("k")).await {
        Ok(Some(r)) => assert_eq!(r.response, Some(response("{\"id\":1}"))),
        other => panic!("expected the record, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_opens_and_dispatches() {
    let store = open(&parse("memory:")).await;
    assert!(matches!(store, AnyStore::Memory(_)));
    assert!(store.durability_warnings().is_empty());
    claims_replay(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_is_created_by_open_and_never_by_open_existing() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("idem.db");
    let url = parse(&format!("sqlite:{}", path.display()));

    let refused = url.open_existing().await.err();
    let Some(StoreError::Unavailable(cause)) = &refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert!(cause.downcast_ref::<NoStoreFile>().is_some(), "{cause}");
    assert_eq!(
        cause.to_string(),
        format!("no store file at {}", path.display())
    );
    assert!(!path.exists(), "open_existing created {}", path.display());

    let store = open(&url).await;
    assert!(matches!(store, AnyStore::Sqlite(_)));
    claims_replay(&store).await;
    drop(store);
    assert!(path.exists());
    let again = url.open_existing().await.unwrap_or_else(|e| panic!("{e}"));
    claims_replay(&again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_opens_in_the_schema_its_url_names() {
    let test = "postgres_opens_in_the_schema_its_url_names";
    if !idem_conformance::server_reachable(test, "PostgreSQL", "127.0.0.1:5432") {
        return;
    }
    let schema = format!("idem_reg_{:016x}", rand::random::<u64>());
    let url = parse(&format!(
        "postgres://postgres@127.0.0.1:5432/test?schema={schema}"
    ));
    // An operator's command must find the schema, and makes none: twice refused.
    for _ in 0..2 {
        let refused = url.open_existing().await.err();
        let Some(StoreError::Unavailable(cause)) = &refused else {
            panic!("expected a refusal, got {refused:?}");
        };
        assert!(
            cause
                .downcast_ref::<idem_stores::postgres::NoSchema>()
                .is_some(),
            "{cause}"
        );
    }
    let store = open(&url).await;
    // Made by a serving open, the schema is found by the next operator's.
    let existing = url.open_existing().await;
    assert!(existing.is_ok(), "{:?}", existing.err());
    let AnyStore::Postgres(pg) = &store else {
        panic!("expected PostgreSQL, got {store:?}");
    };
    assert_eq!(pg.schema(), schema);
    assert!(store.durability_warnings().is_empty());
    claims_replay(&store).await;
    let _ = pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_opens_under_the_prefix_its_url_names() {
    let test = "redis_opens_under_the_prefix_its_url_names";
    if !idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
        return;
    }
    let prefix = format!("idem-reg-{:016x}", rand::random::<u64>());
    // The test server runs without persistence, which idem refuses unless told.
    let url = parse(&format!(
        "redis://127.0.0.1:6379/?prefix={prefix}&durability=volatile"
    ));
    let store = open(&url).await;
    let AnyStore::Redis(redis) = &store else {
        panic!("expected Redis, got {store:?}");
    };
    assert_eq!(redis.prefix(), prefix);
    assert_eq!(store.durability_warnings(), redis.durability_warnings());
    claims_replay(&store).await;
    let _ = redis.delete_all().await;
}

/// [`Store::for_this_runtime`] through [`AnyStore`] reaches the backend's: a Redis handle
/// opened on a second runtime keeps working once the runtime that opened the store is gone
/// (a clone would share its dead connection), over the same records.
#[test]
fn a_redis_handle_for_another_runtime_is_its_own_connection() {
    let test = "a_redis_handle_for_another_runtime_is_its_own_connection";
    if !idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
        return;
    }
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let prefix = format!("idem-test-{:016x}", rand::random::<u64>());
    let url = parse(&format!(
        "redis://127.0.0.1:6379/?prefix={prefix}&durability=volatile"
    ));
    let first = runtime();
    let store = first.block_on(open(&url));
    let second = runtime();
    let handle = second
        .block_on(store.for_this_runtime())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(handle, AnyStore::Redis(_)));
    drop(first);
    second.block_on(async {
        claims_replay(&handle).await;
        if let AnyStore::Redis(redis) = &handle {
            let _ = redis.delete_all().await;
        }
    });
}
