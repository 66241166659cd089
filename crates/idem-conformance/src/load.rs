//! What the stores' throughput benchmarks share: fresh requests and a concurrent driver.
//! (Benchmarks, not tests: nothing here asserts a time.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{AbandonedPolicy, ClaimRequest, Fingerprint, Key, Scope};

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
