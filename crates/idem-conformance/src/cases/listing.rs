//! The listing an operator sees ([`ListRecords`]): filters, the abandoned-first order, the
//! limit, and that expired records are absent from it as from every other read.
#![deny(dead_code)]

use std::time::Duration;

use idem_core::{Key, ListRecords, Listing, RecordFilter, RecordState, Resolution, Scope, Store};

use crate::{Cx, LEASE, RETENTION, fp, key, response};

fn scope(name: String) -> Scope {
    match Scope::new(name) {
        Ok(s) => s,
        Err(e) => panic!("test scope: {e}"),
    }
}

async fn listed<S: ListRecords>(cx_store: &S, filter: RecordFilter) -> Listing {
    match cx_store.list(&filter).await {
        Ok(l) => l,
        Err(e) => panic!("list {filter:?}: {e}"),
    }
}

fn keys(l: &Listing) -> Vec<&str> {
    l.records.iter().map(|r| r.key.as_str()).collect()
}

async fn claim_in<S: Store>(cx: &Cx<S>, s: &Scope, k: &Key) -> idem_core::Lease {
    let mut req = cx.req(k, fp(1));
    req.scope = s.clone();
    match cx.store.claim(req).await {
        Ok(idem_core::Claim::Acquired(l)) => l,
        other => panic!("claim {k}: {other:?}"),
    }
}

async fn completed_in<S: Store>(cx: &Cx<S>, s: &Scope, k: &Key) {
    let lease = claim_in(cx, s, k).await;
    if let Err(e) = cx.store.complete(s, k, lease.token, response("ok")).await {
        panic!("complete {k}: {e}");
    }
}

/// Abandoned records come first (newest first within a state), then in flight, then
/// completed; the state, key-prefix and scope-prefix filters and the limit hold; an expired
/// record is not listed; a resolved record leaves the abandoned list.
pub async fn records_are_listed_abandoned_first_and_filtered<S: Store + ListRecords>(cx: Cx<S>) {
    let a = scope(format!("{}/a", cx.scope));
    let b = scope(format!("{}/b", cx.scope));
    let tick = Duration::from_secs(1);
    completed_in(&cx, &a, &key("old")).await;
    cx.clock.advance(RETENTION - LEASE);
    completed_in(&cx, &a, &key("c1")).await;
    cx.clock.advance(tick);
    completed_in(&cx, &b, &key("c1")).await;
    cx.clock.advance(tick);
    claim_in(&cx, &a, &key("a1")).await;
    cx.clock.advance(tick);
    claim_in(&cx, &a, &key("a_%2")).await;
    // Both leases end; "old" is now past its retention.
    cx.clock.advance(LEASE);
    claim_in(&cx, &a, &key("f1")).await;

    let in_a = |state, key_prefix: &str, limit| RecordFilter {
        state,
        key_prefix: key_prefix.to_owned(),
        scope_prefix: a.as_str().to_owned(),
        limit,
    };
    let all = listed(&*cx.store, in_a(None, "", 100)).await;
    assert_eq!(keys(&all), ["a_%2", "a1", "f1", "c1"], "{all:?}");
    assert!(!all.more, "{all:?}");
    assert_eq!(all.now, cx.now());
    let states: Vec<RecordState> = all.records.iter().map(|r| r.state(cx.now())).collect();
    use RecordState::{Abandoned, Completed, InFlight};
    assert_eq!(states, [Abandoned, Abandoned, InFlight, Completed]);

    let abandoned = listed(&*cx.store, in_a(Some(Abandoned), "", 100)).await;
    assert_eq!(keys(&abandoned), ["a_%2", "a1"]);
    let completed = listed(&*cx.store, in_a(Some(Completed), "", 100)).await;
    assert_eq!(keys(&completed), ["c1"]);

    // A prefix is literal: no LIKE or glob wildcards.
    assert_eq!(
        keys(&listed(&*cx.store, in_a(None, "a", 100)).await),
        ["a_%2", "a1"]
    );
    assert_eq!(
        keys(&listed(&*cx.store, in_a(None, "a_%", 100)).await),
        ["a_%2"]
    );
    assert_eq!(
        keys(&listed(&*cx.store, in_a(None, "a%", 100)).await),
        Vec::<&str>::new()
    );
    assert_eq!(
        keys(&listed(&*cx.store, in_a(None, "f1", 100)).await),
        ["f1"]
    );

    let first = listed(&*cx.store, in_a(None, "", 1)).await;
    assert_eq!(keys(&first), ["a_%2"]);
    assert!(first.more, "a cut list says more match");

    // Both scopes share the case's prefix; newest completion first among the completed.
    let both = listed(
        &*cx.store,
        RecordFilter {
            state: Some(Completed),
            scope_prefix: cx.scope.as_str().to_owned(),
            limit: 100,
            ..RecordFilter::default()
        },
    )
    .await;
    let scopes: Vec<&str> = both.records.iter().map(|r| r.scope.as_str()).collect();
    assert_eq!(scopes, [b.as_str(), a.as_str()]);

    if let Err(e) = cx.store.resolve(&a, &key("a1"), Resolution::Release).await {
        panic!("resolve: {e}");
    }
    let after = listed(&*cx.store, in_a(Some(Abandoned), "", 100)).await;
    assert_eq!(keys(&after), ["a_%2"]);
}
