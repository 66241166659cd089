//! [`PgStore`]: the `Store` methods as single statements over a connection pool.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use idem_core::clock::duration_millis;
use idem_core::store::columns::Columns;
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, FencingToken, Key, Lease, Record, Resolution, Scope,
    Store, StoreError, StoredResponse, Timestamp, machine,
};
use tokio::sync::oneshot;
use tokio_postgres::NoTls;

use crate::batch::{Batcher, Job};
use crate::options::PgOptions;
use crate::replays::{self, Tally};
use crate::schema;
use crate::sql::{Sql, now_of, record_of, unavailable, unavailable_because};

/// How many times a claim is run again when a racing writer left its snapshot behind. Each
/// run takes a fresh snapshot, so a second run settles it unless yet another writer raced.
const CLAIM_RUNS: usize = 8;

/// A claim statement's row for one key.
#[derive(Debug)]
pub(crate) struct ClaimRow {
    acquired: bool,
    now: Timestamp,
    rec: Record,
}

/// A claim waiting for its batch, with the token it will hold if it acquires.
pub(crate) type ClaimJob = (ClaimRequest, FencingToken);

/// A claim statement that failed. `busy`: the server gave up waiting on a lock
/// (`lock_timeout`) or on the statement (`statement_timeout`), so the key is held by another
/// transaction rather than the store being down.
#[derive(Debug)]
struct Failed {
    error: StoreError,
    busy: bool,
}

impl From<StoreError> for Failed {
    fn from(error: StoreError) -> Self {
        Failed { error, busy: false }
    }
}

fn busy(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED
    )
}

/// A [`StoreError`] again: the same message for each key a shared failure answers.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        other => unavailable_because("claim", other),
    }
}

/// A completion waiting for its batch.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    pub(crate) token: FencingToken,
    /// The response, encoded.
    pub(crate) response: Vec<u8>,
}

/// The most requests one batched statement carries.
const MAX_BATCH: usize = 256;

/// The PostgreSQL [`Store`]. Cloning shares one pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pool: Pool,
    /// Connections whose commits do not wait for the disk and whose statements are planned
    /// per execution: for completions, releases, extends, replay counts and purges. DESIGN
    /// §9: a completion may be written asynchronously if before the lease could end; the
    /// WAL writer flushes within a second, leases last tens of seconds. A claim is never
    /// sent here: it must be durable before the effect runs.
    after_commit: Pool,
    pub(crate) sql: Sql,
    schema: String,
    quoted: String,
    clock: Option<Arc<dyn idem_core::Clock>>,
    op_timeout: Duration,
    pub(crate) replays: Tally,
    claims: OnceLock<Batcher<ClaimJob, Result<Claim, StoreError>>>,
    completions: OnceLock<Batcher<Completion, Result<Record, StoreError>>>,
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
        let inner = Arc::new(Inner {
            pool,
            after_commit,
            sql: Sql::new(&quoted),
            schema: opts.schema,
            quoted,
            clock: opts.clock,
            op_timeout: opts.op_timeout,
            replays: Tally::default(),
            claims: OnceLock::new(),
            completions: OnceLock::new(),
        });
        inner
            .bounded(async {
                let mut client = inner.client().await?;
                schema::migrate(&mut client, &inner.schema, &inner.quoted).await
            })
            .await?;
        tokio::spawn(replays::flush_loop(Arc::downgrade(&inner)));
        // The batchers hold the store weakly: dropping the last PgStore ends them.
        let in_flight = opts.batches_in_flight.max(1);
        let weak = Arc::downgrade(&inner);
        let _ = inner
            .claims
            .set(Batcher::start(MAX_BATCH, in_flight, move |jobs| {
                let weak = weak.clone();
                async move {
                    if let Some(inner) = weak.upgrade() {
                        inner.claim_batch(jobs).await;
                    }
                }
            }));
        let weak = Arc::downgrade(&inner);
        let _ = inner
            .completions
            .set(Batcher::start(MAX_BATCH, in_flight, move |jobs| {
                let weak = weak.clone();
                async move {
                    if let Some(inner) = weak.upgrade() {
                        inner.complete_batch(jobs).await;
                    }
                }
            }));
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

impl Inner {
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

    /// Runs the claim statement for `reqs` (distinct keys, one abandoned policy); returns
    /// each key's row: acquired or not, the statement's time, and the record.
    async fn claim_rows(
        &self,
        client: &impl GenericClient,
        reqs: &[(&ClaimRequest, FencingToken)],
        retry: bool,
    ) -> Result<HashMap<(String, String), Result<ClaimRow, StoreError>>, Failed> {
        let stmt = client
            .prepare_cached(&self.sql.claim)
            .await
            .map_err(|e| unavailable("prepare claim", e))?;
        let scopes: Vec<&str> = reqs.iter().map(|(r, _)| r.scope.as_str()).collect();
        let keys: Vec<&str> = reqs.iter().map(|(r, _)| r.key.as_str()).collect();
        let fps: Vec<&[u8]> = reqs
            .iter()
            .map(|(r, _)| r.fingerprint.as_bytes().as_slice())
            .collect();
        let tokens: Vec<i64> = reqs.iter().map(|(_, t)| t.as_i64()).collect();
        let leases: Vec<i64> = reqs.iter().map(|(r, _)| duration_millis(r.lease)).collect();
        // One retention per statement: a batch is split by it, as by the abandoned policy.
        let retention = reqs
            .first()
            .map_or(0, |(r, _)| duration_millis(r.retention));
        let rows = client
            .query(
                &stmt,
                &[
                    &self.now(),
                    &scopes,
                    &keys,
                    &fps,
                    &tokens,
                    &leases,
                    &retry,
                    &retention,
                ],
            )
            .await
            .map_err(|e| Failed {
                busy: busy(&e),
                error: unavailable("claim", e),
            })?;
        // Each row is read on its own: a row idem cannot read fails its own key only. The
        // statement committed for the others.
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let id = (
                row.try_get::<_, String>("scope"),
                row.try_get::<_, String>("key"),
            );
            let (Ok(scope), Ok(key)) = id else { continue };
            let decoded = (|| {
                let now = now_of(&row)?;
                let rec = record_of(&row)?.ok_or_else(|| {
                    StoreError::Corrupt("postgres claim returned no record".into())
                })?;
                let acquired: bool = row
                    .try_get("acquired")
                    .map_err(|e| unavailable("claim", e))?;
                Ok(ClaimRow { acquired, now, rec })
            })();
            out.insert((scope, key), decoded);
        }
        Ok(out)
    }

    /// The answer to `req` from its row, or `None` when a racing writer left the statement's
    /// snapshot behind and the claim must run again.
    fn settle(
        &self,
        req: &ClaimRequest,
        token: FencingToken,
        row: Option<&Result<ClaimRow, StoreError>>,
    ) -> Result<Option<Claim>, StoreError> {
        let Some(row) = row else {
            return Ok(None);
        };
        let ClaimRow { acquired, now, rec } = match row {
            Ok(r) => r,
            Err(e) => return Err(copy(e)),
        };
        // A record in flight under this claim's own token is this claim's: an earlier run of
        // it committed although its answer was lost (a connection cut after the commit).
        let ours = rec.token == token && rec.completed_at.is_none();
        if *acquired || ours {
            if rec.token != token {
                return Err(StoreError::Corrupt(
                    "postgres claim acquired under another token".into(),
                ));
            }
            return Ok(Some(Claim::Acquired(Lease {
                token,
                expires_at: rec.lease_expires_at,
                attempt: rec.attempts,
            })));
        }
        Ok(match machine::claim(Some(rec), req, *now, token).0 {
            Claim::Acquired(_) => None,
            Claim::Completed(replayed) => {
                self.replays.count(&rec.scope, &rec.key, rec.token);
                Some(Claim::Completed(replayed))
            }
            answer => Some(answer),
        })
    }

    /// One claim on `client`: the pool's connection, or a service's transaction.
    pub(crate) async fn claim_on(
        &self,
        client: &impl GenericClient,
        req: &ClaimRequest,
        token: FencingToken,
    ) -> Result<Claim, StoreError> {
        let retry = req.on_abandoned == AbandonedPolicy::Retry;
        let id = (req.scope.as_str().to_owned(), req.key.as_str().to_owned());
        for _ in 0..CLAIM_RUNS {
            let rows = self
                .claim_rows(client, &[(req, token)], retry)
                .await
                .map_err(|f| f.error)?;
            if let Some(answer) = self.settle(req, token, rows.get(&id))? {
                return Ok(answer);
            }
        }
        Err(unavailable_because(
            "claim",
            format!("did not settle in {CLAIM_RUNS} runs under contention"),
        ))
    }

    /// A batch of claims: one statement per (abandoned policy, retention) among distinct
    /// keys. A key claimed twice in one batch is answered from the first one's row; any claim
    /// the statement left unsettled runs alone after, with the same token.
    async fn claim_batch(&self, jobs: Vec<Job<ClaimJob, Result<Claim, StoreError>>>) {
        // A caller that gave up (its timeout passed) is not claimed for: nobody would hold
        // the lease, and its retry would find the key in flight, then abandoned.
        let jobs: Vec<_> = jobs.into_iter().filter(|(_, r)| !r.is_closed()).collect();
        if jobs.is_empty() {
            return;
        }
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => {
                let why = e.to_string();
                for (_, reply) in jobs {
                    let _ = reply.send(Err(unavailable_because("claim", &why)));
                }
                return;
            }
        };
        let mut groups: HashMap<(bool, Duration), Vec<_>> = HashMap::new();
        let mut dups = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for ((req, token), reply) in jobs {
            if seen.insert((req.scope.clone(), req.key.clone())) {
                let policy = (req.on_abandoned == AbandonedPolicy::Retry, req.retention);
                groups.entry(policy).or_default().push((req, token, reply));
            } else {
                dups.push((req, token, reply));
            }
        }
        let mut alone = Vec::new();
        let mut all_rows = HashMap::new();
        for ((retry, _), mut group) in groups {
            // Key order: concurrent batches lock rows in one order and cannot deadlock.
            group.sort_by(|a, b| (&a.0.scope, &a.0.key).cmp(&(&b.0.scope, &b.0.key)));
            let reqs: Vec<_> = group.iter().map(|(r, t, _)| (r, *t)).collect();
            let rows = self.claim_rows(&client, &reqs, retry).await;
            // A lone claim that waited out the lock timeout is answered now, not run again:
            // its key is held by a transaction, and a second wait would keep this batch's
            // slot from every other key.
            let lone_busy = group.len() == 1 && matches!(&rows, Err(f) if f.busy);
            for (req, token, reply) in group {
                let id = (req.scope.as_str().to_owned(), req.key.as_str().to_owned());
                let settled = match &rows {
                    Ok(rows) => self.settle(&req, token, rows.get(&id)),
                    Err(f) if lone_busy => Err(copy(&f.error)),
                    // The statement failed: each claim runs alone, with its token, so one
                    // that did commit is recognised as its own.
                    Err(_) => Ok(None),
                };
                match settled {
                    Ok(Some(answer)) => self.answer(&req, answer, reply).await,
                    Ok(None) => alone.push((req, token, reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            if let Ok(rows) = rows {
                all_rows.extend(rows);
            }
        }
        for (req, token, reply) in dups {
            let id = (req.scope.as_str().to_owned(), req.key.as_str().to_owned());
            let row = all_rows.get(&id).map(|r| {
                r.as_ref().map_err(copy).map(|r| ClaimRow {
                    acquired: false,
                    now: r.now,
                    rec: r.rec.clone(),
                })
            });
            match self.settle(&req, token, row.as_ref()) {
                Ok(Some(answer)) => self.answer(&req, answer, reply).await,
                Ok(None) => alone.push((req, token, reply)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        for (req, token, reply) in alone {
            if reply.is_closed() {
                continue;
            }
            match self.claim_on(&client, &req, token).await {
                Ok(answer) => self.answer(&req, answer, reply).await,
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
    }

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

    /// Sends a claim's answer. A lease whose caller is gone is released at once: nobody
    /// will run the effect, and the key must not wait for the lease to end and then read
    /// as an unknown outcome.
    async fn answer(
        &self,
        req: &ClaimRequest,
        answer: Claim,
        reply: oneshot::Sender<Result<Claim, StoreError>>,
    ) {
        if let Err(Ok(Claim::Acquired(lease))) = reply.send(Ok(answer)) {
            match self.release_one(&req.scope, &req.key, lease.token).await {
                Ok(()) => tracing::debug!(key = %req.key, "released a claim whose caller was gone"),
                Err(e) => tracing::warn!(
                    key = %req.key, error = %e,
                    "a claim whose caller was gone could not be released; it will read as abandoned"
                ),
            }
        }
    }

    /// Runs the complete statement for `items` (distinct keys); returns each key's record.
    async fn complete_rows(
        &self,
        client: &impl GenericClient,
        items: &[&Completion],
    ) -> Result<HashMap<(String, String), Record>, StoreError> {
        let stmt = client
            .prepare_cached(&self.sql.complete)
            .await
            .map_err(|e| unavailable("prepare complete", e))?;
        let scopes: Vec<&str> = items.iter().map(|c| c.scope.as_str()).collect();
        let keys: Vec<&str> = items.iter().map(|c| c.key.as_str()).collect();
        let tokens: Vec<i64> = items.iter().map(|c| c.token.as_i64()).collect();
        let responses: Vec<&[u8]> = items.iter().map(|c| c.response.as_slice()).collect();
        let rows = client
            .query(&stmt, &[&self.now(), &scopes, &keys, &tokens, &responses])
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
        client: &impl GenericClient,
        c: &Completion,
    ) -> Result<Record, StoreError> {
        let stmt = client
            .prepare_cached(&self.sql.complete_one)
            .await
            .map_err(|e| unavailable("prepare complete", e))?;
        let row = client
            .query_opt(
                &stmt,
                &[
                    &self.now(),
                    &c.scope.as_str(),
                    &c.key.as_str(),
                    &c.token.as_i64(),
                    &c.response,
                ],
            )
            .await
            .map_err(|e| unavailable("complete", e))?;
        match row {
            Some(row) => record_of(&row)?
                .ok_or_else(|| StoreError::Corrupt("postgres complete returned no record".into())),
            None => Err(self.refusal(client, &c.scope, &c.key, c.token).await),
        }
    }

    /// A batch of completions; a key completed twice in one batch runs on its own after.
    async fn complete_batch(&self, jobs: Vec<Job<Completion, Result<Record, StoreError>>>) {
        let client = match self.after_commit_client().await {
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
        let mut rows = self.complete_rows(&client, &items).await;
        let failed = rows.is_err();
        let mut again = Vec::new();
        for (c, reply) in batch {
            let id = (c.scope.as_str().to_owned(), c.key.as_str().to_owned());
            match rows.as_mut().map(|r| r.remove(&id)) {
                Ok(Some(rec)) if rec.token == c.token => {
                    let _ = reply.send(Ok(rec));
                }
                // Refused (the reason is read alone), or the statement failed.
                _ => again.push((c, reply)),
            }
        }
        for (c, reply) in again {
            let done = if failed {
                self.complete_again(&client, &c).await
            } else {
                self.complete_on(&client, &c).await
            };
            let _ = reply.send(done);
        }
        for (c, reply) in alone {
            let _ = reply.send(self.complete_on(&client, &c).await);
        }
    }

    /// A completion run alone after its batch's statement failed. If the batch did commit it
    /// (the connection was cut after the commit), the record holds this token and this
    /// response: that is this completion, not a refusal.
    async fn complete_again(
        &self,
        client: &impl GenericClient,
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
        let batcher = inner
            .claims
            .get()
            .ok_or_else(|| unavailable_because("claim", "closed"))?;
        inner
            .bounded(async {
                batcher
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
        let inner = &self.inner;
        let batcher = inner
            .completions
            .get()
            .ok_or_else(|| unavailable_because("complete", "closed"))?;
        let job = Completion {
            scope: scope.clone(),
            key: key.clone(),
            token,
            response: response.encode(),
        };
        inner
            .bounded(async {
                batcher
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
        let inner = &self.inner;
        inner
            .bounded(async {
                let client = inner.after_commit_client().await?;
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
                let client = inner.after_commit_client().await?;
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
