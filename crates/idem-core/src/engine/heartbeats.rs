//! Heartbeats of executions run in two halves ([`Engine::begin`](super::Engine::begin), then
//! [`Execution::finish`](super::Execution::finish)), started only once an execution outlives
//! the first third of its lease.
//!
//! Why: the language packages run every tool call in two halves, and a heartbeat task spawned
//! for each call, then stopped and waited for at its end, cost a thread wake-up at each step.
//! For a call that finishes within a third of its lease (nearly all of them: the lease is 30 s
//! by default) those wake-ups were most of what the call cost (docs/benchmarks.md, issue 16,
//! sixth pass). Here a call only writes itself into a map of due times. One driver task per
//! engine sleeps until the earliest is due and starts that execution's heartbeat then, whose
//! first extend goes out at once: the same moment the spawned task would have sent it. A call
//! that ends first takes itself out of the map, and nothing ever ran for it.
//!
//! The driver is woken only when a call is due before the driver's next look. With equal
//! leases that happens only if the driver was idle, and an idle driver looks every
//! [`IDLE_LOOK`] instead of waiting to be woken, so calls with a lease of three times that or
//! more (the default 30 s) wake nobody; a shorter lease wakes the idle driver once per call.
//! The driver looks every [`IDLE_LOOK`] for as long as its engine lives.
//!
//! **Runtimes.** A heartbeat runs on the runtime of the call that armed it, as a task spawned
//! there would have, or on the engine's own when it has one
//! ([`Engine::beating_on`](super::Engine::beating_on)). The driver runs on the runtime of the
//! call that started it, the same way. If that
//! runtime shuts down, the driver's drop starts every heartbeat still pending on its own
//! call's runtime, to wait there until it is due, and the next call starts a new driver.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long an idle driver sleeps between looks at the map: less than a third of the default
/// 30 s lease, so a call with that lease never has to wake it.
pub(crate) const IDLE_LOOK: Duration = Duration::from_secs(5);

/// Starts a heartbeat: spawns its task on the armed call's runtime, its first extend after
/// the pause given.
pub(crate) type Start = Box<dyn FnOnce(Duration) -> JoinHandle<()> + Send>;

/// The engine's heartbeats not started yet, and their driver. Cloning shares them.
#[derive(Clone, Default)]
pub(crate) struct Heartbeats {
    shared: Arc<Shared>,
}

impl fmt::Debug for Heartbeats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heartbeats")
            .field("pending", &lock(&self.shared.state).due.len())
            .finish()
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the driver when a heartbeat is due before its next look.
    wake: Notify,
}

#[derive(Default)]
struct State {
    /// Heartbeats not started, by when they are due (and an id, for equal times).
    due: BTreeMap<(Instant, u64), Arc<Slot>>,
    next_id: u64,
    /// Whether a driver is running (or spawned and about to): set when one is spawned, cleared
    /// by that driver's drop, under this lock, so that a call armed at any moment is seen by
    /// a driver that is still to look or by a new one. Only the live driver can clear it: a
    /// new one is spawned only after the last one's drop has.
    driver_alive: bool,
    /// When the driver looks next, unless woken; `None` until it has looked once.
    next_look: Option<Instant>,
}

/// One execution's heartbeat.
struct Slot {
    state: Mutex<SlotState>,
    /// Where it sits in the map while pending.
    due: (Instant, u64),
    heartbeats: Weak<Shared>,
}

enum SlotState {
    /// Not started: the driver starts it when it is due.
    Pending(Start),
    /// Started; its task extends the lease until told to stop.
    Running(JoinHandle<()>),
    /// The execution ended, or its heartbeat was handed back: never to be started.
    Ended,
}

/// A heartbeat armed by [`Heartbeats::arm`]; [`Armed::end`] disarms it. One pointer wide:
/// every language package's call holds one.
pub(crate) struct Armed(Arc<Slot>);

impl fmt::Debug for Armed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Armed").field("due", &self.0.due.0).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is a single insert, removal or swap.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Heartbeats {
    /// Arms a heartbeat that `start` spawns at `due` unless the execution ends first. A
    /// driver started here runs on `runtime`.
    pub(crate) fn arm(
        &self,
        runtime: &tokio::runtime::Handle,
        due: Instant,
        start: Start,
    ) -> Armed {
        let (slot, new_driver) = {
            let mut state = lock(&self.shared.state);
            let key = (due, state.next_id);
            state.next_id += 1;
            let slot = Arc::new(Slot {
                state: Mutex::new(SlotState::Pending(start)),
                due: key,
                heartbeats: Arc::downgrade(&self.shared),
            });
            state.due.insert(key, slot.clone());
            let new_driver = if state.driver_alive {
                if state.next_look.is_none_or(|look| due < look) {
                    self.shared.wake.notify_one();
                }
                None
            } else {
                state.driver_alive = true;
                state.next_look = None;
                Some(DriverGone(Arc::downgrade(&self.shared)))
            };
            (slot, new_driver)
        };
        // Spawned outside the lock: a future spawned onto a runtime that is closing is dropped
        // at once, inside `spawn`, and its guard takes the lock.
        if let Some(gone) = new_driver {
            drop(runtime.spawn(drive(gone)));
        }
        Armed(slot)
    }
}

#[cfg(test)]
impl Heartbeats {
    /// Heartbeats armed and not started or ended yet.
    pub(crate) fn pending(&self) -> usize {
        lock(&self.shared.state).due.len()
    }
}

impl Armed {
    /// Disarms the heartbeat: one not started never will be (and nothing is left of it); one
    /// running is handed back, for the caller to stop and wait for, or abort.
    pub(crate) fn end(self) -> Option<JoinHandle<()>> {
        let slot = &self.0;
        let ended = std::mem::replace(&mut *lock(&slot.state), SlotState::Ended);
        match ended {
            SlotState::Pending(_) => {
                if let Some(shared) = slot.heartbeats.upgrade() {
                    lock(&shared.state).due.remove(&slot.due);
                }
                None
            }
            SlotState::Running(task) => Some(task),
            SlotState::Ended => None,
        }
    }
}

impl Slot {
    /// Starts the heartbeat, its first extend after `first`, unless its execution ended
    /// meanwhile.
    fn start(&self, first: Duration) {
        let mut state = lock(&self.state);
        *state = match std::mem::replace(&mut *state, SlotState::Ended) {
            SlotState::Pending(start) => SlotState::Running(start(first)),
            other => other,
        };
    }
}

/// Owned by the driver's future (an argument, so it is dropped even with a future never
/// polled): dropped normally when its engine is gone (nothing pending), or when its runtime
/// shuts down under it. Then each pending heartbeat starts now on its own call's runtime, to
/// wait there until it is due, and the next call starts a new driver.
struct DriverGone(Weak<Shared>);

impl Drop for DriverGone {
    fn drop(&mut self) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let pending = {
            let mut state = lock(&shared.state);
            state.driver_alive = false;
            state.next_look = None;
            std::mem::take(&mut state.due)
        };
        let now = Instant::now();
        for ((due, _), slot) in pending {
            slot.start(due.saturating_duration_since(now));
        }
    }
}

/// The driver: starts each heartbeat when it is due. Ends once its engine is gone.
async fn drive(gone: DriverGone) {
    loop {
        let Some(shared) = gone.0.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (due, next_look) = {
            let mut state = lock(&shared.state);
            let later = state.due.split_off(&(now, u64::MAX));
            let due = std::mem::replace(&mut state.due, later);
            let next_look = state
                .due
                .first_key_value()
                .map_or(now + IDLE_LOOK, |((at, _), _)| *at);
            state.next_look = Some(next_look);
            (due, next_look)
        };
        for slot in due.into_values() {
            slot.start(Duration::ZERO);
        }
        // A call due earlier than `next_look` wakes it (a wake-up sent before this wait
        // begins is kept, not lost).
        let _ = tokio::time::timeout_at(next_look, shared.wake.notified()).await;
    }
}
