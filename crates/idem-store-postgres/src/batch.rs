//! Group claims and completions: many concurrent requests, one statement.
//!
//! One statement per request costs PostgreSQL a parse-free but otherwise full round of
//! executor start, WAL record and commit per request; at a few dozen concurrent requests
//! that, not the disk, is the limit. A batcher lets the first request go at once, and while
//! [`Batcher`]'s in-flight batches are busy, collects the requests that arrive meanwhile
//! into the next statement. At low load a request waits for nobody; under load a batch
//! carries everyone who queued (the same shape as group commit in the SQLite writer).

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

/// One request waiting in a batch, and where its answer goes.
pub(crate) type Job<T, R> = (T, oneshot::Sender<R>);

/// Queues jobs for a runner that takes them in batches.
#[derive(Debug)]
pub(crate) struct Batcher<T, R> {
    queue: mpsc::UnboundedSender<Job<T, R>>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the batching task. `run` gets each batch (at most `max_batch` jobs) and must
    /// answer every job in it; at most `in_flight` batches run at once. The task ends when
    /// the batcher is dropped.
    pub(crate) fn start<F, Fut>(max_batch: usize, in_flight: usize, run: F) -> Self
    where
        F: Fn(Vec<Job<T, R>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (queue, mut rx) = mpsc::unbounded_channel::<Job<T, R>>();
        let permits = Arc::new(Semaphore::new(in_flight.max(1)));
        let run = Arc::new(run);
        tokio::spawn(async move {
            loop {
                // Wait for a free slot first: whatever queues meanwhile joins this batch.
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else { return };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let run = run.clone();
                tokio::spawn(async move {
                    run(batch).await;
                    drop(permit);
                });
            }
        });
        Batcher { queue }
    }

    /// Queues `job` and waits for its answer; `None` if the runner is gone.
    pub(crate) async fn submit(&self, job: T) -> Option<R> {
        let (tx, rx) = oneshot::channel();
        self.queue.send((job, tx)).ok()?;
        rx.await.ok()
    }
}
