//! Leases: release and extend, the fenced writes on a held lease other than completing it.
//!
//! Both go to the pool whose commits do not wait for the disk, one statement each, and read
//! back why when the token no longer holds the record. The claims a batch granted to callers
//! gone by their answer are released here too, all in one statement.

use std::time::Duration;

use idem_core::clock::duration_millis;
use idem_core::{FencingToken, Key, Scope, StoreError, Timestamp};
use tokio_postgres::types::Type;

use crate::claims::Departed;
use crate::inner::{Inner, Lane};
use crate::sql::unavailable;

impl Inner {
    pub(crate) async fn release_one(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        self.bounded(async {
            let client = self.after_commit_client().await?;
            let n = self
                .execute(
                    &*client,
                    Lane::AfterCommit,
                    &self.sql.release,
                    &[
                        (&scope.as_str(), Type::TEXT),
                        (&key.as_str(), Type::TEXT),
                        (&token.as_i64(), Type::INT8),
                    ],
                )
                .await
                .map_err(|e| unavailable("release", e))?;
            if n == 1 {
                Ok(())
            } else {
                Err(self.refusal(&*client, scope, key, token).await)
            }
        })
        .await
    }

    /// Releases the leases a batch granted to callers that were gone by their answer, in
    /// one statement under one operation bound, after the batch and outside its slot: one
    /// release at a time would hold the batcher for each, and a batch cut at its bound would
    /// reach few of them. A lease this does not release (the store away, its token no longer
    /// the record's) reads as in flight, then abandoned, as any claim whose caller left.
    pub(crate) async fn release_departed(&self, departed: Vec<Departed>) {
        let scopes: Vec<&str> = departed.iter().map(|d| d.scope.as_str()).collect();
        let keys: Vec<&str> = departed.iter().map(|d| d.key.as_str()).collect();
        let tokens: Vec<i64> = departed.iter().map(|d| d.token.as_i64()).collect();
        let released = self
            .bounded(async {
                let client = self.after_commit_client().await?;
                self.execute(
                    &*client,
                    Lane::AfterCommit,
                    &self.sql.release_many,
                    &[
                        (&scopes, Type::TEXT_ARRAY),
                        (&keys, Type::TEXT_ARRAY),
                        (&tokens, Type::INT8_ARRAY),
                    ],
                )
                .await
                .map_err(|e| unavailable("release", e))
            })
            .await;
        match released {
            Ok(n) => tracing::debug!(
                released = n,
                of = departed.len(),
                "released the claims of callers that were gone"
            ),
            Err(e) => tracing::warn!(
                claims = departed.len(), error = %e,
                "claims whose callers were gone could not be released; they will read as abandoned"
            ),
        }
    }

    pub(crate) async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        self.bounded(async {
            let client = self.after_commit_client().await?;
            let rows = self
                .query(
                    &*client,
                    Lane::AfterCommit,
                    &self.sql.extend,
                    &[
                        (&self.now(), Type::INT8),
                        (&scope.as_str(), Type::TEXT),
                        (&key.as_str(), Type::TEXT),
                        (&token.as_i64(), Type::INT8),
                        (&duration_millis(lease), Type::INT8),
                    ],
                )
                .await
                .map_err(|e| unavailable("extend", e))?;
            match rows.first() {
                Some(row) => row
                    .try_get::<_, i64>(0)
                    .map(Timestamp::from_millis)
                    .map_err(|e| unavailable("extend", e)),
                None => Err(self.refusal(&*client, scope, key, token).await),
            }
        })
        .await
    }
}
