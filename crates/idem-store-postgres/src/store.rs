//! [`PgStore`]: the `Store` methods as single statements over a connection pool.
//!
//! This module opens the store, starts its background tasks (the claim and completion
//! batchers, the replay writer) and answers the `Store` trait by delegating. Each operation
//! lives in the module of its job (`claims`, `completions`, `leases`, `maintenance`, `listing`, with
//! `refusals` beneath the fenced writes), all on the shared state in `inner`; none of them
//! refers back to this module.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, ListRecords, Listing, Record, RecordFilter, Resolution,
    Scope, Store, StoreError, StoredResponse, Timestamp, machine,
};

use crate::batch::Batcher;
use crate::claims::ClaimJob;
use crate::completions::Completion;
use crate::inner::{BatchPools, Inner};
use crate::options::PgOptions;
use crate::replay_writer;
use crate::schema;
use crate::server;
use crate::sql::{unavailable, unavailable_because};

/// The most requests one batched statement carries.
const MAX_BATCH: usize = 256;

/// The PostgreSQL [`Store`]. Cloning shares one pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
    batchers: Arc<Batchers>,
    /// What can lose an acknowledged claim, read at connect (empty unless
    /// `durability=volatile` let the store open anyway).
    warnings: Arc<[String]>,
}

/// The claim and completion batchers, shared by a store's clones; a handle on another
/// runtime has its own ([`Store::for_this_runtime`]).
struct Batchers {
    claims: Batcher<ClaimJob, Result<Claim, StoreError>>,
    completions: Batcher<Completion, Result<Record, StoreError>>,
}

impl Batchers {
    /// Starts both batchers on the runtime this is called on, each batch on a connection
    /// from `pools`. They hold the store weakly: dropping the last handle ends them.
    fn start(inner: &Arc<Inner>, pools: BatchPools) -> Self {
        let in_flight = inner.batches_in_flight;
        let (weak, claims_pool) = (Arc::downgrade(inner), pools.claims);
        let claims = Batcher::start(MAX_BATCH, in_flight, move |jobs| {
            let (weak, pool) = (weak.clone(), claims_pool.clone());
            async move {
                if let Some(inner) = weak.upgrade() {
                    // Past the bound its callers are gone and its connection is closed;
                    // the jobs' answers are dropped with it.
                    let mut departed = Vec::new();
                    let batch = async {
                        inner.claim_batch(&pool, jobs, &mut departed).await;
                        Ok(())
                    };
                    if let Err(e) = inner.within(inner.batch_bound(), batch).await {
                        tracing::warn!(error = %e, "a batch got no answer in time; its connection is closed");
                    }
                    // Off the batcher's slot: the next batch need not wait for these.
                    if !departed.is_empty() {
                        tokio::spawn(async move { inner.release_departed(departed).await });
                    }
                }
            }
        });
        let (weak, completions_pool) = (Arc::downgrade(inner), pools.completions);
        let completions = Batcher::start(MAX_BATCH, in_flight, move |jobs| {
            let (weak, pool) = (weak.clone(), completions_pool.clone());
            async move {
                if let Some(inner) = weak.upgrade() {
                    // Past the bound its callers are gone and its connection is closed;
                    // the jobs' answers are dropped with it.
                    let batch = async {
                        inner.complete_batch(&pool, jobs).await;
                        Ok(())
                    };
                    if let Err(e) = inner.within(inner.batch_bound(), batch).await {
                        tracing::warn!(error = %e, "a batch got no answer in time; its connection is closed");
                    }
                }
            }
        });
        Batchers {
            claims,
            completions,
        }
    }
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
    /// Finds out first whether a pooler stands in between ([`crate::Pooler`]), and refuses a
    /// server that can lose an acknowledged claim (`fsync` off, or a standby that could be
    /// promoted without the last claims), naming the setting to change, unless the URL says
    /// `durability=volatile` ([`crate::Durability`]).
    pub async fn connect(opts: PgOptions) -> Result<Self, StoreError> {
        let probe = match tokio::time::timeout(opts.op_timeout, server::probe(&opts)).await {
            Ok(probe) => probe?,
            Err(_) => {
                return Err(unavailable_because(
                    "connect",
                    format!("no answer within {:?}", opts.op_timeout),
                ));
            }
        };
        let create = opts.create_schema;
        let inner = Arc::new(Inner::new(opts, probe.pooled)?);
        inner
            .bounded(async {
                let mut client = inner.client().await?;
                schema::migrate(&mut client, &inner.schema, &inner.quoted, create).await
            })
            .await?;
        tokio::spawn(replay_writer::flush_loop(Arc::downgrade(&inner)));
        let batchers = Arc::new(Batchers::start(&inner, inner.shared_batch_pools()));
        Ok(PgStore {
            inner,
            batchers,
            warnings: probe.warnings.into(),
        })
    }

    /// What in the server's configuration can lose a claim it acknowledged (and so run a key
    /// twice), as read at connect. Empty when all is well; otherwise the store was opened
    /// with `durability=volatile`, or it would have been refused.
    pub fn durability_warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Connects to `postgres://...[?schema=NAME]`.
    pub async fn connect_url(url: &str) -> Result<Self, StoreError> {
        let opts = PgOptions::from_url(url).map_err(|e| unavailable("url", e))?;
        Self::connect(opts).await
    }

    /// Connects to `postgres://...[?schema=NAME]` whose schema must already be there (an
    /// operator's command): an absent one is refused with [`crate::NoSchema`], not created.
    pub async fn connect_existing_url(url: &str) -> Result<Self, StoreError> {
        let mut opts = PgOptions::from_url(url).map_err(|e| unavailable("url", e))?;
        opts.create_schema = false;
        Self::connect(opts).await
    }

    /// Whether the store runs as behind a transaction pooler: unnamed statements, and
    /// settings per transaction (`pooler=transaction`, or found out at connect).
    pub fn behind_pooler(&self) -> bool {
        self.inner.pooled()
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

impl Store for PgStore {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        self.inner
            .answered(async {
                self.batchers
                    .claims
                    .submit((req, FencingToken::random()))
                    .await
                    .unwrap_or_else(|| Err(unavailable_because("claim", "store closed")))
            })
            .await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        let job = Completion::new(scope, key, token, response);
        self.inner
            .answered(async {
                self.batchers
                    .completions
                    .submit(job)
                    .await
                    .unwrap_or_else(|| Err(unavailable_because("complete", "store closed")))
            })
            .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        self.inner.release_one(scope, key, token).await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        self.inner.extend(scope, key, token, lease).await
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        let inner = &self.inner;
        inner
            .bounded(async {
                let client = inner.read_client().await?;
                let (now, existing) = inner.read_on(&*client, &inner.sql.get, scope, key).await?;
                Ok(machine::read(existing, now))
            })
            .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.resolve(scope, key, resolution).await
    }

    /// Batchers of their own on the caller's runtime, over pools of their own whose
    /// connections that runtime drives: a serving thread's claims and completions are
    /// batched, written and answered on that thread, rather than crossing to the runtime
    /// that connected first and back (issue 33: that runtime's share was a quarter of a new
    /// key's gateway CPU). Batches group the requests of one thread. Everything else (reads,
    /// extends, releases, replay counts, maintenance) stays on the store's shared pools.
    /// Each handle adds up to `2 × batches_in_flight` connections, made on first use, from a
    /// budget of `pool_size` in all; past it a handle is a clone, on the shared batchers.
    async fn for_this_runtime(&self) -> Result<Self, StoreError> {
        let Some(pools) = self.inner.own_batch_pools()? else {
            tracing::info!(
                pool_size = self.inner.pool_size(),
                "this runtime shares the store's batchers: the handles' own connections \
                 would pass pool_size (raise it with ?pool_size=N)"
            );
            return Ok(self.clone());
        };
        Ok(PgStore {
            inner: self.inner.clone(),
            batchers: Arc::new(Batchers::start(&self.inner, pools)),
            warnings: self.warnings.clone(),
        })
    }
}

impl ListRecords for PgStore {
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        self.inner.list(filter).await
    }
}
