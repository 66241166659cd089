//! An operator's listing of records ([`ListRecords`]) for the gateway's admin page.
//!
//! Redis has no index by state or by key, so a listing SCANs the store's record keys
//! (`PREFIX:r:*`) and reads the fields the listing shows of each with `HMGET` (never the
//! stored response), a batch per round trip. The scan is bounded:
//! it reads no more than [`MAX_SCANNED`] records and makes no more than [`MAX_SCAN_CALLS`]
//! SCAN calls (each examines about [`SCAN_COUNT`] keys of the whole database, other
//! applications' included), and says so (`more`) when it stopped before the end. Nothing is
//! written, and each round trip has the store's operation timeout.

use idem_core::{ListRecords, Listing, RecordFilter, StoreError};
use redis::Value;

use crate::reply::{self, corrupt};
use crate::store::{RedisStore, within};

/// The most record keys one listing reads; past it the listing reports `more`.
pub(crate) const MAX_SCANNED: usize = 10_000;

/// The most SCAN calls one listing makes: about 100,000 keys of the database examined.
pub(crate) const MAX_SCAN_CALLS: usize = 200;

/// Keys asked of each SCAN call (a hint to Redis, which may return more or fewer).
const SCAN_COUNT: usize = 500;

/// `s` with the glob characters SCAN's MATCH would interpret escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl ListRecords for RedisStore {
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        let now = self.redis_now().await?;
        let pattern = format!("{}:r:*", glob_escape(self.prefix()));
        let mut con = self.connection();
        let timeout = self.op_timeout();
        let mut cursor: u64 = 0;
        let mut scanned = 0;
        let mut calls = 0;
        let mut found = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = within(
                timeout,
                "scan",
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async(&mut con),
            )
            .await?;
            scanned += keys.len();
            calls += 1;
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                for k in &keys {
                    pipe.cmd("HMGET").arg(k).arg(&reply::LISTED_FIELDS);
                }
                let replies: Vec<Value> =
                    within(timeout, "read records", pipe.query_async(&mut con)).await?;
                if replies.len() != keys.len() {
                    return Err(corrupt("HMGET pipeline answered a different count"));
                }
                for v in &replies {
                    // A key deleted between SCAN and HMGET reads as nil fields: absent.
                    if let Some(r) = reply::listed(v)?
                        && filter.matches(&r, now)
                    {
                        found.push(r);
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                return Ok(filter.finish(found, now, false));
            }
            if scanned >= MAX_SCANNED || calls >= MAX_SCAN_CALLS {
                return Ok(filter.finish(found, now, true));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    #[test]
    fn glob_characters_in_a_prefix_match_only_themselves() {
        assert_eq!(glob_escape("idem"), "idem");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }
}
