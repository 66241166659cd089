//! The one writer: applies queued writes in group-committed transactions.
//!
//! The thread blocks for the first queued command, takes every other command already queued
//! (up to [`MAX_BATCH`]), applies them in `BEGIN IMMEDIATE` transactions and commits: one
//! fsync for the lot. Answers are sent only after the commit, so nobody hears "acquired" for a
//! claim that is not on disk. While it syncs, new commands queue up and form the next batch,
//! so the batch size follows the load by itself.
//!
//! If one command fails inside a batch (a database error, not a refusal like a stale token),
//! the batch is rolled back and each command is retried alone, so one bad command cannot fail
//! the others; a failed commit fails the whole batch, closed.
//!
//! A caller waits for its answer only up to the store's operation timeout, then drops its
//! receiver. A claim or resolution whose receiver is already closed when its batch is taken is
//! not applied: nobody would execute the claim, and the operator was told the resolution
//! failed. A claim acquired for a caller that left while its transaction ran is released right
//! after the commit. Completions, releases and extensions are applied whoever waits: they only
//! settle or keep a record its executor holds.
//!
//! Every claim comes here, replays too: a claim of a fresh key, the common case, costs one
//! hand-off between threads, where a read on a reader thread first cost two. The writer
//! first reads the batch's claims without the write lock, in one read transaction, and
//! answers those whose answer needs no write (a replay, a lease in flight, another
//! fingerprint, an abandoned record under `reject`), as a reader thread would; only the rest
//! take the lock ([`Writer::answer_from_read`]). So replays and polls do not take the file's
//! write lock, which other processes' writers wait for; their counts take it once every
//! [`COUNT_EVERY`], under `synchronous=NORMAL`. While a write waits for another process's
//! lock, the store sends claims to a reader thread first ([`Writer::begin_write`]), so what a
//! read settles is not queued behind that wait.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use idem_core::machine::{self, Write};
use idem_core::{
    Claim, ClaimRequest, Clock, FencingToken, Key, Record, Resolution, Scope, StoreError,
    StoredResponse, Timestamp,
};
use rusqlite::{Connection, Transaction, TransactionBehavior};
use tokio::sync::oneshot;

use crate::queue::take_queued;
use crate::{row, schema};

/// Most commands in one transaction; bounds how long one commit holds the file lock.
pub(crate) const MAX_BATCH: usize = 512;

/// How often, at most, the replays answered meanwhile are written. Each write takes the file's write
/// lock and adds to the WAL: once per round, a process answering replays took the lock as
/// often as one claiming keys, and starved the other processes' claims (`examples/contention.rs`:
/// a claiming process beside four replaying ones at 150 – 160 claims/s instead of 9,000 –
/// 12,000, with a WAL of 660 – 790 MB in 5 s).
const COUNT_EVERY: Duration = Duration::from_millis(250);

/// Counts that may find the lock taken in a row before one waits for it (five seconds' worth).
const KEEP_COUNTS_AT_MOST: u32 = 20;

/// A write to apply.
#[derive(Debug)]
pub(crate) enum Cmd {
    Claim(ClaimRequest),
    Complete {
        scope: Scope,
        key: Key,
        token: FencingToken,
        response: StoredResponse,
    },
    Release {
        scope: Scope,
        key: Key,
        token: FencingToken,
    },
    Extend {
        scope: Scope,
        key: Key,
        token: FencingToken,
        lease: Duration,
    },
    Resolve {
        scope: Scope,
        key: Key,
        resolution: Resolution,
    },
    Purge {
        limit: usize,
    },
}

/// What the store queues for the writer thread.
#[derive(Debug)]
pub(crate) enum Queued {
    /// A write to apply, and whoever waits for its answer.
    Job(Job),
    /// A replay a reader thread answered (while this writer waited for another process's
    /// write lock): added to the tally, never written in a transaction. Nobody waits for it.
    Replayed(Replayed),
}

/// The record a replay repeated: what its count is kept by.
pub(crate) type Replayed = (Scope, Key, FencingToken);

/// The record `claim` replayed, if it is a replay.
pub(crate) fn replayed(claim: &Claim) -> Option<Replayed> {
    match claim {
        Claim::Completed(r) => Some((r.scope.clone(), r.key.clone(), r.token)),
        _ => None,
    }
}

/// Replays answered since the last count, by record. A replay must cost no durable write
/// ([design §9](docs/design.md#9-performance-shape)): they are added up here and written
/// every [`COUNT_EVERY`], one statement per record, under `synchronous=NORMAL`.
type ReplayTally = HashMap<Replayed, u32>;

/// The answer to `req` that a read of its record settles without a write: a replay, a lease
/// in flight, another fingerprint, an abandoned lease under `reject`. `None` when the claim
/// needs a write. The writer asks it of the batch's reads before taking the lock, and the
/// store of a reader thread's read while the writer waits for another process's lock; a
/// replay's count is the caller's to keep, once the replay is heard.
pub(crate) fn settled_by_a_read(rec: &Record, req: &ClaimRequest, now: Timestamp) -> Option<Claim> {
    match machine::claim(Some(rec), req, now, FencingToken::random()) {
        (claim, Write::Nothing | Write::CountReplay) => Some(claim),
        _ => None,
    }
}

/// Adds `n` replays of one record to `tally`.
fn add_replays(tally: &mut ReplayTally, record: Replayed, n: u32) {
    let counted = tally.entry(record).or_insert(0);
    *counted = counted.saturating_add(n);
}

impl Cmd {
    /// Whether the answer must wait for an fsync.
    ///
    /// A claim must be durable before the side effect runs
    /// ([design §9](docs/design.md#9-performance-shape)), and an operator's resolution is a
    /// decision someone waits to see stick. A completion, release, extension or purge
    /// is committed and visible before it is answered, but may be lost in a power failure before
    /// the next fsync; the record then stays in flight and its lease runs out into `abandoned`
    /// ([design §6](docs/design.md#6-a-store-failure-fails-closed)), so nothing executes twice.
    pub(crate) fn needs_fsync(&self) -> bool {
        matches!(self, Cmd::Claim(_) | Cmd::Resolve { .. })
    }
}

impl Writer {
    /// A writer over a connection prepared by [`crate::schema::prepare_writer`].
    pub(crate) fn new(
        conn: Connection,
        path: PathBuf,
        clock: Arc<dyn Clock>,
        stats: Arc<Stats>,
        busy_timeout: Duration,
        waiting_for_lock: Arc<AtomicBool>,
    ) -> Self {
        Writer {
            conn,
            path,
            clock,
            sync: None,
            busy_timeout,
            stats,
            replays: ReplayTally::new(),
            counts_kept: 0,
            waiting_for_lock,
        }
    }
}

/// What a command produced.
#[derive(Debug)]
pub(crate) enum Done {
    Claim(Claim),
    Record(Record),
    Released,
    Extended(Timestamp),
    Resolved(Option<Record>),
    Purged(usize),
}

pub(crate) type Reply = Option<oneshot::Sender<Result<Done, StoreError>>>;

/// A queued command and where its answer goes.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) cmd: Cmd,
    pub(crate) reply: Reply,
}

impl Job {
    /// A claim or resolution whose caller stopped waiting (timed out, or dropped the call)
    /// before the writer got to it: applying it would grant a lease nobody executes, or
    /// settle a record behind the back of an operator who was told it failed.
    fn abandoned(&self) -> bool {
        matches!(self.cmd, Cmd::Claim(_) | Cmd::Resolve { .. })
            && self.reply.as_ref().is_some_and(|r| r.is_closed())
    }
}

pub(crate) struct Writer {
    conn: Connection,
    path: PathBuf,
    clock: Arc<dyn Clock>,
    /// The `synchronous` mode the connection is in, if known.
    sync: Option<Sync>,
    /// How long a transaction waits for another connection's write lock.
    busy_timeout: Duration,
    stats: Arc<Stats>,
    replays: ReplayTally,
    /// Counts in a row that found the write lock taken and kept the tally.
    counts_kept: u32,
    /// Set while a write waits for another connection's write lock; the store then asks a
    /// reader thread first for what a read settles ([`crate::SqliteStore`]'s `claim`).
    waiting_for_lock: Arc<AtomicBool>,
}

/// What the writer has done, for tests and operators: see [`crate::SqliteStore::writer_stats`].
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) transactions: AtomicU64,
    pub(crate) claims_committed: AtomicU64,
    pub(crate) claims_fsynced: AtomicU64,
}

/// How a transaction is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sync {
    /// `synchronous=FULL`: the WAL is fsynced before the commit returns.
    Full,
    /// `synchronous=NORMAL`: committed and visible to every reader, written to the OS but not
    /// yet fsynced; the next `Full` commit's fsync makes it durable too (the WAL is one file).
    Normal,
}

impl Writer {
    /// Runs until every sender is gone, then returns after the last batch is committed.
    ///
    /// Each round takes what is queued and commits it in at most two transactions: first the
    /// writes that need no fsync (see [`Cmd::needs_fsync`]), answered as soon as they are
    /// committed and visible; then the claims and resolutions, answered after the fsync. An
    /// executor so waits for one fsync per execution (its claim), not two. Replays are
    /// counted every [`COUNT_EVERY`] while there are some, and once more at the end.
    pub(crate) fn run(mut self, rx: Receiver<Queued>) {
        // As if the last count were a period ago: replays after a quiet spell are counted at
        // the end of their round, as `idem inspect` run right after expects; only a steady
        // stream of them is held to one count per period.
        let mut counted = Instant::now()
            .checked_sub(COUNT_EVERY)
            .unwrap_or_else(Instant::now);
        loop {
            let first = if self.replays.is_empty() {
                match rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            } else {
                match rx.recv_timeout(COUNT_EVERY.saturating_sub(counted.elapsed())) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.count_replays(false);
                        counted = Instant::now();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut batch = Vec::new();
            self.take(first, &mut batch);
            self.take_queued(&rx, &mut batch);
            let (mut durable, fast): (Vec<Job>, Vec<Job>) =
                batch.into_iter().partition(|j| j.cmd.needs_fsync());
            if !fast.is_empty() {
                self.commit_batch(fast, Sync::Normal);
                // Claims that arrived meanwhile (often from executors that just heard their
                // completion) share this round's fsync rather than wait for the next.
                self.take_queued(&rx, &mut durable);
            }
            if !durable.is_empty() {
                self.commit_batch(durable, Sync::Full);
            }
            if !self.replays.is_empty() && counted.elapsed() >= COUNT_EVERY {
                self.count_replays(false);
                counted = Instant::now();
            }
        }
        if !self.replays.is_empty() {
            self.count_replays(true);
        }
    }

    /// Puts a job into `batch`; a replay goes to the tally instead.
    fn take(&mut self, queued: Queued, batch: &mut Vec<Job>) {
        match queued {
            Queued::Job(job) => batch.push(job),
            Queued::Replayed(record) => add_replays(&mut self.replays, record, 1),
        }
    }

    /// Takes what `rx` already holds, without waiting, until `batch` has [`MAX_BATCH`] jobs.
    fn take_queued(&mut self, rx: &Receiver<Queued>, batch: &mut Vec<Job>) {
        let mut queued = Vec::new();
        take_queued(rx, &mut queued, MAX_BATCH.saturating_sub(batch.len()));
        for q in queued {
            self.take(q, batch);
        }
    }

    /// Writes the replays tallied since the last count. Bookkeeping: a replay was answered
    /// whether or not it is counted, so a failure is logged and the tally dropped.
    ///
    /// Without `wait`, a write lock held by another connection keeps the tally for the next
    /// count rather than holding the writer up for one; the last count waits.
    fn count_replays(&mut self, wait: bool) {
        // A lock taken at every try for five seconds: wait for it once rather than keep the
        // counts in memory without end.
        let wait = wait || self.counts_kept >= KEEP_COUNTS_AT_MOST;
        let tally = std::mem::take(&mut self.replays);
        let written = self.set_sync(Sync::Normal).and_then(|()| {
            let tx = if wait {
                Some(self.begin()?)
            } else {
                self.try_begin()?
            };
            let Some(tx) = tx else {
                return Ok(false);
            };
            for ((scope, key, token), n) in &tally {
                row::count_replays(&tx, scope, key, *token, *n)?;
            }
            tx.commit().map(|()| true)
        });
        match written {
            Ok(true) => self.counts_kept = 0,
            Ok(false) => {
                self.counts_kept += 1;
                for (id, n) in tally {
                    add_replays(&mut self.replays, id, n);
                }
            }
            Err(e) => {
                self.counts_kept = 0;
                tracing::warn!(error = %e, replays = tally.len(), "replays not counted");
            }
        }
    }

    /// `BEGIN IMMEDIATE` for a write: at once if the write lock is free; otherwise the store
    /// is told ([`Writer::waiting_for_lock`]) while this waits for it, up to the busy timeout.
    fn begin_write(&self) -> rusqlite::Result<Transaction<'_>> {
        if let Some(tx) = self.try_begin()? {
            return Ok(tx);
        }
        self.waiting_for_lock.store(true, Ordering::Release);
        let begun = self.begin();
        self.waiting_for_lock.store(false, Ordering::Release);
        begun
    }

    /// `BEGIN IMMEDIATE`, waiting up to the busy timeout for another connection's write lock.
    /// Counted in [`Stats::transactions`].
    fn begin(&self) -> rusqlite::Result<Transaction<'_>> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)
    }

    /// `BEGIN IMMEDIATE` without waiting: `None` at once when another connection holds the
    /// write lock. Counted in [`Stats::transactions`] when it begins. The transaction is begun
    /// on a shared borrow (`new_unchecked`: the writer never opens one inside another), so
    /// the busy timeout can be put back whichever way it went.
    fn try_begin(&self) -> rusqlite::Result<Option<Transaction<'_>>> {
        self.conn.busy_timeout(Duration::ZERO)?;
        let begun = Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate);
        self.conn.busy_timeout(self.busy_timeout)?;
        match begun {
            Ok(tx) => {
                self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                Ok(Some(tx))
            }
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_sync(&mut self, sync: Sync) -> rusqlite::Result<()> {
        if self.sync != Some(sync) {
            // Forget the mode first: if the pragma fails, the next batch sets it again.
            self.sync = None;
            let value = match sync {
                Sync::Full => "FULL",
                Sync::Normal => "NORMAL",
            };
            self.conn.pragma_update(None, "synchronous", value)?;
            self.sync = Some(sync);
        }
        Ok(())
    }

    fn commit_batch(&mut self, mut batch: Vec<Job>, sync: Sync) {
        batch.retain(|j| !j.abandoned());
        if batch.is_empty() {
            return;
        }
        let (mut cmds, mut replies): (Vec<Cmd>, Vec<Reply>) =
            batch.into_iter().map(|j| (j.cmd, j.reply)).unzip();
        if cmds.iter().any(|c| matches!(c, Cmd::Claim(_))) {
            (cmds, replies) = self.answer_from_read(cmds, replies);
            if cmds.is_empty() {
                return;
            }
        }
        // A claim must never be answered from a commit that was not fsynced: if the mode
        // cannot be set, the whole batch fails, closed.
        let outcomes = match self.set_sync(sync).and_then(|()| self.transact(&cmds)) {
            Ok(outcomes) => outcomes,
            // Retrying one by one helps only when one command broke the batch; when the file
            // is locked, full or failing, every retry would fail the same way, each after its
            // own busy timeout, so the whole batch fails at once.
            Err(e) if cmds.len() == 1 || !caused_by_one_command(&e) => {
                let failed = self.unavailable_ref(&e);
                cmds.iter()
                    .map(|_| Err(schema::unavailable_again(&failed)))
                    .collect()
            }
            Err(_) => cmds
                .iter()
                .map(|cmd| {
                    match self
                        .set_sync(sync)
                        .and_then(|()| self.transact(std::slice::from_ref(cmd)))
                    {
                        Ok(mut one) => one.pop().unwrap_or_else(|| Err(self.internal())),
                        Err(e) => Err(self.unavailable_ref(&e)),
                    }
                })
                .collect(),
        };
        let mut orphans = Vec::new();
        for ((cmd, reply), outcome) in cmds.into_iter().zip(replies).zip(outcomes) {
            let Some(reply) = reply else { continue };
            // A replay the write found (its read failed, or another process completed the key
            // in between) is counted as one the read answered.
            let replay = match &outcome {
                Ok(Done::Claim(claim)) => replayed(claim),
                _ => None,
            };
            let sent = reply.send(outcome);
            if let (true, Some(id)) = (sent.is_ok(), replay) {
                add_replays(&mut self.replays, id, 1);
            }
            if let Err(Ok(Done::Claim(Claim::Acquired(lease)))) = sent {
                // The caller dropped its claim before hearing it was acquired: nobody will
                // execute, so the key is released rather than left to become abandoned.
                if let Cmd::Claim(req) = cmd {
                    orphans.push(Cmd::Release {
                        scope: req.scope,
                        key: req.key,
                        token: lease.token,
                    });
                }
            }
        }
        if !orphans.is_empty()
            && let Err(e) = self.transact(&orphans)
        {
            tracing::warn!(error = %e, "could not release claims whose callers went away; they will read as abandoned");
        }
    }

    /// Answers, from one read transaction without the write lock, the claims whose answer
    /// writes nothing (a replay, a lease in flight, another fingerprint, an abandoned record
    /// under `reject`), as a reader thread would, and returns the commands left for the lock.
    /// Taking the lock for those would queue them behind other processes' commits (replays'
    /// p99 at 100 – 430 ms, and answers at the bound, with five stores on one file), and
    /// make every replaying process a writer the others wait for.
    ///
    /// A read sees only committed rows, so what it answers was true when it was taken, as a
    /// reader's answer was; nothing of this batch has been applied yet. A claim that would
    /// write (a fresh key, a takeover, an expired row), or whose row cannot be read, stays for
    /// the write, which decides again under the lock. A replay is tallied only when its caller
    /// heard it.
    fn answer_from_read(&mut self, cmds: Vec<Cmd>, replies: Vec<Reply>) -> (Vec<Cmd>, Vec<Reply>) {
        let mut answered = Vec::new();
        let mut left = (Vec::new(), Vec::new());
        let read = Transaction::new_unchecked(&self.conn, TransactionBehavior::Deferred);
        if let Ok(tx) = read {
            let now = self.clock.now();
            for (cmd, reply) in cmds.into_iter().zip(replies) {
                let settled = match &cmd {
                    Cmd::Claim(req) => match row::select(&tx, &req.scope, &req.key) {
                        Ok(Ok(Some(rec))) => settled_by_a_read(&rec, req, now),
                        _ => None,
                    },
                    _ => None,
                };
                match settled {
                    Some(claim) => answered.push((claim, reply)),
                    None => {
                        left.0.push(cmd);
                        left.1.push(reply);
                    }
                }
            }
            // The snapshot ends before anyone hears from it, as on the reader threads. A read
            // left open would fail every later BEGIN on this connection: end it by force.
            if let Err(e) = tx.finish()
                && !self.conn.is_autocommit()
            {
                tracing::warn!(error = %e, "a read did not end; rolled back");
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        } else {
            left = (cmds, replies);
        }
        for (claim, reply) in answered {
            let replay = replayed(&claim);
            let heard = reply.is_some_and(|r| r.send(Ok(Done::Claim(claim))).is_ok());
            if let (true, Some(id)) = (heard, replay) {
                add_replays(&mut self.replays, id, 1);
            }
        }
        left
    }

    /// Applies `cmds` in one transaction, waiting for the write lock up to the busy timeout.
    /// `Err` means the transaction was rolled back.
    fn transact(&mut self, cmds: &[Cmd]) -> rusqlite::Result<Vec<Result<Done, StoreError>>> {
        // What the connection will really do at commit, read back rather than assumed.
        let synchronous: i64 = self
            .conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))?;
        let tx = self.begin_write()?;
        // The time is read once the lock is held: BEGIN IMMEDIATE may have waited for another
        // process, and a lease granted from a time read before the wait could already be over.
        let now = self.clock.now();
        let mut outcomes = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            outcomes.push(apply(&tx, cmd, now)?);
        }
        tx.commit()?;
        let claims = cmds.iter().filter(|c| matches!(c, Cmd::Claim(_))).count() as u64;
        self.stats
            .claims_committed
            .fetch_add(claims, Ordering::Relaxed);
        // 2 is FULL, 3 is EXTRA: the WAL was fsynced before commit returned.
        if synchronous >= 2 {
            self.stats
                .claims_fsynced
                .fetch_add(claims, Ordering::Relaxed);
        }
        Ok(outcomes)
    }

    fn unavailable_ref(&self, e: &rusqlite::Error) -> StoreError {
        crate::schema::unavailable(&self.path, "write", e)
    }

    fn internal(&self) -> StoreError {
        StoreError::Corrupt(format!(
            "sqlite {}: a write produced no answer",
            self.path.display()
        ))
    }
}

/// Whether a failed transaction may have failed because of one of its commands (a value too
/// big, a row of the wrong type) rather than because of the file or the disk.
fn caused_by_one_command(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => matches!(
            f.code,
            ErrorCode::TooBig | ErrorCode::ConstraintViolation | ErrorCode::TypeMismatch
        ),
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::ToSqlConversionFailure(_) => true,
        _ => false,
    }
}

/// Applies one command inside the writer's transaction.
fn apply(
    conn: &Connection,
    cmd: &Cmd,
    now: Timestamp,
) -> rusqlite::Result<Result<Done, StoreError>> {
    match cmd {
        Cmd::Purge { limit } => Ok(Ok(Done::Purged(row::purge(conn, now, *limit)?))),
        Cmd::Claim(req) => {
            let token = FencingToken::random();
            // Most claims are of keys never seen (a replay the engine's completed-record
            // cache holds never reaches the store): the machine's answer to "no record" is
            // written by one statement that does nothing if a row exists, and only then is
            // the row read and decided on. The same transaction holds both, so nothing can
            // come between them.
            if let (claim, Write::Put(fresh)) = machine::claim(None, req, now, token)
                && row::insert_new(conn, &fresh)?
            {
                return Ok(Ok(Done::Claim(claim)));
            }
            on_record(conn, &req.scope, &req.key, |existing| {
                let (claim, write) = machine::claim(existing, req, now, token);
                Ok((Done::Claim(claim), write))
            })
        }
        Cmd::Complete {
            scope,
            key,
            token,
            response,
        } => on_record(conn, scope, key, |existing| {
            machine::complete(existing, *token, response.clone(), now)
                .map(|r| (Done::Record(r.clone()), Write::Put(r)))
        }),
        Cmd::Release { scope, key, token } => on_record(conn, scope, key, |existing| {
            machine::release(existing, *token, now).map(|()| (Done::Released, Write::Delete))
        }),
        Cmd::Extend {
            scope,
            key,
            token,
            lease,
        } => on_record(conn, scope, key, |existing| {
            machine::extend(existing, *token, *lease, now)
                .map(|r| (Done::Extended(r.lease_expires_at), Write::Put(r)))
        }),
        Cmd::Resolve {
            scope,
            key,
            resolution,
        } => on_record(conn, scope, key, |existing| {
            machine::resolve(existing, resolution.clone(), now).map(|(r, w)| (Done::Resolved(r), w))
        }),
    }
}

/// Reads (scope, key), lets `decide` apply [`machine`] to it, writes what it says. The outer
/// error is the database's; the inner, a refusal (or a row idem cannot read).
fn on_record(
    conn: &Connection,
    scope: &Scope,
    key: &Key,
    decide: impl FnOnce(Option<&Record>) -> Result<(Done, Write), StoreError>,
) -> rusqlite::Result<Result<Done, StoreError>> {
    let existing = match row::select(conn, scope, key)? {
        Ok(r) => r,
        Err(corrupt) => return Ok(Err(corrupt)),
    };
    let (done, write) = match decide(existing.as_ref()) {
        Ok(d) => d,
        Err(refusal) => return Ok(Err(refusal)),
    };
    match write {
        // A replay is counted from its answer (`Writer::count_replays`).
        Write::Nothing | Write::CountReplay => {}
        Write::Put(rec) => row::upsert(conn, &rec)?,
        Write::Delete => row::delete(conn, scope, key)?,
    }
    Ok(Ok(done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{AbandonedPolicy, Fingerprint, SystemClock};

    fn req(k: &str, body: &[u8]) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::anonymous(),
            key: Key::new(k).expect("test key"),
            fingerprint: Fingerprint::http("POST", "/x", None, body),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            on_abandoned: AbandonedPolicy::Reject,
        }
    }

    type Answer = oneshot::Receiver<Result<Done, StoreError>>;

    fn job(cmd: Cmd) -> (Job, Answer) {
        let (reply, answer) = oneshot::channel();
        (
            Job {
                cmd,
                reply: Some(reply),
            },
            answer,
        )
    }

    fn claimed(mut answer: Answer) -> Claim {
        match answer.try_recv() {
            Ok(Ok(Done::Claim(c))) => c,
            other => panic!("expected a claim's answer, got {other:?}"),
        }
    }

    /// Replays, a waiting duplicate's poll and a mismatch are answered from the writer's
    /// read and change nothing (nothing to fsync, no write lock taken); the replays are
    /// counted afterwards, once each, under `NORMAL`.
    /// A writer on a new file at `path`.
    fn writer(path: &std::path::Path) -> Writer {
        let mut conn = schema::connect(path, Duration::from_secs(5)).unwrap();
        schema::prepare_writer(&mut conn, path).unwrap();
        Writer::new(
            conn,
            path.to_owned(),
            Arc::new(SystemClock),
            Arc::new(Stats::default()),
            Duration::from_secs(5),
            Arc::new(AtomicBool::new(false)),
        )
    }

    /// Claims `key` and returns its token.
    fn acquire(w: &mut Writer, key: &str) -> FencingToken {
        let (j, a) = job(Cmd::Claim(req(key, b"")));
        w.commit_batch(vec![j], Sync::Full);
        match claimed(a) {
            Claim::Acquired(lease) => lease.token,
            other => panic!("a fresh key is acquired: {other:?}"),
        }
    }

    fn completion(key: &str, token: FencingToken) -> Cmd {
        Cmd::Complete {
            scope: Scope::anonymous(),
            key: Key::new(key).unwrap(),
            token,
            response: StoredResponse::new(200, "ok"),
        }
    }

    #[test]
    fn a_batch_of_replays_changes_nothing_in_the_claims_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(&dir.path().join("idem.db"));

        let token = acquire(&mut w, "done");
        let (j, a) = job(completion("done", token));
        w.commit_batch(vec![j], Sync::Normal);
        assert!(matches!(a.blocking_recv(), Ok(Ok(Done::Record(_)))));
        acquire(&mut w, "held");

        let mut jobs = Vec::new();
        let mut answers = Vec::new();
        for r in [
            req("done", b""),
            req("done", b""),
            req("done", b""),
            req("held", b""),      // a waiting duplicate's poll
            req("done", b"other"), // another fingerprint
        ] {
            let (j, a) = job(Cmd::Claim(r));
            jobs.push(j);
            answers.push(a);
        }
        let changes = w.conn.total_changes();
        w.commit_batch(jobs, Sync::Full);
        assert_eq!(
            w.conn.total_changes(),
            changes,
            "a claim that found a record wrote in the claims' transaction, which makes it one to fsync"
        );
        let got: Vec<Claim> = answers.into_iter().map(claimed).collect();
        assert!(
            matches!(
                got.as_slice(),
                [
                    Claim::Completed(_),
                    Claim::Completed(_),
                    Claim::Completed(_),
                    Claim::InFlight(_),
                    Claim::Mismatch(_)
                ]
            ),
            "{got:?}"
        );
        assert_eq!(w.replays.values().sum::<u32>(), 3, "{:?}", w.replays);
        w.count_replays(true);
        assert!(w.replays.is_empty());
        let rec = row::select(&w.conn, &Scope::anonymous(), &Key::new("done").unwrap())
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(rec.replays, 3);
    }

    /// A replay a reader thread answered can reach the writer in the second take of a round,
    /// the one after the round's fast commit (here: queued behind a full batch). It goes to
    /// the tally like the others; it is never applied in the claims' transaction, where it
    /// would have been lost (and forced an fsync of its own).
    #[test]
    fn a_replay_queued_behind_a_full_batch_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let mut w = writer(&path);
        let done = acquire(&mut w, "done");
        let (j, a) = job(completion("done", done));
        w.commit_batch(vec![j], Sync::Normal);
        assert!(matches!(a.blocking_recv(), Ok(Ok(Done::Record(_)))));
        let held = acquire(&mut w, "held");

        let (tx, rx) = std::sync::mpsc::channel();
        let mut answers = Vec::new();
        let (j, a) = job(completion("held", held));
        tx.send(Queued::Job(j)).unwrap();
        answers.push(a);
        for i in 1..MAX_BATCH {
            let (j, a) = job(Cmd::Claim(req(&format!("fresh-{i}"), b"")));
            tx.send(Queued::Job(j)).unwrap();
            answers.push(a);
        }
        tx.send(Queued::Replayed((
            Scope::anonymous(),
            Key::new("done").unwrap(),
            done,
        )))
        .unwrap();
        drop(tx);
        w.run(rx);

        assert!(
            answers
                .into_iter()
                .all(|mut a| matches!(a.try_recv(), Ok(Ok(_))))
        );
        let conn = schema::connect(&path, Duration::from_secs(5)).unwrap();
        let rec = row::select(&conn, &Scope::anonymous(), &Key::new("done").unwrap())
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(rec.replays, 1, "the reader's replay was not counted");
    }
}
