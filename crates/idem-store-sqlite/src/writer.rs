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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::machine::{self, Write};
use idem_core::{
    Claim, ClaimRequest, Clock, FencingToken, Key, Record, Resolution, Scope, StoreError,
    StoredResponse, Timestamp,
};
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use crate::queue::take_queued;
use crate::{row, schema};

/// Most commands in one transaction; bounds how long one commit holds the file lock.
pub(crate) const MAX_BATCH: usize = 512;

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
    /// Replays answered from reads are tallied in [`ReplayTally`]; this writes the tally.
    /// Nobody waits for it.
    FlushReplays,
}

/// Replays answered from reads since the last flush, by record. Counting them one commit each
/// would make a replay storm a write storm; they are added up here and written in one
/// statement per record whenever the writer gets to the flush.
pub(crate) type ReplayTally = Arc<Mutex<HashMap<(Scope, Key, FencingToken), u32>>>;

impl Cmd {
    /// Whether the answer must wait for an fsync.
    ///
    /// A claim must be durable before the side effect runs
    /// ([design §9](docs/design.md#9-performance-shape)), and an operator's resolution is a
    /// decision someone waits to see stick. A completion, release, extension, purge or replay count
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
        replays: ReplayTally,
    ) -> Self {
        Writer {
            conn,
            path,
            clock,
            sync: None,
            stats,
            replays,
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
    Counted,
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
    stats: Arc<Stats>,
    replays: ReplayTally,
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
    /// executor so waits for one fsync per execution (its claim), not two.
    pub(crate) fn run(mut self, rx: Receiver<Job>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            take_queued(&rx, &mut batch, MAX_BATCH);
            let (mut durable, fast): (Vec<Job>, Vec<Job>) =
                batch.into_iter().partition(|j| j.cmd.needs_fsync());
            if !fast.is_empty() {
                self.commit_batch(fast, Sync::Normal);
                // Claims that arrived meanwhile (often from executors that just heard their
                // completion) share this round's fsync rather than wait for the next.
                take_queued(&rx, &mut durable, MAX_BATCH);
            }
            if !durable.is_empty() {
                self.commit_batch(durable, Sync::Full);
            }
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
        let (cmds, replies): (Vec<Cmd>, Vec<Reply>) =
            batch.into_iter().map(|j| (j.cmd, j.reply)).unzip();
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
            if let Err(Ok(Done::Claim(Claim::Acquired(lease)))) = reply.send(outcome) {
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

    /// Applies `cmds` in one transaction. `Err` means the transaction was rolled back.
    fn transact(&mut self, cmds: &[Cmd]) -> rusqlite::Result<Vec<Result<Done, StoreError>>> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        // What the connection will really do at commit, read back rather than assumed.
        let synchronous: i64 = self
            .conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // The time is read once the lock is held: BEGIN IMMEDIATE may have waited for another
        // process, and a lease granted from a time read before the wait could already be over.
        let now = self.clock.now();
        let mut outcomes = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            outcomes.push(apply(&tx, cmd, now, &self.replays)?);
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
    replays: &ReplayTally,
) -> rusqlite::Result<Result<Done, StoreError>> {
    match cmd {
        Cmd::Purge { limit } => Ok(Ok(Done::Purged(row::purge(conn, now, *limit)?))),
        Cmd::FlushReplays => {
            let tally = std::mem::take(&mut *replays.lock().unwrap_or_else(|p| p.into_inner()));
            for ((scope, key, token), n) in tally {
                row::count_replays(conn, &scope, &key, token, n)?;
            }
            Ok(Ok(Done::Counted))
        }
        Cmd::Claim(req) => {
            let token = FencingToken::random();
            // Most claims that reach the writer are of keys never seen (the readers answered
            // the others): the machine's answer to "no record" is written by one statement
            // that does nothing if a row exists, and only then is the row read and decided on.
            // The same transaction holds both, so nothing can come between them.
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
        Write::Nothing => {}
        Write::Put(rec) => row::upsert(conn, &rec)?,
        Write::Delete => row::delete(conn, scope, key)?,
        Write::CountReplay => {
            if let Some(r) = &existing {
                row::count_replays(conn, scope, key, r.token, 1)?;
            }
        }
    }
    Ok(Ok(done))
}
