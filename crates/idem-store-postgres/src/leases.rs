//! Leases: release and extend, the fenced writes on a held lease other than completing it.
//!
//! Both go to the pool whose commits do not wait for the disk, one statement each, and read
//! back why when the token no longer holds the record. A claim whose caller is gone is
//! released through here too.

use std::time::Duration;

use idem_core::clock::duration_millis;
use idem_core::{FencingToken, Key, Scope, StoreError, Timestamp};

use crate::inner::Inner;
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
            let stmt = client
                .prepare_cached(&self.sql.release)
                .await
                .map_err(|e| unavailable("prepare release", e))?;
            let n = client
                .execute(&stmt, &[&scope.as_str(), &key.as_str(), &token.as_i64()])
                .await
                .map_err(|e| unavailable("release", e))?;
            if n == 1 {
                Ok(())
            } else {
                Err(self.refusal(&client, scope, key, token).await)
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
            let stmt = client
                .prepare_cached(&self.sql.extend)
                .await
                .map_err(|e| unavailable("prepare extend", e))?;
            let row = client
                .query_opt(
                    &stmt,
                    &[
                        &self.now(),
                        &scope.as_str(),
                        &key.as_str(),
                        &token.as_i64(),
                        &duration_millis(lease),
                    ],
                )
                .await
                .map_err(|e| unavailable("extend", e))?;
            match row {
                Some(row) => row
                    .try_get::<_, i64>(0)
                    .map(Timestamp::from_millis)
                    .map_err(|e| unavailable("extend", e)),
                None => Err(self.refusal(&client, scope, key, token).await),
            }
        })
        .await
    }
}
