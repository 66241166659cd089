//! Leases: release and extend, the fenced writes on a held lease other than completing it.
//!
//! Both go to the pool whose commits do not wait for the disk, one statement each, and read
//! back why when the token no longer holds the record. A claim whose caller is gone is
//! released through here too.

use std::time::Duration;

use idem_core::clock::duration_millis;
use idem_core::{FencingToken, Key, Scope, StoreError, Timestamp};
use tokio_postgres::types::Type;

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
