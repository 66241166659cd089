//! An operator's listing of records ([`ListRecords`]) for the gateway's admin page.
//!
//! A listing reads this store's own indexes (layout.rs), never the server's keyspace: what it
//! costs follows the records under this prefix, not other prefixes' or other applications'
//! keys in the same Redis. It reads state by state, in the listing's order: the abandoned
//! records (each shard's `live` index up to now), then those in flight (`live` after now),
//! then the completed (`expiry`, latest retention first), and stops after a state once it has
//! a full page, so abandoned records are never crowded out by completed ones. Of each record
//! it reads the fields the listing shows with `HMGET` (never the stored response), one
//! pipeline per shard, the shards at once. It reads no more than [`MAX_READ`] records and
//! says so (`more`) when it stopped before the end. Nothing is written, and each round trip
//! has the store's operation timeout.

use futures_util::future::try_join_all;
use idem_core::{ListRecords, Listed, Listing, RecordFilter, RecordState, StoreError, Timestamp};
use redis::Value;

use crate::layout::Shard;
use crate::reply::{self, corrupt};
use crate::store::{RedisStore, within};

/// The most records one listing reads; past it the listing reports `more`.
pub(crate) const MAX_READ: usize = 10_000;

/// One state's slice of a shard's indexes, as `ZRANGE` arguments.
struct Tier {
    state: RecordState,
    /// Which index: `live` or `expiry`.
    live: bool,
    /// `ZRANGE index min max BYSCORE [REV]` bounds (in the order `ZRANGE` takes them).
    bounds: (String, String),
    rev: bool,
}

fn tiers(now: Timestamp) -> [Tier; 3] {
    let now = now.as_millis();
    [
        Tier {
            state: RecordState::Abandoned,
            live: true,
            bounds: ("-inf".into(), now.to_string()),
            rev: false,
        },
        Tier {
            state: RecordState::InFlight,
            live: true,
            bounds: (format!("({now}"), "+inf".into()),
            rev: false,
        },
        Tier {
            state: RecordState::Completed,
            live: false,
            // Latest retention first: close to "newest first", which the page is sorted by.
            bounds: ("+inf".into(), format!("({now}")),
            rev: true,
        },
    ]
}

impl RedisStore {
    /// The records of one tier in one shard, at most `budget` of them.
    async fn tier_of_shard(
        &self,
        shard: &Shard,
        tier: &Tier,
        budget: usize,
    ) -> Result<(Vec<Listed>, bool), StoreError> {
        let mut con = self.connection();
        let timeout = self.op_timeout();
        let index = if tier.live {
            shard.live()
        } else {
            shard.expiry()
        };
        let mut range = redis::cmd("ZRANGE");
        range
            .arg(index)
            .arg(&tier.bounds.0)
            .arg(&tier.bounds.1)
            .arg("BYSCORE");
        if tier.rev {
            range.arg("REV");
        }
        // One more than the budget: whether more were there.
        range.arg("LIMIT").arg(0).arg(budget + 1);
        let mut keys: Vec<String> =
            within(timeout, "read index", range.query_async(&mut con)).await?;
        let cut = keys.len() > budget;
        keys.truncate(budget);
        if keys.is_empty() {
            return Ok((Vec::new(), cut));
        }
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.cmd("HMGET").arg(k).arg(&reply::LISTED_FIELDS);
        }
        let replies: Vec<Value> =
            within(timeout, "read records", pipe.query_async(&mut con)).await?;
        if replies.len() != keys.len() {
            return Err(corrupt("HMGET pipeline answered a different count"));
        }
        let mut found = Vec::with_capacity(replies.len());
        for v in &replies {
            // Expired and deleted by Redis since it was indexed: absent.
            if let Some(r) = reply::listed(v)? {
                found.push(r);
            }
        }
        Ok((found, cut))
    }
}

impl ListRecords for RedisStore {
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        let now = self.redis_now().await?;
        let shards = self.shards();
        let per_shard = MAX_READ / (shards.len() * 3);
        let mut found = Vec::new();
        let mut more = false;
        for tier in tiers(now) {
            if filter.state.is_some_and(|s| s != tier.state) {
                continue;
            }
            if found.iter().filter(|r| filter.matches(r, now)).count() >= filter.effective_limit() {
                // A full page of earlier states: this one may hold more.
                more = true;
                break;
            }
            let reads = shards
                .iter()
                .map(|shard| self.tier_of_shard(shard, &tier, per_shard));
            for (records, cut) in try_join_all(reads).await? {
                more |= cut;
                // The state is re-read from the record: a lease may have ended between the
                // index read and this one, and the page must say what the record says.
                found.extend(records);
            }
        }
        // A record whose state changed between two tiers' reads was read twice: the later
        // read stands.
        let mut seen = std::collections::HashSet::new();
        let mut unique: Vec<Listed> = found
            .into_iter()
            .rev()
            .filter(|r| seen.insert((r.scope.clone(), r.key.clone())))
            .collect();
        unique.reverse();
        Ok(filter.finish(unique, now, more))
    }
}
