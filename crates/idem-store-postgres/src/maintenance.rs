//! Maintenance: an operator's resolution of a record, and the purge of expired ones.
//!
//! Neither is on a request's path. A resolution reads the record under a row lock, lets the
//! state machine decide, and writes the whole record back or deletes it; a purge deletes at
//! most `limit` expired records, passing over rows another transaction holds.

use idem_core::store::columns::Columns;
use idem_core::{Key, Record, Resolution, Scope, StoreError, machine};
use tokio_postgres::types::Type;

use crate::inner::{Conn, Inner, Lane};
use crate::sql::unavailable;

impl Inner {
    pub(crate) async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.bounded(async {
            let client = self.after_commit_client().await?;
            let n = self
                .execute(
                    &*client,
                    Lane::AfterCommit,
                    &self.sql.purge,
                    &[(&self.now(), Type::INT8), (&limit, Type::INT8)],
                )
                .await
                .map_err(|e| unavailable("purge", e))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    pub(crate) async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        self.bounded(async {
            let mut client = self.client().await?;
            let tx = client
                .transaction()
                .await
                .map_err(|e| unavailable("begin", e))?;
            self.set_local(&tx, Lane::Claim)
                .await
                .map_err(|e| unavailable("begin", e))?;
            let (now, existing) = self
                .read_on(&tx, &self.sql.get_for_update, scope, key)
                .await?;
            let (record, write) = machine::resolve(existing.as_ref(), resolution, now)?;
            match write {
                machine::Write::Put(rec) => self.put(&tx, &rec).await?,
                machine::Write::Delete => {
                    self.execute(
                        &tx,
                        Lane::Claim,
                        &self.sql.delete,
                        &[(&scope.as_str(), Type::TEXT), (&key.as_str(), Type::TEXT)],
                    )
                    .await
                    .map_err(|e| unavailable("resolve", e))?;
                }
                machine::Write::Nothing | machine::Write::CountReplay => {}
            }
            tx.commit().await.map_err(|e| unavailable("commit", e))?;
            Ok(record)
        })
        .await
    }
}

impl Inner {
    /// Writes `r` over its row, inside the resolution's transaction.
    async fn put(&self, client: &impl Conn, r: &Record) -> Result<(), StoreError> {
        let c = Columns::of(r);
        let by = c.completed_by.and_then(|b| i16::try_from(b).ok());
        self.execute(
            client,
            Lane::Claim,
            &self.sql.put,
            &[
                (&c.scope, Type::TEXT),
                (&c.key, Type::TEXT),
                (&c.fingerprint, Type::BYTEA),
                (&c.token, Type::INT8),
                (&c.created_at, Type::INT8),
                (&c.acquired_at, Type::INT8),
                (&c.lease_expires_at, Type::INT8),
                (&c.completed_at, Type::INT8),
                (&by, Type::INT2),
                (&c.expires_at, Type::INT8),
                (&c.retention_ms, Type::INT8),
                (&c.attempts, Type::INT8),
                (&c.replays, Type::INT8),
                (&c.response, Type::BYTEA),
            ],
        )
        .await
        .map_err(|e| unavailable("write record", e))?;
        Ok(())
    }
}
