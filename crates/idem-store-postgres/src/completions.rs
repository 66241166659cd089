//! Completions: the fenced write that stores a result, batched.
//!
//! A completion goes to the pool whose commits do not wait for the disk
//! ([design §9](docs/design.md#9-performance-shape)), and concurrent ones share a statement through
//! [`crate::batch::Batcher`]. A completion the statement refused, or one whose statement failed,
//! runs alone: alone it either commits or reads back why it was refused. The transactional mode
//! runs the single-key statement inside a service's transaction.

use std::collections::HashMap;

use idem_core::{FencingToken, Key, Record, Scope, StoreError, StoredResponse};
use tokio_postgres::types::Type;

use deadpool_postgres::Pool;

use crate::batch::Job;
use crate::inner::{Conn, Inner, Lane};
use crate::sql::{record_of, unavailable, unavailable_because};

/// A completion waiting for its batch.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    pub(crate) token: FencingToken,
    /// The response, encoded.
    pub(crate) response: Vec<u8>,
    /// The response itself, for the record the completion answers with: the statement
    /// returns every column but this one.
    pub(crate) stored: StoredResponse,
}

impl Completion {
    pub(crate) fn new(
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        stored: StoredResponse,
    ) -> Self {
        Completion {
            scope: scope.clone(),
            key: key.clone(),
            token,
            response: stored.encode(),
            stored,
        }
    }
}

impl Inner {
    /// Runs the complete statement for `items` (distinct keys); returns each key's record.
    async fn complete_rows(
        &self,
        client: &impl Conn,
        items: &[&Completion],
    ) -> Result<HashMap<(String, String), Record>, StoreError> {
        let scopes: Vec<&str> = items.iter().map(|c| c.scope.as_str()).collect();
        let keys: Vec<&str> = items.iter().map(|c| c.key.as_str()).collect();
        let tokens: Vec<i64> = items.iter().map(|c| c.token.as_i64()).collect();
        let responses: Vec<&[u8]> = items.iter().map(|c| c.response.as_slice()).collect();
        let rows = self
            .query(
                client,
                Lane::AfterCommit,
                &self.sql.complete,
                &[
                    (&self.now(), Type::INT8),
                    (&scopes, Type::TEXT_ARRAY),
                    (&keys, Type::TEXT_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&responses, Type::BYTEA_ARRAY),
                ],
            )
            .await
            .map_err(|e| unavailable("complete", e))?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            // A row idem cannot read is left out: its completion is settled alone, which
            // reports the corruption for that key only.
            if let Ok(Some(rec)) = record_of(&row) {
                out.insert(
                    (rec.scope.as_str().to_owned(), rec.key.as_str().to_owned()),
                    rec,
                );
            }
        }
        Ok(out)
    }

    /// One completion on `client`.
    pub(crate) async fn complete_on(
        &self,
        client: &impl Conn,
        c: &Completion,
    ) -> Result<Record, StoreError> {
        let rows = self
            .query(
                client,
                Lane::AfterCommit,
                &self.sql.complete_one,
                &[
                    (&self.now(), Type::INT8),
                    (&c.scope.as_str(), Type::TEXT),
                    (&c.key.as_str(), Type::TEXT),
                    (&c.token.as_i64(), Type::INT8),
                    (&c.response, Type::BYTEA),
                ],
            )
            .await
            .map_err(|e| unavailable("complete", e))?;
        match rows.first() {
            Some(row) => {
                let mut rec = record_of(row)?.ok_or_else(|| {
                    StoreError::Corrupt("postgres complete returned no record".into())
                })?;
                rec.response = Some(c.stored.clone());
                Ok(rec)
            }
            None => Err(self.refusal(client, &c.scope, &c.key, c.token).await),
        }
    }

    /// A batch of completions; a key completed twice in one batch runs on its own after.
    pub(crate) async fn complete_batch(
        &self,
        pool: &Pool,
        jobs: Vec<Job<Completion, Result<Record, StoreError>>>,
    ) {
        let client = match self.checkout(pool, Lane::AfterCommit).await {
            Ok(c) => c,
            Err(e) => {
                let why = e.to_string();
                for (_, reply) in jobs {
                    let _ = reply.send(Err(unavailable_because("complete", &why)));
                }
                return;
            }
        };
        let mut seen = std::collections::HashSet::new();
        let (mut batch, alone): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|(c, _)| seen.insert((c.scope.clone(), c.key.clone())));
        // Key order: concurrent batches lock rows in one order and cannot deadlock.
        batch.sort_by(|a, b| (&a.0.scope, &a.0.key).cmp(&(&b.0.scope, &b.0.key)));
        let items: Vec<&Completion> = batch.iter().map(|(c, _)| c).collect();
        let mut rows = self.complete_rows(&*client, &items).await;
        let failed = rows.is_err();
        let mut again = Vec::new();
        for (c, reply) in batch {
            let id = (c.scope.as_str().to_owned(), c.key.as_str().to_owned());
            match rows.as_mut().map(|r| r.remove(&id)) {
                Ok(Some(mut rec)) if rec.token == c.token => {
                    rec.response = Some(c.stored);
                    let _ = reply.send(Ok(rec));
                }
                // Refused (the reason is read alone), or the statement failed.
                _ => again.push((c, reply)),
            }
        }
        for (c, reply) in again {
            let done = if failed {
                self.complete_again(&*client, &c).await
            } else {
                self.complete_on(&*client, &c).await
            };
            let _ = reply.send(done);
        }
        for (c, reply) in alone {
            let _ = reply.send(self.complete_on(&*client, &c).await);
        }
    }

    /// A completion run alone after its batch's statement failed. If the batch did commit it
    /// (the connection was cut after the commit), the record holds this token and this
    /// response: that is this completion, not a refusal.
    async fn complete_again(
        &self,
        client: &impl Conn,
        c: &Completion,
    ) -> Result<Record, StoreError> {
        match self.complete_on(client, c).await {
            Err(StoreError::Stale(idem_core::Stale::Completed)) => {
                let (_, existing) = self
                    .read_on(client, &self.sql.get, &c.scope, &c.key)
                    .await?;
                match existing {
                    Some(rec)
                        if rec.token == c.token
                            && rec.completed_by == Some(idem_core::CompletedBy::Executor)
                            && rec.response.as_ref().map(StoredResponse::encode).as_ref()
                                == Some(&c.response) =>
                    {
                        Ok(rec)
                    }
                    _ => Err(StoreError::Stale(idem_core::Stale::Completed)),
                }
            }
            other => other,
        }
    }
}
