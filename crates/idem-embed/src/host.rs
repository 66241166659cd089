//! One runtime and one engine per store URL, per process.
//!
//! A binding's calls arrive on the host's threads (Python threads, Node's main thread and its
//! worker threads). They all share this process's tokio runtime, whose worker threads run the
//! heartbeats while the host's functions run ([`idem_core::Engine::begin`] needs a
//! multi-threaded runtime for that), and one [`Engine`] per store URL, so that duplicates in
//! one process wake each other at once and share the store's connections.
//!
//! **Fork.** A child made by `fork()` (Python's `multiprocessing` on Linux, `os.fork`)
//! inherits the parent's memory but none of its threads: the runtime's workers, SQLite's
//! writer thread and the connection tasks are gone, and the sockets are shared with the
//! parent. The child must not touch them. Each call checks the process id; a child builds a
//! runtime and opens its stores anew, and the parent's copies are leaked on purpose (dropping
//! them would wait for threads that do not exist in the child).
//!
//! The forking thread's random generator is inherited too: rand's `ThreadRng` (0.9) has no
//! fork protection, so parent and child would draw the same fencing tokens, and two
//! executors holding one token cannot be told apart (16 forked children all "won" one
//! PostgreSQL claim before this). `fresh_tokens` reseeds a thread's generator the first
//! time the thread calls in a process.
//!
//! A thread of the parent may also be choosing the host at the moment of the fork, holding
//! the lock the child would then wait on forever. A host language that forks calls
//! [`before_fork`] and [`after_fork`] around it (Python registers them with
//! `os.register_at_fork`).
//!
//! **SQLite and fork.** SQLite keeps each file's locks in process-wide structures that a
//! child inherits although the locks themselves (POSIX advisory locks) are not inherited: a
//! child of a process that had a SQLite database open believes it holds locks it does not,
//! and may read pages a checkpoint is rewriting or corrupt the file (SQLite's own rule:
//! <https://www.sqlite.org/howtocorrupt.html>, "carrying an open database connection across
//! a fork"). A forked worker of a process that opened a SQLite store once hung in its first
//! SQLite call here, on a global mutex the parent's writer held. So such a child is refused
//! SQLite stores with [`EmbedError::ForkedSqlite`], which says what to do instead; server
//! stores (PostgreSQL, Redis) open fresh connections in the child and work.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use idem_core::Engine;
use idem_stores::{AnyStore, StoreUrl};

use crate::EmbedError;
use crate::driven::Pool;

/// The process's runtime and open stores.
#[derive(Debug)]
pub struct Host {
    runtime: tokio::runtime::Runtime,
    engines: Mutex<HashMap<String, Opened>>,
    pid: u32,
    /// Set by [`shutdown`]: no store is opened any more.
    closed: AtomicBool,
}

/// A store opened in this process: its engine, and the handles its blocking callers drive
/// themselves (`None` for a store that does not gain by them; see `crate::driven`).
#[derive(Debug, Clone)]
pub(crate) struct Opened {
    pub(crate) engine: Engine<AnyStore>,
    pub(crate) pool: Option<Arc<Pool>>,
}

/// The runtime could not be started.
#[derive(Debug, thiserror::Error)]
#[error("idem could not start its runtime: {0}")]
pub struct HostError(#[from] std::io::Error);

static CURRENT: Mutex<Option<Arc<Host>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves nothing half-written (an insert or a swap).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// The process in which this thread's random generator was last seeded by us.
    static SEEDED_IN: Cell<u32> = const { Cell::new(0) };
}

/// Reseeds this thread's random generator (the fencing tokens' source) from the OS unless it
/// was already reseeded in this process `pid`: after a fork, the forking thread's generator
/// is the parent's, state and all. Cheap after the first call on a thread.
pub(crate) fn fresh_tokens(pid: u32) -> Result<(), HostError> {
    if SEEDED_IN.with(Cell::get) == pid {
        return Ok(());
    }
    rand::rng().reseed().map_err(std::io::Error::other)?;
    SEEDED_IN.with(|s| s.set(pid));
    Ok(())
}

thread_local! {
    /// What [`before_fork`] holds until [`after_fork`], on the forking thread.
    static FORKING: RefCell<Option<MutexGuard<'static, Option<Arc<Host>>>>> =
        const { RefCell::new(None) };
}

/// The process that opened a SQLite store first (0: none yet).
static SQLITE_OPENED_IN: AtomicU32 = AtomicU32::new(0);

/// Refuses a SQLite store in a process forked from one that had SQLite open (module docs).
fn sqlite_allowed(url: &StoreUrl, pid: u32) -> Result<(), EmbedError> {
    if !matches!(url, StoreUrl::Sqlite { .. }) {
        return Ok(());
    }
    match SQLITE_OPENED_IN.compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => Ok(()),
        Err(opener) if opener == pid => Ok(()),
        Err(opener) => Err(EmbedError::ForkedSqlite { parent: opener }),
    }
}

/// Call just before `fork()`: waits until no thread is choosing this process's host, and
/// keeps them out until [`after_fork`].
pub fn before_fork() {
    let current = lock(&CURRENT);
    FORKING.with(|f| *f.borrow_mut() = Some(current));
}

/// Call just after `fork()`, in the parent and in the child, on the thread that forked.
pub fn after_fork() {
    FORKING.with(|f| drop(f.borrow_mut().take()));
}

/// This process's host, started on first use and again in a forked child.
pub fn host() -> Result<Arc<Host>, HostError> {
    let mut current = lock(&CURRENT);
    let pid = std::process::id();
    match current.take() {
        Some(h) if h.pid == pid => {
            *current = Some(h.clone());
            return Ok(h);
        }
        // The parent's host, inherited by fork: its threads do not exist here.
        Some(inherited) => std::mem::forget(inherited),
        None => {}
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("idem")
        .enable_all()
        .build()?;
    let h = Arc::new(Host {
        runtime,
        engines: Mutex::new(HashMap::new()),
        pid,
        closed: AtomicBool::new(false),
    });
    *current = Some(h.clone());
    Ok(h)
}

/// Call when the process is about to exit (Python's `atexit`, Node's `exit` event): closes
/// this process's stores ([`AnyStore::close`]), so a SQLite store leaves its database file
/// complete and alone, with no `-wal` or `-shm` beside it. The host's statics are never
/// dropped, and a language's store objects live until the interpreter ends, so nothing else
/// would close them. Afterwards a call on a SQLite store, and the opening of any store, fails
/// with `store unavailable` (nothing runs); calls on memory, PostgreSQL and Redis stores
/// already open go on working, since those keep nothing on this side to lose. Does nothing in
/// a process that opened no store, or in a forked child whose host is still the parent's.
pub fn shutdown() {
    let current = lock(&CURRENT);
    if let Some(host) = current.as_ref().filter(|h| h.pid == std::process::id()) {
        // Under the engines' lock, so a store being opened right now is either in the map
        // (and closed here) or sees the flag before it is added (and is closed there).
        let engines = lock(&host.engines);
        host.closed.store(true, Ordering::SeqCst);
        for opened in engines.values() {
            opened.engine.store().close();
        }
    }
}

impl Host {
    /// After [`shutdown`], no store is opened: the process is exiting, and a SQLite file
    /// opened now would be left with its WAL beside it.
    fn refuse_if_closed(&self) -> Result<(), EmbedError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(EmbedError::Store(idem_core::StoreError::Unavailable(
                "idem's stores were closed as the process exits".into(),
            )));
        }
        Ok(())
    }

    /// The process this host belongs to.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The runtime's handle: where heartbeats run for calls whose own runtime is idle.
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Runs `f` to completion on the runtime, blocking this (non-runtime) thread.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Runs `work` as a task on the runtime and hands its output to `done`, for a caller that
    /// must not block (Node's event loop, Python's asyncio): the call then crosses threads
    /// only to the runtime and back, where blocking a thread of the caller's own pool on it
    /// would add a hop to that thread and back.
    ///
    /// `done` is called exactly once: with `work`'s output, or, if the task ends without one
    /// (a panic inside it), with `lost()`. A caller's promise or future then always settles;
    /// without this, a panic left it pending and Node's event loop alive for ever.
    pub(crate) fn spawn_then<T, W, D, L>(&self, work: W, done: D, lost: L)
    where
        T: Send + 'static,
        W: Future<Output = T> + Send + 'static,
        D: FnOnce(T) + Send + 'static,
        L: FnOnce() -> T + Send + 'static,
    {
        let answer = Answer {
            owed: Some((done, lost)),
            answer: PhantomData,
        };
        // Detached: the task reports through `done`.
        drop(self.runtime.spawn(async move { answer.give(work.await) }));
    }
    /// The engine of a store URL, opened (and its schema created) on first use. Relative
    /// SQLite paths are resolved against the working directory at that moment.
    pub fn engine(&self, url: &str) -> Result<Engine<AnyStore>, EmbedError> {
        self.opened(url).map(|o| o.engine)
    }

    /// As [`Host::engine`], with the pool of handles the store's blocking callers drive.
    pub(crate) fn opened(&self, url: &str) -> Result<Opened, EmbedError> {
        if let Some(opened) = lock(&self.engines).get(url) {
            return Ok(opened.clone());
        }
        let parsed: StoreUrl = url.parse()?;
        sqlite_allowed(&parsed, self.pid)?;
        self.refuse_if_closed()?;
        // Opened outside the lock: a PostgreSQL connect must not stall other stores' calls.
        // Two threads may race to open one URL; the first inserted wins and both use it.
        let store = self.block_on(parsed.open())?;
        let mut engines = lock(&self.engines);
        if let Err(closed) = self.refuse_if_closed() {
            store.close();
            return Err(closed);
        }
        Ok(engines
            .entry(url.to_owned())
            // No completed-record cache here (design §9): an in-process replay answered from
            // memory would not count in the record's `replays`, which `idem inspect` shows
            // as the evidence that a framework's re-call was a replay.
            .or_insert_with(|| {
                let engine = Engine::new(store);
                let pool = Pool::for_store(&engine, self.handle().clone());
                Opened { engine, pool }
            })
            .clone())
    }
}

/// The answer of a [`Host::spawn_then`] task, owed to its caller: given when the task ends,
/// or, when it is dropped unanswered (the task panicked), the `lost` value in its place.
struct Answer<T, D, L>
where
    D: FnOnce(T),
    L: FnOnce() -> T,
{
    owed: Option<(D, L)>,
    answer: PhantomData<fn(T)>,
}

impl<T, D, L> Answer<T, D, L>
where
    D: FnOnce(T),
    L: FnOnce() -> T,
{
    fn give(mut self, value: T) {
        if let Some((done, _)) = self.owed.take() {
            done(value);
        }
    }
}

impl<T, D, L> Drop for Answer<T, D, L>
where
    D: FnOnce(T),
    L: FnOnce() -> T,
{
    fn drop(&mut self) {
        if let Some((done, lost)) = self.owed.take() {
            done(lost());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::host;

    /// A task that panics still answers its caller (with the `lost` value), so a promise or
    /// a future waiting on it settles: before, a panic left Node's promise pending and its
    /// event loop alive for ever.
    #[test]
    fn a_task_that_panics_still_answers() {
        let host = host().expect("the runtime starts");
        let (tx, rx) = mpsc::channel();
        let answered = tx.clone();
        host.spawn_then(
            async { panic!("a bug in a task") },
            move |v: &str| answered.send(v).expect("the test listens"),
            || "lost",
        );
        host.spawn_then(
            async { "done" },
            move |v: &str| tx.send(v).expect("the test listens"),
            || "lost",
        );
        let mut got = [
            rx.recv_timeout(Duration::from_secs(5)).expect("answered"),
            rx.recv_timeout(Duration::from_secs(5)).expect("answered"),
        ];
        got.sort_unstable();
        assert_eq!(got, ["done", "lost"]);
    }
}
