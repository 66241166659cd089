//! The transactional mode ([design §5](docs/design.md#5-unknown-outcomes)): the record and the side
//! effect commit together.
//!
//! A service that keeps its own data in the same PostgreSQL database claims the key inside
//! its own transaction, runs its effect there, stores the result there, and commits once.
//! A crash before the commit rolls back both; after it, both are there. No unknown outcome
//! can exist, so no lease, heartbeat or abandoned record is needed. A concurrent request
//! with the same key waits on the uncommitted row (PostgreSQL's unique index), then replays.
//!
//! ```no_run
//! # async fn charge(store: idem_store_postgres::PgStore, req: idem_core::ClaimRequest)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::{Claim, StoredResponse};
//! let mut client = store.pool().get().await?;
//! let tx = client.transaction().await?;
//! match store.claim_in(&tx, &req).await? {
//!     Claim::Acquired(lease) => {
//!         tx.execute("INSERT INTO charges (amount) VALUES (100)", &[]).await?;
//!         let response = StoredResponse::new(201, b"{\"id\":1}".to_vec());
//!         store.complete_in(&tx, &req.scope, &req.key, lease.token, &response).await?;
//!         tx.commit().await?;
//!     }
//!     Claim::Completed(record) => { /* replay record.response */ }
//!     _ => { /* mismatch: 422; in flight or abandoned: only from the non-transactional path */ }
//! }
//! # Ok(()) }
//! ```
//!
//! Run the transaction at READ COMMITTED (PostgreSQL's default): the claim re-reads the key
//! after waiting on a racer, which a REPEATABLE READ snapshot would not allow.

use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, Record, Scope, StoreError, StoredResponse,
};

use crate::PgStore;

/// What a claim inside a transaction answers; the same as [`Claim`].
pub type TxClaim = Claim;

impl PgStore {
    /// Claims inside the caller's transaction. Acquired: the in-flight record exists only in
    /// this transaction until it commits.
    pub async fn claim_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        req: &ClaimRequest,
    ) -> Result<TxClaim, StoreError> {
        let inner = self.inner();
        inner
            .bounded(inner.claim_on(tx, req, FencingToken::random()))
            .await
    }

    /// Stores the result inside the caller's transaction; it becomes visible with the
    /// transaction's commit, together with the effect.
    pub async fn complete_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Record, StoreError> {
        let inner = self.inner();
        let completion = crate::completions::Completion::new(scope, key, token, response.clone());
        inner.bounded(inner.complete_on(tx, &completion)).await
    }
}
