//! [`SqliteStore`]: the `Store` methods, routed to the readers or the writer.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Clock, FencingToken, Key, ListRecords, Listing, Record, RecordFilter,
    Resolution, Scope, Store, StoreError, StoredResponse, SystemClock, Timestamp,
};
use tokio::sync::oneshot;

use crate::checkpoint::Checkpointer;
use crate::readers::Readers;
use crate::stopping::{join_until, lock};
use crate::writer::{Cmd, Done, Job, Queued, Stats, Writer, replayed, settled_by_a_read};
use crate::{row, schema};

/// Counters of the writer thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions begun (committed or not), and waits for the write lock that failed.
    pub transactions: u64,
    /// Claims committed by the writer. Claims it answered from its read without a write (a
    /// replay, a lease in flight, another fingerprint) are not in it.
    pub claims_committed: u64,
    /// Of those, claims committed while the connection was in `synchronous=FULL` (read back
    /// from SQLite at each commit): must equal `claims_committed`. A commit that changed
    /// nothing has nothing to sync.
    pub claims_fsynced: u64,
}

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Where the store reads the time.
    pub clock: Arc<dyn Clock>,
    /// How long a transaction waits for another process's lock before failing (closed).
    pub busy_timeout: Duration,
    /// The bound on any one operation, as its caller sees it: past it the caller gets
    /// [`StoreError::Unavailable`] (503 `store-unavailable`), whatever holds up the writer or
    /// a read: a lock, a slow disk, a frozen file system
    /// ([design §6](docs/design.md#6-a-store-failure-fails-closed)). A write the writer has
    /// not yet applied when its caller gives up is not applied if it is a claim or a
    /// resolution; a claim it granted meanwhile is released.
    pub op_timeout: Duration,
}

/// The default of [`SqliteOptions::busy_timeout`] and [`SqliteOptions::op_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            clock: Arc::new(SystemClock),
            busy_timeout: DEFAULT_TIMEOUT,
            op_timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl SqliteOptions {
    /// The defaults with both bounds set to `timeout`: what `sqlite:PATH?timeout=2s` means.
    pub fn with_timeout(timeout: Duration) -> Self {
        SqliteOptions {
            busy_timeout: timeout,
            op_timeout: timeout,
            ..SqliteOptions::default()
        }
    }
}

/// The embedded SQLite [`Store`]. Cloning shares one writer and one set of reader threads.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    clock: Arc<dyn Clock>,
    op_timeout: Duration,
    readers: Readers,
    tx: Mutex<Option<Sender<Queued>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<Stats>,
    /// Set while the writer waits for another process's write lock: see `claim`.
    waiting_for_lock: Arc<AtomicBool>,
    /// Dropping it stops the checkpointer.
    checkpointer: Mutex<Option<Checkpointer>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Inner {
    /// Stops the readers, then the writer after it has committed everything queued, so nothing
    /// acknowledged or counted is lost on a clean shutdown and the WAL is checkpointed. Once
    /// stopped, every operation answers `store unavailable`; stopping again does nothing.
    /// Each step waits at most the operation timeout for threads stuck in the kernel (see
    /// [`crate::stopping`]).
    fn stop(&self) {
        // Readers first, so that the writer's connection is the last to close and checkpoints
        // the WAL into the file (see `Readers::stop`).
        self.readers.stop(self.op_timeout);
        let checkpointer = lock(&self.checkpointer).take().and_then(Checkpointer::stop);
        drop(lock(&self.tx).take());
        let writer = lock(&self.writer).take();
        join_until(
            checkpointer.into_iter().chain(writer),
            Instant::now() + self.op_timeout,
        );
    }
}

impl SqliteStore {
    /// Stops this store now, for every handle on it, as dropping the last handle would: what
    /// is queued is committed, the connections close and the WAL is checkpointed into the
    /// database file, which is then the only file left. Every later operation answers `store
    /// unavailable`, so nothing runs that could not be recorded. For a process about to exit
    /// while handles remain (a language package's stores live until the interpreter ends).
    pub fn close(&self) {
        self.inner.stop();
    }

    /// Opens (creating if needed) the store at `path` on the system clock.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens the store at `path`: enables WAL, creates or checks the schema, starts the writer.
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let mut conn = schema::connect(&path, options.busy_timeout)?;
        schema::prepare_writer(&mut conn, &path)?;
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Stats::default());
        let waiting_for_lock = Arc::new(AtomicBool::new(false));
        let writer = Writer::new(
            conn,
            path.clone(),
            options.clock.clone(),
            stats.clone(),
            options.busy_timeout,
            waiting_for_lock.clone(),
        );
        let handle = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(StoreError::unavailable)?;
        let checkpointer = Checkpointer::start(&path, options.busy_timeout)?;
        let readers = Readers::start(&path, options.busy_timeout)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                readers,
                path,
                clock: options.clock,
                op_timeout: options.op_timeout,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                checkpointer: Mutex::new(Some(checkpointer)),
                stats,
                waiting_for_lock,
            }),
        })
    }

    /// Counters of this process's writer since the store was opened.
    pub fn writer_stats(&self) -> WriterStats {
        let s = &self.inner.stats;
        WriterStats {
            transactions: s.transactions.load(Ordering::Relaxed),
            claims_committed: s.claims_committed.load(Ordering::Relaxed),
            claims_fsynced: s.claims_fsynced.load(Ordering::Relaxed),
        }
    }

    /// The file this store writes.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn queue(&self, queued: Queued) -> Result<(), StoreError> {
        let guard = lock(&self.inner.tx);
        match guard.as_ref() {
            Some(tx) if tx.send(queued).is_ok() => Ok(()),
            _ => Err(self.writer_gone()),
        }
    }

    /// Queues a write and waits for it to be committed, up to the operation timeout. Giving
    /// up drops the answer's receiver, which is how the writer learns that nobody waits: see
    /// [`crate::writer`].
    async fn write(&self, cmd: Cmd) -> Result<Done, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue(Queued::Job(Job {
            cmd,
            reply: Some(reply),
        }))?;
        match tokio::time::timeout(self.inner.op_timeout, answer).await {
            Ok(answered) => answered.map_err(|_| self.writer_gone())?,
            Err(_) => Err(self.timed_out("write")),
        }
    }

    fn timed_out(&self, what: &str) -> StoreError {
        StoreError::Unavailable(
            format!(
                "sqlite {}: {what}: no answer within {:?} (a lock, a slow disk or a stalled file system)",
                self.inner.path.display(),
                self.inner.op_timeout
            )
            .into(),
        )
    }

    fn writer_gone(&self) -> StoreError {
        StoreError::Unavailable(
            format!(
                "sqlite {}: the writer thread has stopped",
                self.inner.path.display()
            )
            .into(),
        )
    }

    /// The answer to `req` that a read settles without a write, from a reader thread; `None`
    /// when the claim needs the writer. A replay's count goes to the writer's tally.
    async fn settled_by_a_read(&self, req: &ClaimRequest) -> Result<Option<Claim>, StoreError> {
        let now = self.inner.clock.now();
        let Some(rec) = self.read(&req.scope, &req.key).await? else {
            return Ok(None);
        };
        let claim = settled_by_a_read(&rec, req, now);
        if let Some(record) = claim.as_ref().and_then(replayed) {
            // Bookkeeping: the replay is answered whether or not it is counted.
            let _ = self.queue(Queued::Replayed(record));
        }
        Ok(claim)
    }

    /// A point read on a reader thread (see [`crate::readers`]), within the operation timeout.
    async fn read(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        let (scope, key) = (scope.clone(), key.clone());
        let answer = self
            .inner
            .readers
            .read(move |conn| row::select(conn, &scope, &key))?;
        self.read_answer(answer).await
    }

    /// Waits for a read's answer up to the operation timeout. Giving up drops the receiver,
    /// so a read still queued is skipped; one already running finishes on its thread.
    async fn read_answer<T>(
        &self,
        answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.op_timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(self.inner.readers.stopped()),
            Err(_) => Err(self.timed_out("read")),
        }
    }
}

fn unexpected(done: Done) -> StoreError {
    StoreError::Corrupt(format!("internal: the writer answered {done:?}"))
}

impl Store for SqliteStore {
    /// Straight to the writer thread, which reads first and writes only what needs a write
    /// (`src/writer.rs`): most claims are of fresh keys, and a read on a reader thread
    /// first cost them a second hand-off between threads (docs/benchmarks.md, "Sixth pass:
    /// every claim to the writer"). Replays that the engine's completed-record cache holds
    /// never reach the store.
    ///
    /// While the writer waits for another process's write lock, a claim first asks a reader
    /// thread, which answers what a read settles (a replay, a lease in flight, another
    /// fingerprint) instead of queueing it behind that wait.
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        if self.inner.waiting_for_lock.load(Ordering::Acquire)
            && let Some(answer) = self.settled_by_a_read(&req).await?
        {
            return Ok(answer);
        }
        match self.write(Cmd::Claim(req)).await? {
            Done::Claim(c) => Ok(c),
            other => Err(unexpected(other)),
        }
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        let cmd = Cmd::Complete {
            scope: scope.clone(),
            key: key.clone(),
            token,
            response,
        };
        match self.write(cmd).await? {
            Done::Record(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let cmd = Cmd::Release {
            scope: scope.clone(),
            key: key.clone(),
            token,
        };
        match self.write(cmd).await? {
            Done::Released => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        let cmd = Cmd::Extend {
            scope: scope.clone(),
            key: key.clone(),
            token,
            lease,
        };
        match self.write(cmd).await? {
            Done::Extended(t) => Ok(t),
            other => Err(unexpected(other)),
        }
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        let now = self.inner.clock.now();
        Ok(self.read(scope, key).await?.filter(|r| !r.is_expired(now)))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        match self.write(Cmd::Purge { limit }).await? {
            Done::Purged(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        let cmd = Cmd::Resolve {
            scope: scope.clone(),
            key: key.clone(),
            resolution,
        };
        match self.write(cmd).await? {
            Done::Resolved(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }
}

impl ListRecords for SqliteStore {
    /// One query on a read connection: filtered, ordered and cut in SQL (a top-N sort over
    /// the table), one row past the limit to tell whether more match.
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        let now = self.inner.clock.now();
        let limit = filter.effective_limit();
        let query = filter.clone();
        let answer = self
            .inner
            .readers
            .read_alone(move |conn| row::list(conn, &query, now, limit + 1))?;
        let rows = self.read_answer(answer).await?;
        Ok(filter.finish(rows, now, false))
    }
}
