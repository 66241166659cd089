//! Blocking calls whose round trips the calling thread makes itself.
//!
//! A host thread that blocks on a call (a Python thread in the decorator, or in the WSGI or
//! ASGI middleware through [`crate::http`]) waits while the store's round trips are made. On the process's shared runtime each
//! round trip crosses threads: the caller hands the command to the worker that drives the
//! store's connection, which writes it, waits in `epoll`, and wakes the caller with the
//! answer. A new key on Redis cost about ten context switches that way, and the hand-offs
//! were a quarter of the calling process's CPU (docs/benchmarks.md, issue 33, "the calling
//! thread makes its own round trips").
//!
//! So a store whose connection is driven by the runtime that opened it (a single Redis server
//! on RESP3; PostgreSQL's handles for other runtimes bring batchers and pools of their own,
//! too heavy to lend one per blocked thread, so it is not lent) is reached through a [`Lent`]
//! handle instead: a current-thread runtime and a connection of its own
//! ([`Store::for_this_runtime`](idem_core::Store::for_this_runtime)), which the calling thread
//! drives while it blocks on the call. The command is written and answered on that thread.
//!
//! - **One blocking step, one handle.** A handle is lent for a claim, then for the
//!   completion (the execution is finished over the second handle's engine,
//!   [`Execution::over`](idem_core::Execution::over)), never across the function: a
//!   process holds as many handles as it has threads blocked on the store at once, not as
//!   many as it has calls under way (a thousand coroutines in flight hold none). No two
//!   threads ever drive one handle at once.
//! - **Heartbeats** run on the shared runtime over the shared connection
//!   ([`Engine::beating_on`]): no lent runtime runs while the function does.
//! - **The pool** keeps up to [`IDLE_KEPT`] idle handles; one returned beyond that is dropped
//!   (its connection closes), and so is one found idle for [`IDLE_FOR`] when another comes
//!   back (a pool no call uses keeps its handles until one does). When no handle can be had
//!   (the server refuses another connection, the process is out of descriptors), the call
//!   goes over the shared runtime as before, and no handle is tried for a moment.
//! - **Idle connections.** No thread drives an idle handle's runtime, so its connection has not
//!   heard the server close it (a restart) until the runtime next runs. So each use first
//!   lets the runtime handle what arrived meanwhile ([`SETTLE_TURNS`]): the connection
//!   manager has then reconnected before a command is written, as it would have on the shared
//!   runtime, and the first claim after a restart succeeds (`tests/driven.rs`).
//! - **Only where a connection hears a close** (one server on RESP3, idem's default). On
//!   `protocol=resp2`, or on a Redis Cluster, a connection learns of a close only when a
//!   command on it fails, so the settling above would not help and each idle handle would
//!   fail one claim after a restart; and a cluster handle is a connection to every node and a
//!   read of the slot map. Those calls stay on the shared runtime.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::Engine;
use idem_stores::AnyStore;
use tokio::runtime::{Handle, Runtime};

use crate::EmbedError;
use crate::host::HostError;

/// Idle handles kept for the next calls: more than the Python package's threads that may
/// block on a store at once in the usual case (its 64 finishing threads and the event loop's
/// executor), so a steady load does not open and close connections. More threads than this
/// blocked at once each get a handle; the extra ones are dropped as they come back.
pub(crate) const IDLE_KEPT: usize = 96;

/// After a handle could not be opened, how long calls go over the shared runtime without
/// trying again.
const RETRY_OPEN_AFTER: Duration = Duration::from_secs(1);

/// How long an idle handle is kept: a burst of threads leaves no connections behind for long.
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(30);

/// Turns given to a handle's runtime before each command (module docs): the first polls the
/// sockets and the connection's task reads a close; the second runs the connection manager's
/// task, which swaps in a new connection. One more, with room to spare. A turn is an
/// `epoll_wait` that returns at once, about a microsecond beside a round trip of 60 or more.
const SETTLE_TURNS: usize = 3;

/// The handles of one store in one process.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The shared engine: each handle's connection is opened from its store, and its
    /// waiters, cache and heartbeats are shared with every handle's engine.
    engine: Engine<AnyStore>,
    /// The process's multi-threaded runtime, where heartbeats run.
    beats_on: Handle,
    /// When a handle could last not be opened: none is tried again for [`RETRY_OPEN_AFTER`],
    /// so that while the server cannot be reached a call waits out one connection timeout
    /// (on the shared runtime), not two.
    failed_open: Mutex<Option<Instant>>,
    /// Boxed as they are lent: moved in and out whole, a pointer each.
    #[allow(clippy::vec_box)]
    idle: Mutex<Vec<Box<Driven>>>,
}

/// A current-thread runtime and an engine over a connection it drives.
#[derive(Debug)]
struct Driven {
    runtime: Runtime,
    engine: Engine<AnyStore>,
    /// When it came back to the pool last.
    used: Instant,
}

/// A handle lent to one call; back to its pool when dropped.
#[derive(Debug)]
pub(crate) struct Lent {
    /// Boxed: a ticket holds this, and a runtime is hundreds of bytes.
    driven: Option<Box<Driven>>,
    pool: Arc<Pool>,
}

impl Pool {
    /// A pool for `engine`'s store when that store gains by a runtime per caller, else `None`.
    pub(crate) fn for_store(engine: &Engine<AnyStore>, beats_on: Handle) -> Option<Arc<Pool>> {
        let hears_closes = matches!(engine.store(), AnyStore::Redis(r) if r.hears_closes());
        hears_closes.then(|| {
            Arc::new(Pool {
                engine: engine.clone(),
                beats_on,
                idle: Mutex::new(Vec::new()),
                failed_open: Mutex::new(None),
            })
        })
    }

    /// The shared engine, for a call that could get no handle.
    pub(crate) fn shared(&self) -> &Engine<AnyStore> {
        &self.engine
    }

    /// An idle handle, or a new one (a connection opened now, within the store's timeout);
    /// `None` when none can be had, and the caller goes over the shared runtime.
    pub(crate) fn lend(self: &Arc<Self>) -> Option<Lent> {
        match self.try_lend() {
            Ok(lent) => Some(lent),
            Err(e) => {
                tracing::debug!(error = %e, "no connection of its own for a blocking call; it goes over the shared runtime");
                None
            }
        }
    }

    fn try_lend(self: &Arc<Self>) -> Result<Lent, EmbedError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let driven = match idle {
            Some(d) => d,
            None => {
                let mut failed = self
                    .failed_open
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if failed.is_some_and(|at| at.elapsed() < RETRY_OPEN_AFTER) {
                    return Err(EmbedError::Store(idem_core::StoreError::Unavailable(
                        "a connection could not be opened a moment ago".into(),
                    )));
                }
                match self.open() {
                    Ok(d) => {
                        *failed = None;
                        d
                    }
                    Err(e) => {
                        *failed = Some(Instant::now());
                        return Err(e);
                    }
                }
            }
        };
        Ok(Lent {
            driven: Some(driven),
            pool: self.clone(),
        })
    }

    fn open(&self) -> Result<Box<Driven>, EmbedError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HostError::from)?;
        let store = runtime.block_on(idem_core::Store::for_this_runtime(self.engine.store()))?;
        let engine = self.engine.beating_on(store, self.beats_on.clone());
        Ok(Box::new(Driven {
            runtime,
            engine,
            used: Instant::now(),
        }))
    }

    fn take_back(&self, mut driven: Box<Driven>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the lock, so the list stays in the order handles came back.
        driven.used = Instant::now();
        // Oldest first: lent from the back, the front is what sat longest.
        let stale = idle
            .iter()
            .take_while(|d| d.used.elapsed() >= IDLE_FOR)
            .count();
        let mut dropped: Vec<_> = idle.drain(..stale).collect();
        if idle.len() < IDLE_KEPT {
            idle.push(driven);
        } else {
            dropped.push(driven);
        }
        drop(idle);
        for driven in dropped {
            close(driven);
        }
    }

    /// Idle handles, for tests.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The last holder may be a task on a runtime (an execution finished there), where a
        // runtime's ordinary drop would panic.
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(PoisonError::into_inner));
        for driven in idle {
            close(driven);
        }
    }
}

/// Ends a handle's tasks and connection, without waiting for them: a handle may be dropped on
/// a runtime's thread, where a runtime's ordinary drop would panic.
fn close(driven: Box<Driven>) {
    let Driven {
        runtime, engine, ..
    } = *driven;
    drop(engine);
    runtime.shutdown_background();
}

impl Lent {
    fn driven(&mut self) -> &mut Driven {
        // Only `Drop` takes it.
        self.driven
            .as_mut()
            .unwrap_or_else(|| unreachable!("a lent handle is whole until dropped"))
    }

    /// The engine over this handle's connection.
    pub(crate) fn engine(&mut self) -> Engine<AnyStore> {
        self.driven().engine.clone()
    }

    /// Runs `f` to completion on this handle's runtime, driven by the calling thread, once
    /// the runtime has caught up on what arrived while it sat idle.
    pub(crate) fn block_on<F: Future>(&mut self, f: F) -> F::Output {
        self.driven().runtime.block_on(async {
            for _ in 0..SETTLE_TURNS {
                tokio::task::yield_now().await;
            }
            f.await
        })
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(driven) = self.driven.take() {
            self.pool.take_back(driven);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::host::host;

    /// Handles come back to the pool when their calls end, and the next calls reuse them: a
    /// process holds as many connections as it had calls at once, not one per call.
    #[test]
    fn handles_are_reused_and_as_many_as_the_calls_at_once() {
        let test = "handles_are_reused_and_as_many_as_the_calls_at_once";
        if !idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
            return;
        }
        let host = host().expect("the runtime starts");
        let url = "redis://127.0.0.1:6379/?durability=volatile&prefix=idem-test-driven-pool";
        let pool = host
            .opened(url)
            .expect("opens")
            .pool
            .expect("a Redis store lends handles");
        let three: Vec<_> = (0..3).map(|_| pool.lend().expect("lends")).collect();
        assert_eq!(pool.idle(), 0);
        drop(three);
        assert_eq!(pool.idle(), 3);
        let mut again = pool.lend().expect("lends");
        assert_eq!(
            pool.idle(),
            2,
            "an idle handle is lent before a new one is opened"
        );
        let engine = again.engine();
        let scope = idem_core::Scope::anonymous();
        let key = idem_core::Key::new("driven-pool-absent").expect("a key");
        let got = again.block_on(idem_core::Store::get(engine.store(), &scope, &key));
        assert_eq!(got.expect("a read over the lent connection"), None);
        drop(again);
        assert_eq!(pool.idle(), 3);

        let memory = host.opened("memory:").expect("opens");
        assert!(
            memory.pool.is_none(),
            "a memory store gains nothing by handles"
        );
    }
}
