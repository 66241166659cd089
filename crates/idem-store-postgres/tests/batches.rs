//! The batched claim path under the failures a single-statement store never meets: callers
//! that give up, a key held by another transaction, a row idem cannot read, and many
//! stores racing over abandoned, expired and absent keys. Real server; each test in a schema
//! of its own. Skips without PostgreSQL unless IDEM_REQUIRE_SERVICES=1.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Clock, Fingerprint, Key, ManualClock, Scope, Store,
    StoredResponse, Timestamp,
};
use idem_store_postgres::{PgOptions, PgStore};

const PG: &str = "127.0.0.1:5432";

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e:?}"))
}

/// Options for a fresh schema, or `None` when the test skips.
fn options(test: &str) -> Option<PgOptions> {
    if !idem_conformance::server_reachable(test, "PostgreSQL", PG) {
        return None;
    }
    let mut opts = ok(PgOptions::from_url(&format!(
        "postgres://postgres@{PG}/test"
    )));
    opts.schema = format!("idem_batch_{:016x}", rand::random::<u64>());
    Some(opts)
}

fn scope() -> Scope {
    ok(Scope::new("s"))
}

fn req(key: &str) -> ClaimRequest {
    ClaimRequest {
        scope: scope(),
        key: ok(Key::new(key)),
        fingerprint: Fingerprint::from_bytes([1; 32]),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// A key held by an uncommitted transaction (the transactional mode) delays its own claims,
/// not other keys' past the operation timeout; and a claim whose caller gave up leaves no
/// record behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_neither_stalls_others_nor_leaves_phantom_claims() {
    let Some(mut opts) = options("a_held_key_neither_stalls_others_nor_leaves_phantom_claims")
    else {
        return;
    };
    opts.op_timeout = Duration::from_secs(2);
    let store = ok(PgStore::connect(opts).await);
    let mut holder = ok(store.pool().get().await);
    let tx = ok(holder.transaction().await);
    assert!(matches!(
        ok(store.claim_in(&tx, &req("x")).await),
        Claim::Acquired(_)
    ));
    // Two retries of "x" take both batch slots, waiting on the uncommitted row.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.claim(req("x")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let y = store.claim(req("y")).await;
    assert!(
        matches!(y, Ok(Claim::Acquired(_))),
        "an unrelated key failed while x was held: {y:?}"
    );
    for w in waiting {
        let got = ok(w.await);
        assert!(got.is_err(), "a claim of the held key got {got:?}");
    }
    ok(tx.rollback().await);
    drop(holder);
    // Nothing of x was left by the claims that gave up: the key is free.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ok(store.get(&scope(), &ok(Key::new("x"))).await).is_none());
    assert!(matches!(
        ok(store.claim(req("x")).await),
        Claim::Acquired(_)
    ));
    let _ = store.drop_schema().await;
}

/// Claims a batch acquired for callers that left while its statement waited are released,
/// all of them, after the batch: none is left to read as in flight, then abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_whose_callers_left_mid_batch_are_all_released() {
    let Some(mut opts) = options("claims_whose_callers_left_mid_batch_are_all_released") else {
        return;
    };
    // lock_timeout is half of this: the batch's statement waits out the callers, not the lock.
    opts.op_timeout = Duration::from_secs(6);
    opts.batches_in_flight = 1;
    let store = ok(PgStore::connect(opts).await);
    let mut x_holder = ok(store.pool().get().await);
    let x_tx = ok(x_holder.transaction().await);
    ok(store.claim_in(&x_tx, &req("x")).await);
    let mut y_holder = ok(store.pool().get().await);
    let y_tx = ok(y_holder.transaction().await);
    ok(store.claim_in(&y_tx, &req("y")).await);
    // The one batch slot waits on x; "y" and forty fresh keys queue into the next batch,
    // whose callers give up after a second, while that batch waits on y.
    let s = store.clone();
    let x = tokio::spawn(async move { s.claim(req("x")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let keys: Vec<String> = std::iter::once("y".to_owned())
        .chain((0..40).map(|i| format!("k{i:02}")))
        .collect();
    let callers: Vec<_> = keys
        .iter()
        .map(|k| {
            let (s, k) = (store.clone(), k.clone());
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(1), s.claim(req(&k))).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    ok(x_tx.rollback().await);
    assert!(matches!(ok(x.await), Ok(Claim::Acquired(_))));
    for c in callers {
        assert!(
            ok(c.await).is_err(),
            "a caller was answered before it gave up"
        );
    }
    ok(y_tx.rollback().await);
    // The batch now acquires every key for nobody, and its runner releases them.
    let mut left = keys.clone();
    for _ in 0..100 {
        let mut still = Vec::new();
        for k in &left {
            if ok(store.get(&scope(), &ok(Key::new(k))).await).is_some() {
                still.push(k.clone());
            }
        }
        left = still;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.is_empty(),
        "claims of departed callers left in flight: {left:?}"
    );
    for k in ["y", "k00", "k39"] {
        assert!(matches!(ok(store.claim(req(k)).await), Claim::Acquired(_)));
    }
    drop(x_holder);
    drop(y_holder);
    let _ = store.drop_schema().await;
}

/// A row idem cannot read fails its own key only; a fresh key in the same batch acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_row_fails_only_its_own_key() {
    let Some(mut opts) = options("an_unreadable_row_fails_only_its_own_key") else {
        return;
    };
    opts.batches_in_flight = 1;
    let store = ok(PgStore::connect(opts).await);
    let client = ok(store.pool().get().await);
    // A completed record whose fingerprint is not 32 bytes.
    ok(client
        .execute(
            &format!(
                "INSERT INTO \"{}\".records VALUES ('s', 'bad', '\\x01'::bytea, 1, 0, 0, 0, 1, 0, \
                 9223372036854775807, 1000, 1, 0, NULL)",
                store.schema()
            ),
            &[],
        )
        .await);
    // Hold "x" so the next claims queue into one batch behind it.
    let mut holder = ok(store.pool().get().await);
    let tx = ok(holder.transaction().await);
    ok(store.claim_in(&tx, &req("x")).await);
    let s = store.clone();
    let x = tokio::spawn(async move { s.claim(req("x")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (s1, s2) = (store.clone(), store.clone());
    let bad = tokio::spawn(async move { s1.claim(req("bad")).await });
    let good = tokio::spawn(async move { s2.claim(req("good")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    ok(tx.rollback().await);
    let _ = ok(x.await);
    let bad = ok(bad.await);
    assert!(
        matches!(bad, Err(idem_core::StoreError::Corrupt(_))),
        "{bad:?}"
    );
    let good = ok(good.await);
    assert!(matches!(good, Ok(Claim::Acquired(_))), "{good:?}");
    drop(client);
    drop(holder);
    let _ = store.drop_schema().await;
}

/// Four stores with pools of their own race over abandoned (retry policy), completed and
/// expired, and absent keys at one instant: each key is acquired exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stores_acquire_each_key_once() {
    let Some(opts) = options("many_stores_acquire_each_key_once") else {
        return;
    };
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let mut stores = Vec::new();
    for _ in 0..4 {
        let mut o = opts.clone();
        o.clock = Some(clock.clone() as Arc<dyn Clock>);
        o.pool_size = 8;
        stores.push(ok(PgStore::connect(o).await));
    }
    let mk = |k: String| {
        let mut r = req(&k);
        r.lease = Duration::from_secs(1);
        r.retention = Duration::from_secs(1);
        r.on_abandoned = AbandonedPolicy::Retry;
        r
    };
    let n = 100;
    for i in 0..n {
        let Ok(Claim::Acquired(_)) = stores[0].claim(mk(format!("a{i}"))).await else {
            panic!("claim a{i}");
        };
        let Ok(Claim::Acquired(l)) = stores[0].claim(mk(format!("e{i}"))).await else {
            panic!("claim e{i}");
        };
        ok(stores[0]
            .complete(
                &scope(),
                &ok(Key::new(format!("e{i}"))),
                l.token,
                StoredResponse::new(200, b"x".to_vec()),
            )
            .await);
    }
    clock.advance(Duration::from_secs(5));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        for s in &stores {
            for kind in ["a", "e", "n"] {
                for i in 0..n {
                    let (s, r) = (s.clone(), mk(format!("{kind}{i}")));
                    tasks.push(tokio::spawn(
                        async move { (r.key.clone(), s.claim(r).await) },
                    ));
                }
            }
        }
    }
    let mut acquired = std::collections::HashMap::<String, usize>::new();
    for t in tasks {
        let (k, r) = ok(t.await);
        if let Claim::Acquired(_) = ok(r) {
            *acquired.entry(k.as_str().to_owned()).or_default() += 1;
        }
    }
    let _ = stores[0].drop_schema().await;
    let doubles: Vec<_> = acquired.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubles.is_empty(), "acquired twice: {doubles:?}");
    assert_eq!(acquired.len(), 3 * n, "every key is acquired once");
}
