//! A completion is indexed for purge by the completion's own script, in the same atomic step:
//! a purge sees every completion acknowledged before it, however many are still being
//! answered. (Indexing used to be a second write from a task of its own.)
//! Skips without Redis unless IDEM_REQUIRE_SERVICES=1.

use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, ManualClock, Scope, Store,
    StoredResponse, Timestamp,
};
use idem_store_redis::{Durability, RedisOptions, RedisStore};

const KEYS: usize = 200;

// One thread, every completion at once, then the purge at once: the ordering that a purge
// must survive when indexing trails the completion.
#[tokio::test(flavor = "current_thread")]
async fn a_purge_sees_every_completion_acknowledged_before_it() {
    let test = "a_purge_sees_every_completion_acknowledged_before_it";
    if !idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
        return;
    }
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let mut opts = RedisOptions::from_url("redis://127.0.0.1:6379").expect("url");
    opts.prefix = format!("idem-test-{:016x}", rand::random::<u64>());
    opts.clock = Some(clock.clone());
    opts.durability = Durability::Volatile;
    let store = RedisStore::connect(opts).await.expect("connect");

    let scope = Scope::anonymous();
    let mut leases = Vec::new();
    for i in 0..KEYS {
        let key = Key::new(format!("k{i}")).expect("key");
        let claim = store
            .claim(ClaimRequest {
                scope: scope.clone(),
                key: key.clone(),
                fingerprint: Fingerprint::from_bytes([1; 32]),
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(60),
                on_abandoned: AbandonedPolicy::Reject,
            })
            .await
            .expect("claim");
        let Claim::Acquired(lease) = claim else {
            panic!("{claim:?}")
        };
        leases.push((key, lease.token));
    }
    // All completions at once, on this one thread.
    let completions = leases
        .iter()
        .map(|(key, token)| store.complete(&scope, key, *token, StoredResponse::new(201, "ok")));
    for done in futures_util::future::join_all(completions).await {
        done.expect("complete");
    }

    // At once, while the last index writes may still be on their way.
    clock.advance(Duration::from_secs(61));
    let purged = store.purge_expired(10 * KEYS).await.expect("purge");
    let left = store.delete_all().await;
    assert_eq!(purged, KEYS, "purged; then deleted what was left: {left:?}");
}
