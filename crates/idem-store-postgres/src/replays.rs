//! Replay counts, written in batches.
//!
//! A replay is the hot path and otherwise reads only. Counting each one with its own UPDATE
//! would make every replay a write; the counts are kept in memory and added by one
//! statement every [`FLUSH_EVERY`]. A crash loses at most that long of counting, never a
//! result (the count is for operators, [design §2](docs/design.md#2-the-records-life)).
//!
//! This module only counts. The tally lives in the store's shared state, and the task that
//! writes it (`replay_writer`) needs that state; kept apart, neither module points back.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idem_core::{FencingToken, Key, Scope};

/// How often counted replays are written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// Replays counted and not yet written, by (scope, key, token): the token keeps a count from
/// landing on a later life of the same key.
#[derive(Debug, Default)]
pub(crate) struct Tally(Mutex<HashMap<(String, String, i64), i64>>);

impl Tally {
    pub(crate) fn count(&self, scope: &Scope, key: &Key, token: FencingToken) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry((
            scope.as_str().to_owned(),
            key.as_str().to_owned(),
            token.as_i64(),
        ))
        .or_default() += 1;
    }

    pub(crate) fn take(&self) -> HashMap<(String, String, i64), i64> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn put_back(&self, batch: HashMap<(String, String, i64), i64>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for (k, n) in batch {
            *map.entry(k).or_default() += n;
        }
    }
}
