//! Stopping the store's threads within a bound. A thread stuck in the kernel (an fsync on a
//! stalled file system) must not hold up a service's shutdown or a process's exit for ever:
//! it is waited for until the deadline, then left to finish on its own. What it had not
//! committed is then lost as in a crash, which SQLite's journal makes safe, and a claim it
//! had not acknowledged never ran its effect.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Waits until every thread has finished or `deadline` has passed, and joins those that
/// finished.
pub(crate) fn join_until(threads: impl IntoIterator<Item = JoinHandle<()>>, deadline: Instant) {
    let threads: Vec<_> = threads.into_iter().collect();
    while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    for t in threads {
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

/// The lock around what stopping takes (a queue's sender, a thread's handle). Whoever holds
/// it cannot leave it half-changed (a take, a send), so a panic elsewhere while it was held
/// does not matter.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
