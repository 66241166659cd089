//! Maintenance: an operator's resolution of a record, and the purge of expired ones.
//!
//! Neither is on a request's path. A resolution reads the record under a row lock, lets the
//! state machine decide, and writes the whole record back or deletes it; a purge deletes at
//! most `limit` expired records, passing over rows another transaction holds.

use deadpool_postgres::GenericClient;
use idem_core::store::columns::Columns;
use idem_core::{Key, Record, Resolution, Scope, StoreError, machine};

use crate::inner::Inner;
use crate::sql::unavailable;

impl Inner {
    pub(crate) async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.bounded(async {
            let client = self.after_commit_client().await?;
            let stmt = client
                .prepare_cached(&self.sql.purge)
                .await
                .map_err(|e| unavailable("prepare purge", e))?;
            let n = client
                .execute(&stmt, &[&self.now(), &limit])
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
            let (now, existing) = self
                .read_on(&tx, &self.sql.get_for_update, scope, key)
                .await?;
            let (record, write) = machine::resolve(existing.as_ref(), resolution, now)?;
            match write {
                machine::Write::Put(rec) => put(&tx, &self.sql.put, &rec).await?,
                machine::Write::Delete => {
                    tx.execute(&self.sql.delete, &[&scope.as_str(), &key.as_str()])
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

async fn put(client: &impl GenericClient, sql: &str, r: &Record) -> Result<(), StoreError> {
    let c = Columns::of(r);
    let by = c.completed_by.and_then(|b| i16::try_from(b).ok());
    client
        .execute(
            sql,
            &[
                &c.scope,
                &c.key,
                &c.fingerprint,
                &c.token,
                &c.created_at,
                &c.acquired_at,
                &c.lease_expires_at,
                &c.completed_at,
                &by,
                &c.expires_at,
                &c.retention_ms,
                &c.attempts,
                &c.replays,
                &c.response,
            ],
        )
        .await
        .map_err(|e| unavailable("write record", e))?;
    Ok(())
}
