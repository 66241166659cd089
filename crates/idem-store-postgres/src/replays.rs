//! Replay counts, written in batches.
//!
//! A replay is the hot path and otherwise reads only. Counting each one with its own UPDATE
//! would make every replay a write; the counts are kept in memory and added by one
//! statement every [`FLUSH_EVERY`]. A crash loses at most that long of counting, never a
//! result (the count is for operators, DESIGN §2).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use idem_core::{FencingToken, Key, Scope};

use crate::store::Inner;

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

    fn take(&self) -> HashMap<(String, String, i64), i64> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn put_back(&self, batch: HashMap<(String, String, i64), i64>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for (k, n) in batch {
            *map.entry(k).or_default() += n;
        }
    }
}

/// Writes the tally until the store is dropped.
pub(crate) async fn flush_loop(store: Weak<Inner>) {
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(inner) = store.upgrade() else { return };
        let batch = inner.replays.take();
        if batch.is_empty() {
            continue;
        }
        let (mut scopes, mut keys, mut tokens, mut counts) = (vec![], vec![], vec![], vec![]);
        for ((s, k, t), n) in &batch {
            scopes.push(s.as_str());
            keys.push(k.as_str());
            tokens.push(*t);
            counts.push(*n);
        }
        let written = inner
            .bounded(async {
                let client = inner.after_commit_client().await?;
                let stmt = client
                    .prepare_cached(&inner.sql.count_replays)
                    .await
                    .map_err(|e| crate::sql::unavailable("prepare", e))?;
                client
                    .execute(&stmt, &[&scopes, &keys, &tokens, &counts])
                    .await
                    .map_err(|e| crate::sql::unavailable("count replays", e))
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "replay counts not written; keeping them for the next try");
            inner.replays.put_back(batch);
        }
    }
}
