//! The state every operation shares: the two pools, the statements, the clock and the
//! operation timeout, with the helpers that take a connection, bound an operation in time
//! and read one record.
//!
//! The operation modules (claims, completions, leases, refusals, maintenance, the replay
//! writer) add their methods to [`Inner`] and depend on this module; it depends only on the
//! leaves (options, replays' tally, sql), so no module cycle runs through it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use idem_core::clock::duration_millis;
use idem_core::{Key, Record, Scope, StoreError, Timestamp};
use tokio_postgres::NoTls;

use crate::options::PgOptions;
use crate::replays::Tally;
use crate::sql::{Sql, now_of, record_of, unavailable, unavailable_because};

/// What the store, its clones and its background tasks share.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    /// Connections whose commits do not wait for the disk and whose statements are planned
    /// per execution: for completions, releases, extends, replay counts and purges.
    /// [design §9](docs/design.md#9-performance-shape) : a completion may be written asynchronously
    /// if before the lease could end; the WAL writer flushes within a second, leases last tens of
    /// seconds. A claim is never sent here: it must be durable before the effect runs.
    after_commit: Pool,
    pub(crate) sql: Sql,
    pub(crate) schema: String,
    pub(crate) quoted: String,
    clock: Option<Arc<dyn idem_core::Clock>>,
    op_timeout: Duration,
    pub(crate) replays: Tally,
}

impl Inner {
    /// Opens the two pools (connections are made on first use) and writes the statements
    /// for `opts.schema`.
    pub(crate) fn new(opts: PgOptions) -> Result<Self, StoreError> {
        // The server gives up too, not only the caller: a claim waiting on a row another
        // transaction holds must not keep its batch (and every key queued behind it) past
        // the operation timeout. Claims are durable whatever the database's default.
        let op_ms = duration_millis(opts.op_timeout).max(1);
        let lock_ms = (op_ms / 2).clamp(1, 2000);
        let base = opts.config.get_options().unwrap_or_default();
        let mut claims = opts.config.clone();
        claims.options(
            format!(
                "{base} -c synchronous_commit=on -c lock_timeout={lock_ms} \
                 -c statement_timeout={op_ms}"
            )
            .trim_start(),
        );
        let pool = new_pool(claims, opts.pool_size, opts.op_timeout)?;
        // Batches of completions join with key arrays: a plan cached while the table was
        // small would scan it whole. Claims look keys up one by one and keep their plans.
        let mut after_commit = opts.config.clone();
        after_commit.options(
            format!(
                "{base} -c synchronous_commit=off -c plan_cache_mode=force_custom_plan \
                 -c lock_timeout={lock_ms} -c statement_timeout={op_ms}"
            )
            .trim_start(),
        );
        let after_commit = new_pool(after_commit, opts.pool_size.div_ceil(2), opts.op_timeout)?;
        let quoted = format!("\"{}\"", opts.schema);
        Ok(Inner {
            pool,
            after_commit,
            sql: Sql::new(&quoted),
            schema: opts.schema,
            quoted,
            clock: opts.clock,
            op_timeout: opts.op_timeout,
            replays: Tally::default(),
        })
    }

    /// The time parameter: the injected clock's, or NULL for the database's.
    pub(crate) fn now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| c.now().as_millis())
    }

    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| unavailable("connect", e))
    }

    pub(crate) async fn after_commit_client(&self) -> Result<Object, StoreError> {
        self.after_commit
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

    /// One key's record and the statement's time, by `sql` (a plain or a locking read).
    pub(crate) async fn read_on(
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

fn new_pool(
    config: tokio_postgres::Config,
    size: usize,
    timeout: Duration,
) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .map_err(|e| unavailable("pool", e))
}
