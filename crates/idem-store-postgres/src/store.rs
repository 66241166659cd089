//! [`PgStore`]: the `Store` methods as single statements over a connection pool.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use idem_core::clock::duration_millis;
use idem_core::store::columns::Columns;
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, FencingToken, Key, Lease, Record, Resolution, Scope,
    Store, StoreError, StoredResponse, Timestamp, machine,
};
use tokio_postgres::NoTls;

use crate::options::PgOptions;
use crate::replays::{self, Tally};
use crate::schema;
use crate::sql::{Sql, now_of, record_of, unavailable, unavailable_because};

/// How many times a claim is run again when a racing writer left its snapshot behind. Each
/// run takes a fresh snapshot, so a second run settles it unless yet another writer raced.
const CLAIM_RUNS: usize = 8;

/// The PostgreSQL [`Store`]. Cloning shares one pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pool: Pool,
    pub(crate) sql: Sql,
    schema: String,
    quoted: String,
    clock: Option<Arc<dyn idem_core::Clock>>,
    op_timeout: Duration,
    pub(crate) replays: Tally,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.schema)
            .field("pool", &self.inner.pool.status())
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects, creating or checking the schema. Fails if the database cannot be reached
    /// within the operation timeout: a gateway should not start on a store it cannot use.
    pub async fn connect(opts: PgOptions) -> Result<Self, StoreError> {
        let manager = Manager::from_config(
            opts.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(opts.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(opts.op_timeout))
            .create_timeout(Some(opts.op_timeout))
            .recycle_timeout(Some(opts.op_timeout))
            .build()
            .map_err(|e| unavailable("pool", e))?;
        let quoted = format!("\"{}\"", opts.schema);
        let inner = Arc::new(Inner {
            pool,
            sql: Sql::new(&quoted),
            schema: opts.schema,
            quoted,
            clock: opts.clock,
            op_timeout: opts.op_timeout,
            replays: Tally::default(),
        });
        inner
            .bounded(async {
                let mut client = inner.client().await?;
                schema::migrate(&mut client, &inner.schema, &inner.quoted).await
            })
            .await?;
        tokio::spawn(replays::flush_loop(Arc::downgrade(&inner)));
        Ok(PgStore { inner })
    }

    /// Connects to `postgres://...[?schema=NAME]`.
    pub async fn connect_url(url: &str) -> Result<Self, StoreError> {
        let opts = PgOptions::from_url(url).map_err(|e| unavailable("url", e))?;
        Self::connect(opts).await
    }

    /// The schema holding idem's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The pool, for a service that runs its own statements in the transactional mode.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Drops the schema and every record in it. For tests, and for an operator who means it.
    pub async fn drop_schema(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                inner
                    .client()
                    .await?
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", inner.quoted))
                    .await
                    .map_err(|e| unavailable("drop schema", e))
            })
            .await
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }
}

impl Inner {
    /// The time parameter: the injected clock's, or NULL for the database's.
    pub(crate) fn now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| c.now().as_millis())
    }

    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| unavailable("connect", e))
    }

    /// Runs `op` within the operation timeout; past it the store is unavailable.
    pub(crate) async fn bounded<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.op_timeout, op).await {
            Ok(r) => r,
            Err(_) => Err(unavailable_because(
                "timed out",
                format!("no answer within {:?}", self.op_timeout),
            )),
        }
    }

    /// The claim statement on `client`: the pool's connection, or a service's transaction.
    pub(crate) async fn claim_on(
        &self,
        client: &impl GenericClient,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        let stmt = client
            .prepare_cached(&self.sql.claim)
            .await
            .map_err(|e| unavailable("prepare claim", e))?;
        let token = FencingToken::random();
        let retry = req.on_abandoned == AbandonedPolicy::Retry;
        let (lease_ms, retention_ms) = (duration_millis(req.lease), duration_millis(req.retention));
        for _ in 0..CLAIM_RUNS {
            let row = client
                .query_opt(
                    &stmt,
                    &[
                        &self.now(),
                        &req.scope.as_str(),
                        &req.key.as_str(),
                        &req.fingerprint.as_bytes().as_slice(),
                        &token.as_i64(),
                        &lease_ms,
                        &retention_ms,
                        &retry,
                    ],
                )
                .await
                .map_err(|e| unavailable("claim", e))?;
            // No row: a racing insert is not in this snapshot yet.
            let Some(row) = row else { continue };
            let now = now_of(&row)?;
            let rec = record_of(&row)?
                .ok_or_else(|| StoreError::Corrupt("postgres claim returned no record".into()))?;
            let acquired: bool = row
                .try_get("acquired")
                .map_err(|e| unavailable("claim", e))?;
            if acquired {
                if rec.token != token {
                    return Err(StoreError::Corrupt(
                        "postgres claim acquired under another token".into(),
                    ));
                }
                return Ok(Claim::Acquired(Lease {
                    token,
                    expires_at: rec.lease_expires_at,
                    attempt: rec.attempts,
                }));
            }
            match machine::claim(Some(&rec), req, now, token).0 {
                // The snapshot's row said "free" but a racer holds it now: look again.
                Claim::Acquired(_) => continue,
                Claim::Completed(replayed) => {
                    self.replays.count(&rec.scope, &rec.key, rec.token);
                    return Ok(Claim::Completed(replayed));
                }
                answer => return Ok(answer),
            }
        }
        Err(unavailable_because(
            "claim",
            format!("did not settle in {CLAIM_RUNS} runs under contention"),
        ))
    }

    /// The complete statement on `client`.
    pub(crate) async fn complete_on(
        &self,
        client: &impl GenericClient,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: &StoredResponse,
    ) -> Result<Record, StoreError> {
        let stmt = client
            .prepare_cached(&self.sql.complete)
            .await
            .map_err(|e| unavailable("prepare complete", e))?;
        let row = client
            .query_opt(
                &stmt,
                &[
                    &self.now(),
                    &scope.as_str(),
                    &key.as_str(),
                    &token.as_i64(),
                    &response.encode(),
                ],
            )
            .await
            .map_err(|e| unavailable("complete", e))?;
        match row {
            Some(row) => record_of(&row)?
                .ok_or_else(|| StoreError::Corrupt("postgres complete returned no record".into())),
            None => Err(self.refusal(client, scope, key, token).await),
        }
    }

    /// Why a fenced statement changed nothing: the record is gone, has another token, or is
    /// completed. Read after the fact; only the token's holder could have changed it since.
    async fn refusal(
        &self,
        client: &impl GenericClient,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> StoreError {
        match self.read_on(client, &self.sql.get, scope, key).await {
            Ok((now, existing)) => match machine::release(existing.as_ref(), token, now) {
                Err(e) => e,
                // Unreachable while tokens are unique; absent is the safe word for it.
                Ok(()) => StoreError::Stale(idem_core::Stale::Absent),
            },
            Err(e) => e,
        }
    }

    async fn read_on(
        &self,
        client: &impl GenericClient,
        sql: &str,
        scope: &Scope,
        key: &Key,
    ) -> Result<(Timestamp, Option<Record>), StoreError> {
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| unavailable("prepare read", e))?;
        let row = client
            .query_one(&stmt, &[&self.now(), &scope.as_str(), &key.as_str()])
            .await
            .map_err(|e| unavailable("read", e))?;
        Ok((now_of(&row)?, record_of(&row)?))
    }
}

impl Store for PgStore {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async { inner.claim_on(&inner.client().await?, &req).await })
            .await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                let client = inner.client().await?;
                inner.complete_on(&client, scope, key, token, &response).await
            })
            .await
    }

    async fn release(&self, scope: &Scope, key: &Key, token: FencingToken) -> Result<(), StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                let client = inner.client().await?;
                let stmt = client
                    .prepare_cached(&inner.sql.release)
                    .await
                    .map_err(|e| unavailable("prepare release", e))?;
                let n = client
                    .execute(&stmt, &[&scope.as_str(), &key.as_str(), &token.as_i64()])
                    .await
                    .map_err(|e| unavailable("release", e))?;
                if n == 1 {
                    Ok(())
                } else {
                    Err(inner.refusal(&client, scope, key, token).await)
                }
            })
            .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                let client = inner.client().await?;
                let stmt = client
                    .prepare_cached(&inner.sql.extend)
                    .await
                    .map_err(|e| unavailable("prepare extend", e))?;
                let row = client
                    .query_opt(
                        &stmt,
                        &[
                            &inner.now(),
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
                    None => Err(inner.refusal(&client, scope, key, token).await),
                }
            })
            .await
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                let client = inner.client().await?;
                let (now, existing) = inner.read_on(&client, &inner.sql.get, scope, key).await?;
                Ok(machine::read(existing, now))
            })
            .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let inner = &self.inner;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        inner
            .bounded(async {
                let client = inner.client().await?;
                let stmt = client
                    .prepare_cached(&inner.sql.purge)
                    .await
                    .map_err(|e| unavailable("prepare purge", e))?;
                let n = client
                    .execute(&stmt, &[&inner.now(), &limit])
                    .await
                    .map_err(|e| unavailable("purge", e))?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
            .await
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                let mut client = inner.client().await?;
                let tx = client
                    .transaction()
                    .await
                    .map_err(|e| unavailable("begin", e))?;
                let (now, existing) = inner
                    .read_on(&tx, &inner.sql.get_for_update, scope, key)
                    .await?;
                let (record, write) = machine::resolve(existing.as_ref(), resolution, now)?;
                match write {
                    machine::Write::Put(rec) => put(&tx, &inner.sql.put, &rec).await?,
                    machine::Write::Delete => {
                        tx.execute(&inner.sql.delete, &[&scope.as_str(), &key.as_str()])
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
