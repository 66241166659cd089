//! `Store::for_this_runtime`: a handle whose claims and completions are batched, written and
//! answered on the runtime that took it (each of `idem serve`'s serving threads takes one),
//! over the same records as the store it came from. Real server; a schema of its own. Skips
//! without PostgreSQL unless IDEM_REQUIRE_SERVICES=1.

use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
};
use idem_store_postgres::{PgOptions, PgStore};
use tokio::runtime::{Builder, Runtime};

const PG: &str = "127.0.0.1:5432";

fn runtime() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn request(key: &Key) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes([7; 32]),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(60),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

#[test]
fn a_handle_batches_on_its_own_runtime_and_shares_the_records() {
    let test = "a_handle_batches_on_its_own_runtime_and_shares_the_records";
    if !idem_conformance::server_reachable(test, "PostgreSQL", PG) {
        return;
    }
    let mut opts = PgOptions::from_url(&format!("postgres://postgres@{PG}/test")).expect("url");
    opts.schema = format!("idem_handles_{:016x}", rand::random::<u64>());
    opts.op_timeout = Duration::from_secs(5);
    // A name of its own, so the server's count of this store's connections is exact.
    let name = format!("idem-handles-{:08x}", rand::random::<u32>());
    opts.config.application_name(&name);
    let first = runtime();
    let store = first.block_on(PgStore::connect(opts)).expect("connect");
    let second = runtime();
    let handle = second
        .block_on(store.for_this_runtime())
        .expect("a handle for the second runtime");

    // Claimed through the store, batched on the runtime that opened it.
    let key = Key::new("handles-k1").expect("key");
    let Claim::Acquired(lease) = first.block_on(store.claim(request(&key))).expect("claim") else {
        panic!("a fresh key is acquired");
    };
    // The store's batchers and their connections end with its runtime; the handle's do not,
    // since the second runtime runs them (a clone of the store would answer "store closed").
    drop(first);
    second.block_on(async {
        let done = handle
            .complete(
                &Scope::anonymous(),
                &key,
                lease.token,
                StoredResponse::new(201, "made"),
            )
            .await
            .expect("the lease taken through the store completes through the handle");
        assert_eq!(done.response.as_ref().map(|r| r.status), Some(201));
        match handle.claim(request(&key)).await.expect("claim again") {
            Claim::Completed(rec) => assert_eq!(rec.response, done.response),
            other => panic!("a retry replays, got {other:?}"),
        }
        // Many claims at once from one thread go out in batches over the handle's own
        // connections, each key acquired once.
        let keys: Vec<Key> = (0..64)
            .map(|i| Key::new(format!("handles-many-{i}")).expect("key"))
            .collect();
        for expected in ["acquired", "in flight"] {
            let mut claims = tokio::task::JoinSet::new();
            for k in &keys {
                let (handle, k) = (handle.clone(), k.clone());
                claims.spawn(async move { handle.claim(request(&k)).await });
            }
            while let Some(claim) = claims.join_next().await {
                let claim = claim.expect("claim task");
                let got = match &claim {
                    Ok(Claim::Acquired(_)) => "acquired",
                    Ok(Claim::InFlight(_)) => "in flight",
                    _ => "other",
                };
                assert_eq!(got, expected, "{claim:?}");
            }
        }
        // The store's shared pool holds the connection that made the schema (the first
        // runtime's, gone with it) and whatever reads took since; the handle's two pools
        // hold at most 2 × batches_in_flight (2) however many claims came at once.
        let rows = handle
            .pool()
            .get()
            .await
            .expect("a shared connection")
            .query(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await
            .expect("count connections");
        let connections: i64 = rows[0].get(0);
        assert!(connections <= 4 + 2, "{connections} connections");
        handle.drop_schema().await.expect("clean up");
    });
}

/// The handles' own connections come out of a budget of `pool_size`: past it a handle shares
/// the store's batchers (so it stops with the store's runtime, as a clone does).
#[test]
fn handles_past_the_budget_share_the_stores_batchers() {
    let test = "handles_past_the_budget_share_the_stores_batchers";
    if !idem_conformance::server_reachable(test, "PostgreSQL", PG) {
        return;
    }
    let mut opts =
        PgOptions::from_url(&format!("postgres://postgres@{PG}/test?pool_size=4")).expect("url");
    opts.schema = format!("idem_budget_{:016x}", rand::random::<u64>());
    opts.op_timeout = Duration::from_secs(5);
    let first = runtime();
    let store = first.block_on(PgStore::connect(opts)).expect("connect");
    // 2 × batches_in_flight (2) = 4: the first handle spends the whole budget.
    let (second, third) = (runtime(), runtime());
    let own = second.block_on(store.for_this_runtime()).expect("handle");
    let shared = third.block_on(store.for_this_runtime()).expect("handle");
    drop(first);
    let key = Key::new("budget-k1").expect("key");
    let claimed = second.block_on(own.claim(request(&key)));
    assert!(matches!(claimed, Ok(Claim::Acquired(_))), "{claimed:?}");
    let refused = third.block_on(shared.claim(request(&Key::new("budget-k2").expect("key"))));
    match refused {
        Err(e) => assert!(e.to_string().contains("store closed"), "{e}"),
        Ok(c) => panic!("a handle past the budget runs on the store's batchers, got {c:?}"),
    }
    second.block_on(own.drop_schema()).expect("clean up");
}
