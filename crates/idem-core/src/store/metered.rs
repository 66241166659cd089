//! A store that reports how long each call took, as the histogram
//! `idem_store_call_seconds{op}`, and counts store failures by operation.
//!
//! The [`Engine`](crate::Engine) wraps every store in it, so every front end (the HTTP layer,
//! the gateway, the MCP proxy, the language packages) records the same store metrics through
//! the `metrics` facade; without an installed recorder they cost a clock read per call.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::clock::Timestamp;
use crate::key::Key;
use crate::outcome::StoreOp;
use crate::record::{FencingToken, Record, StoredResponse};
use crate::scope::Scope;
use crate::store::{Claim, ClaimRequest, Resolution, Store, StoreError};

/// Wraps a store with latency metrics. Cloning clones the inner store.
#[derive(Debug, Clone)]
pub struct MeteredStore<S> {
    inner: S,
}

impl<S> MeteredStore<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        MeteredStore { inner }
    }

    /// The wrapped store.
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }
}

async fn timed<T>(
    op: StoreOp,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let start = Instant::now();
    let out = call.await;
    op.record_seconds(start.elapsed().as_secs_f64());
    if let Err(e) = &out
        && e.is_unavailable()
    {
        op.count_error();
    }
    out
}

impl<S: Store> Store for MeteredStore<S> {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        timed(StoreOp::Claim, self.inner.claim(req)).await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        timed(
            StoreOp::Complete,
            self.inner.complete(scope, key, token, response),
        )
        .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        timed(StoreOp::Release, self.inner.release(scope, key, token)).await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        timed(StoreOp::Extend, self.inner.extend(scope, key, token, lease)).await
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        timed(StoreOp::Get, self.inner.get(scope, key)).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let n = timed(StoreOp::Purge, self.inner.purge_expired(limit)).await?;
        metrics::counter!("idem_purged_records_total").increment(n as u64);
        Ok(n)
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        timed(StoreOp::Resolve, self.inner.resolve(scope, key, resolution)).await
    }
}
