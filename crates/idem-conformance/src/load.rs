//! What the stores' throughput benchmarks share: fresh requests and a concurrent driver.
//! (Benchmarks, not tests: nothing here asserts a time.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The claim of charge number `n`, in the anonymous scope.
pub fn request(n: u64) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: Key::new(format!("bench-{n}")).unwrap_or_else(|e| panic!("{e}")),
        fingerprint: Fingerprint::http("POST", "/v1/charges", None, &n.to_le_bytes()),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// A request no other call of this process made.
pub fn fresh_request() -> ClaimRequest {
    request(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs `op` `iters` times over `concurrency` tasks; returns the wall time.
pub fn run_concurrent<F, Fut>(
    rt: &tokio::runtime::Runtime,
    concurrency: u64,
    iters: u64,
    op: F,
) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|t| {
                let op = op.clone();
                let share = iters / concurrency + u64::from(t < iters % concurrency);
                tokio::spawn(async move {
                    for _ in 0..share {
                        op().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap_or_else(|e| panic!("task: {e}"));
        }
        start.elapsed()
    })
}

/// The response every benchmark stores.
pub const BODY: &[u8] = br#"{"charge_id":"ch_123","amount":4900}"#;

/// Claims a fresh key, and completes it when `complete`: one execution's store work.
pub async fn claim_fresh<S: Store>(store: &S, complete: bool) {
    let r = fresh_request();
    let (scope, key) = (r.scope.clone(), r.key.clone());
    let Ok(Claim::Acquired(lease)) = store.claim(r).await else {
        panic!("a fresh key was not acquired");
    };
    if complete {
        let resp = StoredResponse::new(201, BODY.to_vec());
        if let Err(e) = store.complete(&scope, &key, lease.token, resp).await {
            panic!("complete: {e}");
        }
    }
}

/// Stores the result that [`replay`] asks for again and again.
pub async fn prepare_replay<S: Store>(store: &S) {
    let r = request(u64::MAX);
    let (scope, key) = (r.scope.clone(), r.key.clone());
    if let Ok(Claim::Acquired(l)) = store.claim(r).await
        && let Err(e) = store
            .complete(
                &scope,
                &key,
                l.token,
                StoredResponse::new(201, BODY.to_vec()),
            )
            .await
    {
        panic!("complete: {e}");
    }
}

/// A claim answered with the stored result of [`prepare_replay`].
pub async fn replay<S: Store>(store: &S) {
    let Ok(Claim::Completed(_)) = store.claim(request(u64::MAX)).await else {
        panic!("no replay");
    };
}
