//! Checkpoints off the writer's path.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses the threshold, so every
//! thousandth commit or so would stall the writer, and every claim queued behind it, while
//! pages are copied into the main file and it is fsynced. Instead a thread of its own runs a
//! `PASSIVE` checkpoint every [`INTERVAL`]: passive checkpoints never block the writer or the
//! readers. The writer's own automatic checkpoint stays on at a high threshold, as a backstop
//! should this thread fall behind.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use idem_core::StoreError;

use crate::schema;

/// Time between checkpoints.
const INTERVAL: Duration = Duration::from_millis(200);

/// The checkpoint thread; dropping this stops it.
pub(crate) struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub(crate) fn start(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        let conn = schema::connect(path, busy_timeout)?;
        let path: PathBuf = path.to_path_buf();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-checkpoint".into())
            .spawn(move || {
                let mut failing = false;
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(INTERVAL) {
                    let result: rusqlite::Result<(i64, i64, i64)> =
                        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                        });
                    match result {
                        Ok(_) if failing => {
                            failing = false;
                            tracing::info!(path = %path.display(), "checkpoints work again");
                        }
                        Ok(_) => {}
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!(path = %path.display(), error = %e, "checkpoint failed; the writer's own checkpoints take over");
                        }
                        Err(_) => {}
                    }
                }
            })
            .map_err(StoreError::unavailable)?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Checkpointer {
    /// Tells the thread to stop and hands it back, for the caller to wait for within its bound.
    pub(crate) fn stop(mut self) -> Option<JoinHandle<()>> {
        drop(self.stop.take());
        self.thread.take()
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
