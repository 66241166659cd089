//! An operator's listing of records ([`ListRecords`]), for the gateway's admin page: one
//! read statement on the claims pool (`PgStore`'s [`ListRecords`](idem_core::ListRecords) delegates here), filtered, ordered and cut in SQL,
//! reading only the listed columns (never a response body).

use idem_core::store::list::state_rank;
use idem_core::{Listing, RecordFilter, StoreError};
use tokio_postgres::types::Type;

use crate::inner::{Inner, Lane};
use crate::sql::{listed_of, now_of, unavailable};

impl Inner {
    pub(crate) async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        let inner = self;
        let limit = filter.effective_limit();
        // One row past the limit tells whether more match.
        let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
        let rank = filter.state.map(|s| i32::from(state_rank(s)));
        inner
            .bounded(async {
                let client = inner.read_client().await?;
                let rows = inner
                    .query(
                        &*client,
                        Lane::Read,
                        &inner.sql.list,
                        &[
                            (&inner.now(), Type::INT8),
                            (&filter.key_prefix, Type::TEXT),
                            (&filter.scope_prefix, Type::TEXT),
                            (&rank, Type::INT4),
                            (&fetch, Type::INT8),
                        ],
                    )
                    .await
                    .map_err(|e| unavailable("list", e))?;
                let first = rows
                    .first()
                    .ok_or_else(|| unavailable_row("list returned no row"))?;
                let now = now_of(first)?;
                let mut records = Vec::with_capacity(rows.len());
                for row in &rows {
                    records.extend(listed_of(row)?);
                }
                Ok(filter.finish(records, now, false))
            })
            .await
    }
}

fn unavailable_row(why: &str) -> StoreError {
    StoreError::Corrupt(format!("postgres: {why}"))
}
