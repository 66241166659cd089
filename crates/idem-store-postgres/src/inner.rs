//! The state every operation shares: the two pools, the statements, the clock and the
//! operation timeout, with the helpers that take a connection, bound an operation in time
//! and read one record.
//!
//! The operation modules (claims, completions, leases, refusals, maintenance, the replay
//! writer) add their methods to [`Inner`] and depend on this module; it depends only on the
//! leaves (options, replays' tally, sql), so no module cycle runs through it.

use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use idem_core::clock::duration_millis;
use idem_core::{Key, Record, Scope, StoreError, Timestamp};
use tokio_postgres::GenericClient as _;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{NoTls, Row, Statement};

use crate::options::PgOptions;
use crate::prepared::Prepared;
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
    /// `sql`'s statements as each direct connection prepared them.
    pub(crate) prepared: Prepared,
    pub(crate) schema: String,
    pub(crate) quoted: String,
    clock: Option<Arc<dyn idem_core::Clock>>,
    op_timeout: Duration,
    pub(crate) replays: Tally,
    /// Behind a transaction pooler: unnamed statements, settings per transaction.
    pooled: bool,
    /// What a write of its own opens with behind a pooler, per [`Lane`].
    begin_claim: String,
    begin_after_commit: String,
    /// What the two pools connect with, for the batchers' pools of a handle on another
    /// runtime ([`Inner::own_batch_pools`]).
    claim_config: tokio_postgres::Config,
    after_commit_config: tokio_postgres::Config,
    /// How many batches of each kind run at once, so how many connections they need.
    pub(crate) batches_in_flight: usize,
    /// Connections the handles of other runtimes may still open for their own batchers
    /// ([`Inner::own_batch_pools`]): `pool_size` at connect.
    own_budget: AtomicUsize,
}

/// The pools batched claims and batched completions take their connection from.
pub(crate) struct BatchPools {
    pub(crate) claims: Pool,
    pub(crate) completions: Pool,
}

/// A statement's parameters, each with its type: behind a pooler a statement is unnamed and
/// sent with its types in the same round trip as its execution.
pub(crate) type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

/// Which settings a statement needs, which is which pool's: a claim must be durable before
/// the effect runs; a completion, release, extend, replay count or purge need not wait for
/// the disk ([design §9](docs/design.md#9-performance-shape)); a read changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Read,
    Claim,
    AfterCommit,
}

/// A connection, or a transaction on one: what a statement runs on.
pub(crate) trait Conn: deadpool_postgres::GenericClient + Sync {
    /// tokio-postgres's own client, for what deadpool's trait lacks (unnamed statements).
    type Raw: tokio_postgres::GenericClient + Sync;
    fn raw(&self) -> &Self::Raw;
    /// deadpool's statement cache of the connection: one per connection, shared by its
    /// transactions, so its address names the connection ([`crate::prepared`]).
    fn statement_cache(&self) -> &Arc<deadpool_postgres::StatementCache>;
    /// Whether statements already run inside a transaction (the caller's, or an
    /// operator's resolution): then they take the transaction's settings.
    fn in_transaction(&self) -> bool;
}

tokio::task_local! {
    /// The operation [`Inner::within`] is running, whose [`Checkout`]s read at their drop
    /// whether it gave up.
    static GAVE_UP: Arc<GaveUp>;
}

/// Whether an operation gave up before it finished: its time ran out, or whoever awaited it
/// dropped it (a client gone, a heartbeat stopped). Set before the operation is dropped.
/// An operation inside another (a release inside a batch of claims) needs nothing more: when
/// the outer one gives up, the inner one is dropped unfinished with it and sets its own.
struct GaveUp(AtomicBool);

impl GaveUp {
    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Sets [`GaveUp`] when the operation is dropped unfinished, before the operation's own
/// fields (and so its checkouts) are dropped.
struct Abandoned<F> {
    op: Pin<Box<F>>,
    gave_up: Arc<GaveUp>,
    finished: bool,
}

impl<F: Future> Future for Abandoned<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let answered = self.op.as_mut().poll(cx);
        if answered.is_ready() {
            self.finished = true;
        }
        answered
    }
}

impl<F> Drop for Abandoned<F> {
    fn drop(&mut self) {
        if !self.finished {
            self.gave_up.set();
        }
    }
}

/// A pooled connection an operation is using. Dropped by an operation that gave up (its
/// time ran out in [`Inner::within`], or it was dropped unfinished), it is closed rather than
/// returned to its pool.
///
/// A statement that got no answer in time may never get one: the server's host gone without
/// a word, a NAT or a firewall that forgot the connection. tokio-postgres queues the next
/// statement behind the unanswered one, so a pool given that connection back would hand it
/// out again and again, each operation on it timing out, until TCP gave up on it, minutes
/// to hours later; a batcher's batch on it would hold its slot as long. Closed, it is replaced
/// by a new connection on the next use. Dropped on any other path (an operation that
/// finished, with or without an error) it goes back to its pool.
///
/// On the claim lane of a direct connection its statement is cancelled before it is closed
/// ([`cancel_then_close`]): a commit there waits for a synchronous standby, and PostgreSQL's
/// backend neither notices a closed connection during that wait nor ends it at
/// `statement_timeout`.
pub(crate) struct Checkout {
    client: Option<Object>,
    gave_up: Option<Arc<GaveUp>>,
    /// Whether a statement left running is cancelled when the connection is given up on.
    cancels: bool,
}

impl Checkout {
    /// `client`, for the operation running in the current [`Inner::within`] (none outside
    /// one: such a connection always goes back to its pool).
    fn new(client: Object, cancels: bool) -> Self {
        Checkout {
            client: Some(client),
            gave_up: GAVE_UP.try_with(Arc::clone).ok(),
            cancels,
        }
    }
}

impl Deref for Checkout {
    type Target = Object;
    fn deref(&self) -> &Object {
        // Taken only in `drop`.
        self.client
            .as_ref()
            .unwrap_or_else(|| unreachable!("checkout used after drop"))
    }
}

impl DerefMut for Checkout {
    fn deref_mut(&mut self) -> &mut Object {
        self.client
            .as_mut()
            .unwrap_or_else(|| unreachable!("checkout used after drop"))
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let gave_up = self.gave_up.as_ref().is_some_and(|g| g.is_set());
        if gave_up && let Some(client) = self.client.take() {
            tracing::warn!(
                "closing a PostgreSQL connection whose operation gave up (no answer in time, or its caller left); the next use opens a new one"
            );
            // Out of the pool for good; dropping deadpool's wrapper aborts the connection's
            // task, which closes its socket.
            let client = Object::take(client);
            if self.cancels {
                cancel_then_close(client);
            } else {
                drop(client);
            }
        }
    }
}

/// How long a connection given up on waits for its statement's cancel to be delivered before
/// it is closed anyway (the server may be out of reach, the reason it was given up on).
const CANCEL_BOUND: Duration = Duration::from_secs(5);

/// Cancels what `client` is running, then closes it. The claim lane commits with
/// `synchronous_commit = on`: with its synchronous standby gone, a commit waits until the
/// standby is back, and neither `statement_timeout` nor the closed connection ends that wait
/// (PostgreSQL's `SyncRepWaitForLSN` heeds only a cancel or a terminate). Closed without a
/// cancel, each connection given up on would leave a backend waiting, one more per operation
/// timeout, until the server's connection slots ran out for everyone who shares it
/// (`tests/failover.rs`, `a_stalled_synchronous_standby_leaves_no_backend_waiting`).
///
/// What the cancel changes: PostgreSQL keeps a commit whose wait was cancelled (it was
/// already flushed locally), and makes it visible at once, before any standby has it, where
/// it would otherwise have become visible once the standby came back. Nobody was told that
/// claim was acquired (its caller was told the store was unavailable, and no future that
/// could read the commit's answer is left: the checkout is dropped with the operation), so no
/// effect runs on it: other requests see the key in flight, and a failover may lose the row,
/// as it may lose any claim nobody heard of.
fn cancel_then_close(client: deadpool_postgres::ClientWrapper) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // Outside a runtime (a store dropped at exit) there is nothing to send it with.
        return drop(client);
    };
    let cancel = client.cancel_token();
    runtime.spawn(async move {
        let deadline = tokio::time::Instant::now() + CANCEL_BOUND;
        let sent = tokio::time::timeout_at(deadline, cancel.cancel_query(NoTls)).await;
        // The cancel is on its way; the connection is closed once the statement it cancels
        // has answered (or the bound has passed), so its answer is read, not cut off.
        let answered = match sent {
            Ok(Ok(())) => tokio::time::timeout_at(deadline, client.batch_execute(""))
                .await
                .map_err(|_| format!("no answer within {CANCEL_BOUND:?}"))
                .map(|_| ()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {CANCEL_BOUND:?}")),
        };
        if let Err(why) = answered {
            tracing::warn!(error = %why, "could not cancel the statement of a PostgreSQL connection given up on");
        }
        drop(client);
    });
}

impl Conn for Object {
    type Raw = tokio_postgres::Client;
    fn raw(&self) -> &tokio_postgres::Client {
        self
    }
    fn statement_cache(&self) -> &Arc<deadpool_postgres::StatementCache> {
        &self.statement_cache
    }
    fn in_transaction(&self) -> bool {
        false
    }
}

impl<'a> Conn for deadpool_postgres::Transaction<'a> {
    type Raw = tokio_postgres::Transaction<'a>;
    fn raw(&self) -> &tokio_postgres::Transaction<'a> {
        self
    }
    fn statement_cache(&self) -> &Arc<deadpool_postgres::StatementCache> {
        &self.statement_cache
    }
    fn in_transaction(&self) -> bool {
        true
    }
}

impl Inner {
    /// Opens the two pools (connections are made on first use) and writes the statements
    /// for `opts.schema`. `pooled`: a pooler stands in between (see [`crate::Pooler`]), so
    /// the settings go in each transaction rather than in the connections' startup options.
    pub(crate) fn new(opts: PgOptions, pooled: bool) -> Result<Self, StoreError> {
        let settings = Settings::of(&opts);
        let (claim_config, after_commit_config) = if pooled {
            (opts.config.clone(), opts.config.clone())
        } else {
            (
                settings.startup(&opts.config, Lane::Claim),
                settings.startup(&opts.config, Lane::AfterCommit),
            )
        };
        let pool = new_pool(claim_config.clone(), opts.pool_size, opts.op_timeout)?;
        let after_commit = new_pool(
            after_commit_config.clone(),
            opts.pool_size.div_ceil(2),
            opts.op_timeout,
        )?;
        let quoted = format!("\"{}\"", opts.schema);
        Ok(Inner {
            pool,
            after_commit,
            sql: Sql::new(&quoted),
            prepared: Prepared::default(),
            schema: opts.schema,
            quoted,
            clock: opts.clock,
            op_timeout: opts.op_timeout,
            replays: Tally::default(),
            pooled,
            begin_claim: settings.begin(Lane::Claim),
            begin_after_commit: settings.begin(Lane::AfterCommit),
            claim_config,
            after_commit_config,
            batches_in_flight: opts.batches_in_flight.max(1),
            own_budget: AtomicUsize::new(opts.pool_size),
        })
    }

    /// The first pool's size, as the options gave it.
    pub(crate) fn pool_size(&self) -> usize {
        self.pool.status().max_size
    }

    /// The store's own pools, for the batchers started at connect.
    pub(crate) fn shared_batch_pools(&self) -> BatchPools {
        BatchPools {
            claims: self.pool.clone(),
            completions: self.after_commit.clone(),
        }
    }

    /// Pools of their own for batchers started on another runtime, one connection per batch
    /// in flight in each. deadpool spawns a connection's task on the runtime that asks for
    /// it, so these connections are driven where the batches run: a serving thread's claims
    /// are written and answered on that thread, not by the runtime that connected first.
    /// Nothing connects until the first batch.
    ///
    /// `None` once the handles' budget (`pool_size` connections in all) is spent: a gateway
    /// with many serving threads must not open 4 connections per thread past what the
    /// server allows, so the later handles share the store's batchers, as every handle did
    /// before they had their own.
    pub(crate) fn own_batch_pools(&self) -> Result<Option<BatchPools>, StoreError> {
        let needed = 2 * self.batches_in_flight;
        let taken = self
            .own_budget
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(needed)
            });
        if taken.is_err() {
            return Ok(None);
        }
        Ok(Some(BatchPools {
            claims: new_pool(
                self.claim_config.clone(),
                self.batches_in_flight,
                self.op_timeout,
            )?,
            completions: new_pool(
                self.after_commit_config.clone(),
                self.batches_in_flight,
                self.op_timeout,
            )?,
        }))
    }

    /// Whether statements are unnamed and settings per transaction (a pooler in between).
    pub(crate) fn pooled(&self) -> bool {
        self.pooled
    }

    /// The rows of `sql` on `c`. Direct: a prepared statement cached on the connection, the
    /// settings the connection's own. Behind a pooler: an unnamed statement, parsed where it
    /// runs, and a write outside a transaction runs in one of its own whose first statement
    /// sets what `lane` needs (`SET LOCAL`): both are sent at once with the `COMMIT`, so it
    /// costs no extra round trip.
    pub(crate) async fn query(
        &self,
        c: &impl Conn,
        lane: Lane,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        if !self.pooled {
            let values = values(params);
            let run = |stmt: Statement| {
                let values = &values;
                async move { c.query(&stmt, values).await }
            };
            return self.prepared.run(&self.sql, c, sql, params, run).await;
        }
        let raw = c.raw();
        self.pooled_write(c, lane, raw.query_typed(sql, params))
            .await
    }

    /// Like [`Inner::query`], for a statement whose count of changed rows is its answer.
    pub(crate) async fn execute(
        &self,
        c: &impl Conn,
        lane: Lane,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        if !self.pooled {
            let values = values(params);
            let run = |stmt: Statement| {
                let values = &values;
                async move { c.execute(&stmt, values).await }
            };
            return self.prepared.run(&self.sql, c, sql, params, run).await;
        }
        let raw = c.raw();
        self.pooled_write(c, lane, raw.execute_typed(sql, params))
            .await
    }

    /// Behind a pooler: `statement` alone inside a transaction (the caller's) or for a read;
    /// otherwise inside a transaction of its own that sets `lane`'s settings first.
    async fn pooled_write<T>(
        &self,
        c: &impl Conn,
        lane: Lane,
        statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, tokio_postgres::Error> {
        if lane == Lane::Read || c.in_transaction() {
            return statement.await;
        }
        let raw = c.raw();
        let begin = raw.batch_execute(self.begin(lane));
        let commit = raw.batch_execute("COMMIT");
        // In order: each sends its messages when first polled, so the three leave together.
        let (begun, out, committed) = tokio::join!(biased; begin, statement, commit);
        begun?;
        let out = out?;
        // A claim is durable only once this answers; until then it is not acknowledged.
        committed?;
        Ok(out)
    }

    /// Sets `lane`'s settings inside a transaction the store opened itself (an operator's
    /// resolution): behind a pooler the connection's own are the server's defaults.
    pub(crate) async fn set_local(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        lane: Lane,
    ) -> Result<(), tokio_postgres::Error> {
        if !self.pooled {
            return Ok(());
        }
        let begin = self.begin(lane);
        tx.batch_execute(begin.strip_prefix("BEGIN; ").unwrap_or(begin))
            .await
    }

    fn begin(&self, lane: Lane) -> &str {
        match lane {
            Lane::AfterCommit => &self.begin_after_commit,
            Lane::Claim | Lane::Read => &self.begin_claim,
        }
    }

    /// The time parameter: the injected clock's, or NULL for the database's.
    pub(crate) fn now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| c.now().as_millis())
    }

    pub(crate) async fn client(&self) -> Result<Checkout, StoreError> {
        self.checkout(&self.pool, Lane::Claim).await
    }

    /// A connection of the claim lane's pool for a read, which commits nothing and so never
    /// waits for a standby: nothing to cancel if it gives up.
    pub(crate) async fn read_client(&self) -> Result<Checkout, StoreError> {
        self.checkout(&self.pool, Lane::Read).await
    }

    pub(crate) async fn after_commit_client(&self) -> Result<Checkout, StoreError> {
        self.checkout(&self.after_commit, Lane::AfterCommit).await
    }

    /// A connection from `pool`, of `lane`, for the operation under way (see [`Checkout`]).
    ///
    /// Its statement is cancelled if the operation gives up, on the claim lane of a direct
    /// connection: there a commit can wait on the standby with no bound of the server's
    /// ([`cancel_then_close`]). A read commits nothing; the after-commit lane's statements end
    /// at `statement_timeout`, and a completion, release or extend that lands late is still
    /// worth having. Behind a pooler (found out, or `pooler=transaction`) no cancel is sent: tokio-postgres closes its cancel connection
    /// as soon as the request is written, and PgBouncer 1.18 (Debian 12's) can crash on a
    /// cancel client that leaves before the server has answered (pgbouncer/pgbouncer#801,
    /// fixed in 1.20).
    pub(crate) async fn checkout(&self, pool: &Pool, lane: Lane) -> Result<Checkout, StoreError> {
        let cancels = lane == Lane::Claim && !self.pooled;
        pool.get()
            .await
            .map(|client| Checkout::new(client, cancels))
            .map_err(|e| unavailable("connect", e))
    }

    /// Runs `op`, which takes its connections from the pools, within the operation
    /// timeout; past it the store is unavailable and those connections are closed.
    pub(crate) fn bounded<'a, T: 'a>(
        &self,
        op: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'a {
        self.within(self.op_timeout, op)
    }

    /// Waits for an answer from a batcher within the operation timeout; past it the store is
    /// unavailable. The batch holds the connection, under its own bound
    /// ([`Inner::batch_bound`]).
    pub(crate) async fn answered<T>(
        &self,
        answer: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.op_timeout, answer).await {
            Ok(r) => r,
            Err(_) => Err(timed_out(self.op_timeout)),
        }
    }

    /// How long a batch of claims or completions may run: a connection's wait and its making
    /// (up to the operation timeout each), then past the server's own bound on a statement
    /// (`statement_timeout`, twice the operation timeout). No caller waits that long (each
    /// gives up at the operation timeout), and a healthy server has answered or failed the
    /// batch's claim statements by then (the claims of callers that left are released after
    /// the batch, outside this bound: [`Inner::release_departed`]). A batch still
    /// unanswered is on a connection that will not answer, and would hold its batcher's
    /// slot, so every later batch of the lane queued behind it.
    pub(crate) fn batch_bound(&self) -> Duration {
        self.op_timeout.saturating_mul(5)
    }

    /// Runs `op` for at most `limit`; past it the store is unavailable, `op` is dropped and
    /// the connections it held are closed, not pooled ([`Checkout`]); so are they when the
    /// returned future is dropped before `op` finished.
    ///
    /// `op` is boxed once, inside the task-local scope, and the race with the timer once
    /// more (small by then): a batch's future is kilobytes, and the scope and the
    /// race would otherwise each move it again (callgrind: ~30,000 instructions of `memcpy`
    /// per PostgreSQL new key).
    pub(crate) fn within<'a, T: 'a>(
        &self,
        limit: Duration,
        op: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'a {
        let gave_up = Arc::new(GaveUp(AtomicBool::new(false)));
        let op = GAVE_UP.scope(gave_up.clone(), Box::pin(op));
        let timed = gave_up.clone();
        let raced = async move {
            let mut op = std::pin::pin!(op);
            tokio::select! {
                biased;
                answered = &mut op => answered,
                () = tokio::time::sleep(limit) => {
                    // Before `op` is dropped (at the end of this block), so its checkouts
                    // see it.
                    timed.set();
                    Err(timed_out(limit))
                }
            }
        };
        Abandoned {
            op: Box::pin(raced),
            gave_up,
            finished: false,
        }
    }

    /// One key's record and the statement's time, by `sql` (a plain or a locking read).
    pub(crate) async fn read_on(
        &self,
        client: &impl Conn,
        sql: &str,
        scope: &Scope,
        key: &Key,
    ) -> Result<(Timestamp, Option<Record>), StoreError> {
        let rows = self
            .query(
                client,
                Lane::Read,
                sql,
                &[
                    (&self.now(), Type::INT8),
                    (&scope.as_str(), Type::TEXT),
                    (&key.as_str(), Type::TEXT),
                ],
            )
            .await
            .map_err(|e| unavailable("read", e))?;
        let row = rows
            .first()
            .ok_or_else(|| unavailable_because("read", "no row"))?;
        Ok((now_of(row)?, record_of(row)?))
    }
}

/// The parameters' values alone, for a prepared statement.
fn values<'a>(params: &Params<'a>) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|(v, _)| *v).collect()
}

/// The settings every idem connection runs with, whatever the database's or role's
/// defaults: as startup options on a direct connection, or `SET LOCAL` in each transaction
/// behind a pooler.
pub(crate) struct Settings {
    lock_ms: i64,
    statement_ms: i64,
}

impl Settings {
    pub(crate) fn of(opts: &PgOptions) -> Self {
        // The server gives up too, not only the caller: a claim waiting on a row another
        // transaction holds must not keep its batch (and every key queued behind it) past
        // the operation timeout. The statement bound is twice the caller's: PostgreSQL
        // answers a commit whose wait for a synchronous standby was cancelled as a success
        // (with a warning), so the server must never give up on a claim before its caller
        // has, or the caller could hold a claim no standby has.
        let op_ms = duration_millis(opts.op_timeout).max(1);
        Settings {
            lock_ms: (op_ms / 2).clamp(1, 2000),
            statement_ms: op_ms.saturating_mul(2),
        }
    }

    /// `(name, value)` for `lane`. Claims are durable before the effect runs; the rest need
    /// not wait for the disk, and plan each execution: batches of completions join with key
    /// arrays, and a plan cached while the table was small would scan it whole.
    fn pairs(&self, lane: Lane) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            ("lock_timeout", self.lock_ms.to_string()),
            ("statement_timeout", self.statement_ms.to_string()),
        ];
        match lane {
            Lane::Claim | Lane::Read => pairs.push(("synchronous_commit", "on".into())),
            Lane::AfterCommit => {
                pairs.push(("synchronous_commit", "off".into()));
                pairs.push(("plan_cache_mode", "force_custom_plan".into()));
            }
        }
        pairs
    }

    pub(crate) fn startup(
        &self,
        config: &tokio_postgres::Config,
        lane: Lane,
    ) -> tokio_postgres::Config {
        let mut options = config.get_options().unwrap_or_default().to_owned();
        for (name, value) in self.pairs(lane) {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let mut config = config.clone();
        config.options(options.trim_start());
        config
    }

    fn begin(&self, lane: Lane) -> String {
        let sets: Vec<String> = self
            .pairs(lane)
            .iter()
            .map(|(name, value)| format!("set_config('{name}', '{value}', true)"))
            .collect();
        format!("BEGIN; SELECT {}", sets.join(", "))
    }
}

fn timed_out(limit: Duration) -> StoreError {
    unavailable_because("timed out", format!("no answer within {limit:?}"))
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
