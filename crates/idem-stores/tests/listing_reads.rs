//! An operator's listing reads what it shows, not the stored responses: on every backend, a
//! listing of records holding large bodies allocates a small fraction of those bodies
//! (the admin page's listing once read whole records: four concurrent pages over 150
//! records of 1 MB took a gateway from 94 MB to 685 MB).
//!
//! Bytes allocated are counted by this test binary's allocator, across all threads (the
//! stores' reader threads and driver tasks included), so the file holds one test: nothing
//! else allocates while a listing is counted.

use std::alloc::System;
use std::time::Duration;

use idem_conformance::{fp, key};
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, ListRecords, RecordFilter, Scope, Store, StoredResponse,
};
use idem_stores::{AnyStore, StoreUrl};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const RECORDS: usize = 24;
const BODY: usize = 512 * 1024;

/// Fills `store` with [`RECORDS`] completed records of [`BODY`] bytes each in one fresh scope,
/// then lists them: the bytes the listing allocated, and the records it returned.
async fn listing_cost(store: &AnyStore) -> (u64, usize) {
    let scope = Scope::new(format!("big{:016x}", rand::random::<u64>())).expect("scope");
    for i in 0..RECORDS {
        let k = key(&format!("k{i}"));
        let claim = ClaimRequest {
            scope: scope.clone(),
            key: k.clone(),
            fingerprint: fp(1),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(600),
            on_abandoned: AbandonedPolicy::Reject,
        };
        let Ok(Claim::Acquired(lease)) = store.claim(claim).await else {
            panic!("claim k{i}")
        };
        store
            .complete(
                &scope,
                &k,
                lease.token,
                StoredResponse::new(201, vec![b'x'; BODY]),
            )
            .await
            .expect("complete");
    }
    let filter = RecordFilter {
        scope_prefix: scope.as_str().to_owned(),
        limit: 500,
        ..RecordFilter::default()
    };
    let region = Region::new(GLOBAL);
    let listing = store.list(&filter).await.expect("list");
    let change = region.change();
    let cost = (change.bytes_allocated + change.bytes_reallocated.max(0) as usize) as u64;
    (cost, listing.records.len())
}

#[test]
fn a_listing_never_reads_the_stored_bodies() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let test = "a_listing_never_reads_the_stored_bodies";
    let mut urls = vec![
        "memory:".to_owned(),
        format!("sqlite:{}", dir.path().join("idem.db").display()),
    ];
    let schema = format!("idem_list_{:016x}", rand::random::<u64>());
    let prefix = format!("idem-list-{:016x}", rand::random::<u64>());
    if idem_conformance::server_reachable(test, "PostgreSQL", "127.0.0.1:5432") {
        urls.push(format!(
            "postgres://postgres@127.0.0.1:5432/test?schema={schema}"
        ));
    }
    if idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
        urls.push(format!(
            "redis://127.0.0.1:6379/?prefix={prefix}&durability=volatile"
        ));
    }
    let bodies = (RECORDS * BODY) as u64;
    rt.block_on(async {
        for url in urls {
            let parsed: StoreUrl = url.parse().expect("url");
            let store = parsed.open().await.unwrap_or_else(|e| panic!("{url}: {e}"));
            let (cost, listed) = listing_cost(&store).await;
            assert_eq!(listed, RECORDS, "{url}");
            // The listed fields are a few hundred bytes a record; a backend that read the
            // bodies would allocate them all at least once.
            assert!(
                cost < bodies / 10,
                "{url}: the listing allocated {cost} bytes over {bodies} bytes of bodies"
            );
            match &store {
                AnyStore::Postgres(pg) => {
                    let _ = pg.drop_schema().await;
                }
                AnyStore::Redis(redis) => {
                    let _ = redis.delete_all().await;
                }
                _ => {}
            }
        }
    });
}
