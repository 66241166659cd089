//! The task that writes counted replays: every [`FLUSH_EVERY`] it takes the tally and adds
//! it to the records in one statement, on the pool whose commits do not wait for the disk.
//! A failed write keeps the counts for the next try.

use std::sync::Weak;

use crate::inner::Inner;
use crate::replays::FLUSH_EVERY;

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
                use tokio_postgres::types::Type;
                inner
                    .execute(
                        &*client,
                        crate::inner::Lane::AfterCommit,
                        &inner.sql.count_replays,
                        &[
                            (&scopes, Type::TEXT_ARRAY),
                            (&keys, Type::TEXT_ARRAY),
                            (&tokens, Type::INT8_ARRAY),
                            (&counts, Type::INT8_ARRAY),
                        ],
                    )
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
