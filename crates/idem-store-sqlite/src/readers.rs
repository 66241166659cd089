//! Reads, on reader threads of their own, grouped like the writer's commits.
//!
//! A read must not run on an async worker: it can wait for a lock (another connection
//! recovering the WAL after a crash), up to the busy timeout, or block in the kernel on a
//! stalled file system, and a serving thread that blocks holds up every connection it serves.
//! So point reads (`get`) are queued to a few threads,
//! each with its own connection. The thread whose turn it is blocks for the first queued
//! read, takes every other read already queued (up to [`MAX_BATCH`]), hands the queue to the
//! next thread and runs its batch in one read transaction, like the writer's group commit:
//! under load, one wake-up and one WAL snapshot serve many reads. The answers are sent after
//! the transaction ends, so a caller's next read never starts while its last snapshot is
//! still open: snapshots that overlap without a break would keep SQLite from ever restarting
//! the WAL. In WAL mode a reader sees the last commit and never waits for the writer.
//!
//! A long read (an operator's listing, a scan and a sort) does not join a batch: it would
//! hold up every point read batched with it, and two at once would hold every thread. It runs
//! alone, on tokio's blocking pool with a connection of its own ([`Readers::read_alone`]).
//!
//! Why not the blocking pool for point reads too: one pool task and one thread wake-up per
//! read, with the pool's lock contended under load, cost a SQLite new key through
//! `idem serve` a fifth of its CPU (docs/benchmarks.md, "Issue 16, fifth pass"). A fixed set
//! of threads also bounds what a stalled file system can hold: the blocking pool would start a
//! thread for every read stuck behind it. (One queue per thread, each read sent to the thread
//! with the fewest pending, was measured too: more, smaller batches, more CPU per request.)
//!
//! Each read was queued before its transaction began, so it sees every commit made before it
//! was asked. A read whose caller stopped waiting (its operation timeout passed) is skipped.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem_core::StoreError;
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::queue::take_queued;
use crate::schema;
use crate::stopping::{join_until, lock};

/// Most reads that share one snapshot.
const MAX_BATCH: usize = 256;

/// Reader threads: at least two, so that a read stuck on one thread (a slow disk) does not
/// hold up every point read; at most four, since a point read takes microseconds and
/// the writer is the store's limit.
fn thread_count() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4))
}

/// A queued read: runs on the thread's connection (or is told none could be opened) and
/// returns how it went, with its answer still to be sent (after the batch's transaction ends).
/// The path is the store's, for error messages.
type Read = Box<dyn FnOnce(Result<&Connection, &StoreError>, &Path) -> Ran + Send>;

/// What running one read did.
struct Ran {
    /// Sends the read's answer.
    answer: Box<dyn FnOnce() + Send>,
    /// SQLite failed on this connection: it is replaced before the next batch.
    connection_failed: bool,
}

/// The reader threads and their queue.
pub(crate) struct Readers {
    path: PathBuf,
    busy_timeout: Duration,
    /// `None` once [`Readers::stop`] has run. Behind a lock, so that a store still shared can
    /// be stopped ([`crate::SqliteStore::close`]); a read-write lock, so that reads queued from
    /// many threads at once do not wait for each other.
    queue: RwLock<Option<Sender<Read>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Readers {
    /// Starts the reader threads; their connections open with their first batch.
    pub(crate) fn start(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        let (queue, reads) = mpsc::channel::<Read>();
        let reads = Arc::new(Mutex::new(reads));
        let mut threads = Vec::new();
        for i in 0..thread_count() {
            let reader = Reader {
                path: path.to_path_buf(),
                busy_timeout,
                conn: None,
            };
            let reads = reads.clone();
            // At most 15 bytes: the kernel keeps no more of a thread's name.
            let thread = std::thread::Builder::new()
                .name(format!("idem-sqlite-rd{i}"))
                .spawn(move || reader.run(&reads))
                .map_err(StoreError::unavailable)?;
            threads.push(thread);
        }
        Ok(Readers {
            path: path.to_path_buf(),
            busy_timeout,
            queue: RwLock::new(Some(queue)),
            threads: Mutex::new(threads),
        })
    }

    /// Queues the point read `f` for a reader thread and returns where its answer will come.
    /// Dropping the receiver before a thread gets to the read cancels it.
    pub(crate) fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<Result<T, StoreError>> + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<T, StoreError>>, StoreError> {
        let (answer, answered) = oneshot::channel();
        let read: Read = Box::new(move |conn, path| {
            if answer.is_closed() {
                return Ran {
                    answer: Box::new(|| {}),
                    connection_failed: false,
                };
            }
            let (result, connection_failed) = match conn {
                Ok(conn) => match f(conn) {
                    Ok(result) => (result, false),
                    Err(e) => (Err(schema::unavailable(path, "read", e)), true),
                },
                Err(e) => (Err(schema::unavailable_again(e)), false),
            };
            Ran {
                answer: Box::new(move || {
                    let _ = answer.send(result);
                }),
                connection_failed,
            }
        });
        let queue = self.queue.read().unwrap_or_else(PoisonError::into_inner);
        match &*queue {
            Some(queue) if queue.send(read).is_ok() => Ok(answered),
            _ => Err(self.stopped()),
        }
    }

    /// Runs the long read `f` alone, on tokio's blocking pool with a connection of its own,
    /// and returns where its answer will come (see the module's notes).
    pub(crate) fn read_alone<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<Result<T, StoreError>> + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<T, StoreError>>, StoreError> {
        // A stopped store opens no connection again: its file is to be left alone.
        if self
            .queue
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
        {
            return Err(self.stopped());
        }
        let (answer, answered) = oneshot::channel();
        let (path, busy_timeout) = (self.path.clone(), self.busy_timeout);
        tokio::task::spawn_blocking(move || {
            if answer.is_closed() {
                return;
            }
            let result = open(&path, busy_timeout).and_then(|conn| {
                f(&conn).unwrap_or_else(|e| Err(schema::unavailable(&path, "read", e)))
            });
            let _ = answer.send(result);
        });
        Ok(answered)
    }

    /// The error of a read whose thread stopped before answering it.
    pub(crate) fn stopped(&self) -> StoreError {
        StoreError::Unavailable(
            format!(
                "sqlite {}: the read stopped before it answered",
                self.path.display()
            )
            .into(),
        )
    }

    /// Closes the queue and waits, up to `bound`, for the threads to finish what is queued and
    /// close their connections: the store's last connection to close (the writer's, after
    /// this) then checkpoints the WAL into the database file and removes it, so a stopped
    /// store leaves one complete file. A thread stuck past the bound (a stalled file system)
    /// is left to finish on its own.
    pub(crate) fn stop(&self, bound: Duration) {
        drop(
            self.queue
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let threads = std::mem::take(&mut *lock(&self.threads));
        join_until(threads, Instant::now() + bound);
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

/// One reader thread's state.
struct Reader {
    path: PathBuf,
    busy_timeout: Duration,
    /// Opened with the first batch, and again after one failed.
    conn: Option<Connection>,
}

impl Reader {
    /// Runs batches until the queue is closed and empty.
    fn run(mut self, reads: &Mutex<Receiver<Read>>) {
        while let Some(batch) = take_batch(reads) {
            self.run_batch(batch);
        }
    }

    fn run_batch(&mut self, batch: Vec<Read>) {
        // A connection left inside a transaction would answer from an old snapshot: replaced.
        let conn = match self.conn.take().filter(Connection::is_autocommit) {
            Some(conn) => conn,
            None => match open(&self.path, self.busy_timeout) {
                Ok(conn) => conn,
                Err(e) => {
                    for read in batch {
                        run_one(read, Err(&e), &self.path);
                    }
                    return;
                }
            },
        };
        // One snapshot for a batch of several reads; a lone read needs no transaction (its
        // statement is its snapshot). If the transaction cannot begin, each read runs on its
        // own instead and reports the error it meets.
        let mut in_transaction = false;
        let mut failed = false;
        if batch.len() > 1 {
            match conn.execute_batch("BEGIN") {
                Ok(()) => in_transaction = true,
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not begin a read transaction");
                    failed = true;
                }
            }
        }
        let mut answers = Vec::with_capacity(batch.len());
        for read in batch {
            let ran = run_one(read, Ok(&conn), &self.path);
            failed |= ran.connection_failed;
            answers.push(ran.answer);
        }
        if in_transaction && let Err(e) = conn.execute_batch("COMMIT") {
            tracing::warn!(path = %self.path.display(), error = %e, "could not end a read transaction");
            failed = true;
        }
        // Only now: see the module's notes on overlapping snapshots.
        for answer in answers {
            answer();
        }
        // A connection that failed is dropped, not reused: the next batch opens afresh.
        if !failed {
            self.conn = Some(conn);
        }
    }
}

/// Runs one read. A read that panics (a bug) answers `Unavailable` alone: the thread, its
/// batch and the other reads go on, and the connection is replaced.
fn run_one(read: Read, conn: Result<&Connection, &StoreError>, path: &Path) -> Ran {
    catch_unwind(AssertUnwindSafe(|| read(conn, path))).unwrap_or_else(|_| {
        tracing::error!(path = %path.display(), "a read panicked");
        // The read's answer was dropped in the unwinding: its caller hears `stopped`.
        Ran {
            answer: Box::new(|| {}),
            connection_failed: true,
        }
    })
}

/// A read connection: `query_only`, so a bug cannot make it write.
fn open(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = schema::connect(path, busy_timeout)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| schema::unavailable(path, "query_only", e))?;
    Ok(conn)
}

/// Blocks for the first queued read, then takes what else is queued. `None` once the queue is
/// closed and empty. The lock is held only while taking: the next thread then waits for the
/// next read while this one runs its batch.
fn take_batch(reads: &Mutex<Receiver<Read>>) -> Option<Vec<Read>> {
    let reads = reads.lock().unwrap_or_else(|p| p.into_inner());
    let mut batch = vec![reads.recv().ok()?];
    take_queued(&reads, &mut batch, MAX_BATCH);
    Some(batch)
}
