//! Taking what is queued. The writer's group commits and the readers' batches both block for
//! one job, then take every other job already queued, up to a bound: the batch grows with the
//! load by itself, and nothing waits for a timer.

use std::sync::mpsc::Receiver;

/// Adds to `batch` what `queue` already holds, without waiting, until `batch` has `max`.
pub(crate) fn take_queued<T>(queue: &Receiver<T>, batch: &mut Vec<T>, max: usize) {
    while batch.len() < max {
        match queue.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}
