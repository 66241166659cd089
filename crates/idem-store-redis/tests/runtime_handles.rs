//! `Store::for_this_runtime`: a handle whose connection is driven by the runtime that opened
//! it (each of `idem serve`'s serving threads takes one), over the same records as the store
//! it came from. Skips without Redis unless IDEM_REQUIRE_SERVICES=1.

use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
};
use idem_store_redis::{Durability, RedisOptions, RedisStore};
use tokio::runtime::{Builder, Runtime};

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
fn a_handle_is_driven_by_its_own_runtime_and_shares_the_records() {
    let test = "a_handle_is_driven_by_its_own_runtime_and_shares_the_records";
    if !idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
        return;
    }
    let mut opts = RedisOptions::from_url("redis://127.0.0.1:6379").expect("url");
    opts.prefix = format!("idem-test-{:016x}", rand::random::<u64>());
    opts.durability = Durability::Volatile;
    opts.op_timeout = Duration::from_secs(2);
    let first = runtime();
    let store = first.block_on(RedisStore::connect(opts)).expect("connect");
    let second = runtime();
    let handle = second
        .block_on(store.for_this_runtime())
        .expect("a handle for the second runtime");

    // Claimed through the store, on the runtime that opened it.
    let key = Key::new("handles-k1").expect("key");
    let Claim::Acquired(lease) = first.block_on(store.claim(request(&key))).expect("claim") else {
        panic!("a fresh key is acquired");
    };
    // The store's connection dies with its runtime; the handle's does not, since the second
    // runtime drives it (a clone of the store would share the dead connection).
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
        handle.delete_all().await.expect("clean up");
    });
}
