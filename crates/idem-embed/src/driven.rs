//! Blocking calls whose round trips the calling thread makes itself.
//!
//! A host thread that blocks on a call (a Python thread in the decorator, or in the WSGI or
//! ASGI middleware through [`crate::http`]) waits while the store's round trips are made. On the process's shared runtime each
//! round trip crosses threads: the caller hands the command to the worker that drives the
//! store's connection, which writes it, waits in `epoll`, and wakes the caller with the
//! answer. A new key on Redis cost about ten context switches that way, and the hand-offs
//! were a quarter of the calling process's CPU (docs/benchmarks.md, issue 33, "the calling
//! thread makes its round trips").
//!
//! So a store whose connection is driven by the runtime that opened it (Redis,
//! [`AnyStore::connects_per_runtime`]) is reached through a [`Lent`] handle instead: a
//! current-thread runtime and a connection of its own
//! ([`Store::for_this_runtime`](idem_core::Store::for_this_runtime)), which the calling thread
//! drives while it blocks on the call. The command is written and answered on that thread.
//!
//! - **One call, one handle.** A handle is lent for a call's claim and, when the key is the
//!   call's, until its completion (the ticket holds it while the function runs). No two
//!   threads ever drive one handle at once, and a completion goes out over the connection its
//!   claim used.
//! - **Heartbeats** run on the shared runtime over the shared connection
//!   ([`Engine::beating_on`]): a lent runtime is idle while the function runs.
//! - **The pool** keeps up to [`IDLE_KEPT`] idle handles; one returned beyond that is dropped
//!   (its connection closes). A process holds at most as many handles as it has calls under
//!   way at once.
//! - **Idle connections.** No thread drives an idle handle's runtime, so its connection has not
//!   heard the server close it (a restart) until the runtime next runs. A handle idle for
//!   [`SETTLE_AFTER`] or more first lets its runtime handle what arrived meanwhile, so the
//!   connection manager has reconnected before a command is written, as it would have on the
//!   shared runtime: a write after a restart succeeds (`tests/driven.rs`).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::Engine;
use idem_stores::AnyStore;
use tokio::runtime::{Handle, Runtime};

use crate::EmbedError;
use crate::host::HostError;

/// Idle handles kept for the next calls. More threads than this calling at once each get a
/// handle; the extra ones are dropped as they come back.
pub(crate) const IDLE_KEPT: usize = 64;

/// A handle idle this long lets its runtime catch up before a command (module docs). Well
/// under the time a server takes to restart, and far above the gap between one call's
/// completion and the next call's claim on a busy thread, which pays nothing for it.
pub(crate) const SETTLE_AFTER: Duration = Duration::from_millis(1);

/// Turns given to an idle handle's runtime before a command: the connection's task reads the
/// close, its disconnection reaches the manager's task, which swaps in a new connection. One
/// turn each, with room to spare.
const SETTLE_TURNS: usize = 4;

/// The handles of one store in one process.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The shared engine: each handle's connection is opened from its store, and its
    /// waiters, cache and heartbeats are shared with every handle's engine.
    engine: Engine<AnyStore>,
    /// The process's multi-threaded runtime, where heartbeats run.
    beats_on: Handle,
    /// Boxed as they are lent: moved in and out whole, a pointer each.
    #[allow(clippy::vec_box)]
    idle: Mutex<Vec<Box<Driven>>>,
}

/// A current-thread runtime and an engine over a connection it drives.
#[derive(Debug)]
struct Driven {
    runtime: Runtime,
    engine: Engine<AnyStore>,
    /// When it last ran.
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
        engine.store().connects_per_runtime().then(|| {
            Arc::new(Pool {
                engine: engine.clone(),
                beats_on,
                idle: Mutex::new(Vec::new()),
            })
        })
    }

    /// An idle handle, or a new one (a connection opened now, within the store's timeout).
    pub(crate) fn lend(self: &Arc<Self>) -> Result<Lent, EmbedError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let driven = match idle {
            Some(d) => d,
            None => self.open()?,
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

    fn take_back(&self, driven: Box<Driven>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < IDLE_KEPT {
            idle.push(driven);
            return;
        }
        drop(idle);
        // Its tasks and connection end with it. Without waiting for them: a ticket may be
        // dropped on a runtime's thread, where a runtime's ordinary drop would panic.
        let Driven {
            runtime, engine, ..
        } = *driven;
        drop(engine);
        runtime.shutdown_background();
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

    /// Runs `f` to completion on this handle's runtime, driven by the calling thread.
    pub(crate) fn block_on<F: Future>(&mut self, f: F) -> F::Output {
        let driven = self.driven();
        if driven.used.elapsed() >= SETTLE_AFTER {
            driven.runtime.block_on(async {
                for _ in 0..SETTLE_TURNS {
                    tokio::task::yield_now().await;
                }
            });
        }
        let out = driven.runtime.block_on(f);
        driven.used = Instant::now();
        out
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
