//! A bounded in-memory cache of completed records, consulted before the store's claim
//! ([design §9](docs/design.md#9-performance-shape)).
//!
//! Why a cache in front of a shared store is correct: a completed record never changes until
//! its retention ends. Fencing refuses every later `complete`, `release` and `extend`; an
//! operator's `resolve` only touches abandoned records; purge only deletes expired ones. So a
//! completed record seen once (answered by a claim, or just stored by this engine) can answer
//! every later claim of its key, from any gateway, until it expires: a replay when the
//! fingerprint matches, a mismatch when it does not. Nothing else is cached: an in-flight or
//! abandoned record can change under another process.
//!
//! Expiry is honoured on read, on this process's clock, with [`CLOCK_MARGIN`] taken off:
//! records written by PostgreSQL and Redis carry the server's time, and a cache that let a
//! record go a little early only costs one store round trip.
//!
//! What a hit does not do: count the replay in the record (`replays` counts the replays the
//! store answered); `idem_cache_hits_total` counts the others.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{Equivalent, Weighter};

use crate::clock::{Clock, SystemClock};
use crate::key::Key;
use crate::memory::Hashing;
use crate::record::{Record, StoredBody};
use crate::scope::Scope;

/// The bound front ends give the cache unless configured otherwise: 64 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// How much earlier than its `expires_at` a cached record stops answering: room for this
/// process's clock to run behind the store server's.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// What a cached entry costs beyond its strings and body (the map slot, the record's fixed
/// fields, the allocations' headers): an estimate, so that many tiny records still bound it.
const ENTRY_OVERHEAD: u64 = 256;

/// Completed records by (scope, key), bounded in bytes. Cloning shares the cache; one
/// pointer wide, since every engine carries one.
#[derive(Clone)]
pub struct CompletedCache {
    shared: Arc<Shared>,
}

struct Shared {
    records: Cache<(Scope, Key), Arc<Record>, RecordWeight, Hashing>,
    clock: Arc<dyn Clock>,
    max_bytes: u64,
}

impl std::fmt::Debug for CompletedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletedCache")
            .field("max_bytes", &self.shared.max_bytes)
            .field("bytes", &self.bytes())
            .field("records", &self.len())
            .finish()
    }
}

impl CompletedCache {
    /// A cache that holds at most about `max_bytes` of records, expiring them on the system
    /// clock. A record larger than the whole cache is never kept.
    pub fn new(max_bytes: u64) -> Self {
        Self::with_clock(max_bytes, Arc::new(SystemClock))
    }

    /// As [`CompletedCache::new`], reading expiry from `clock` (tests share one with the
    /// store).
    pub fn with_clock(max_bytes: u64, clock: Arc<dyn Clock>) -> Self {
        // An estimate of how many records fit, for the table's initial size; records of
        // about 2 KiB are typical of an API's JSON answer.
        let estimated = usize::try_from(max_bytes / 2048)
            .unwrap_or(usize::MAX)
            .max(16);
        CompletedCache {
            shared: Arc::new(Shared {
                records: Cache::with(
                    estimated,
                    max_bytes.max(1),
                    RecordWeight,
                    Hashing::new(),
                    DefaultLifecycle::default(),
                ),
                clock,
                max_bytes,
            }),
        }
    }

    /// The completed record of (scope, key), if cached and not about to expire.
    pub fn get(&self, scope: &Scope, key: &Key) -> Option<Arc<Record>> {
        let lookup = Borrowed(scope, key);
        let found = self.shared.records.get(&lookup).filter(|r| self.live(r));
        crate::outcome::count_cache_lookup(found.is_some());
        found
    }

    /// Remembers `record` if it is completed and not about to expire; anything else is
    /// ignored, since only a completed record is immutable.
    pub fn insert(&self, record: Record) {
        if self.keeps(&record) {
            self.insert_shared(&Arc::new(record));
        }
    }

    /// As [`CompletedCache::insert`], sharing a record the caller holds already.
    pub fn insert_shared(&self, record: &Arc<Record>) {
        if self.keeps(record) {
            self.shared.records.insert(
                (record.scope.clone(), record.key.clone()),
                Arc::clone(record),
            );
        }
    }

    fn keeps(&self, record: &Record) -> bool {
        record.completed_at.is_some() && record.response.is_some() && self.live(record)
    }

    /// Bytes held now (estimated as the bound is).
    pub fn bytes(&self) -> u64 {
        self.shared.records.weight()
    }

    /// Records held now.
    pub fn len(&self) -> usize {
        self.shared.records.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.shared.records.is_empty()
    }

    fn live(&self, record: &Record) -> bool {
        record.expires_at > self.shared.clock.now().saturating_add(CLOCK_MARGIN)
    }
}

/// A record's estimated size in memory: what the byte bound counts.
#[derive(Debug, Clone, Copy)]
struct RecordWeight;

impl Weighter<(Scope, Key), Arc<Record>> for RecordWeight {
    fn weight(&self, _: &(Scope, Key), record: &Arc<Record>) -> u64 {
        let strings = record.scope.as_str().len() * 2 + record.key.as_str().len() * 2;
        let response = record.response.as_ref().map_or(0, |r| {
            let body = match &r.body {
                StoredBody::Full(bytes) => bytes.len(),
                StoredBody::Omitted { .. } => 40,
            };
            body + r
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len() + 48)
                .sum::<usize>()
        });
        u64::try_from(strings + response).unwrap_or(u64::MAX) + ENTRY_OVERHEAD
    }
}

/// (scope, key) by reference, for lookups that allocate nothing. Hashes exactly as the
/// owned tuple does: a tuple hashes its fields in order.
struct Borrowed<'a>(&'a Scope, &'a Key);

impl Hash for Borrowed<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl Equivalent<(Scope, Key)> for Borrowed<'_> {
    fn equivalent(&self, owned: &(Scope, Key)) -> bool {
        *self.0 == owned.0 && *self.1 == owned.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::record::{CompletedBy, FencingToken, StoredResponse};

    fn completed(key: &str, body: usize, now: Timestamp, retention: Duration) -> Record {
        Record {
            scope: Scope::new("tenant").expect("scope"),
            key: Key::new(key).expect("key"),
            fingerprint: crate::Fingerprint::from_bytes([7; 32]),
            token: FencingToken::random(),
            created_at: now,
            acquired_at: now,
            lease_expires_at: now,
            completed_at: Some(now),
            completed_by: Some(CompletedBy::Executor),
            expires_at: now.saturating_add(retention),
            retention,
            attempts: 1,
            replays: 0,
            response: Some(StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: StoredBody::Full(vec![b'x'; body].into()),
            }),
        }
    }

    #[test]
    fn a_completed_record_answers_until_just_before_it_expires() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let cache = CompletedCache::with_clock(1 << 20, clock.clone());
        let rec = completed("k1", 10, clock.now(), Duration::from_secs(60));
        cache.insert(rec.clone());
        let got = cache.get(&rec.scope, &rec.key).expect("cached");
        assert_eq!(*got, rec);

        clock.advance(Duration::from_secs(59) - Duration::from_millis(1));
        assert!(cache.get(&rec.scope, &rec.key).is_some());
        // Within the margin of expiry: the store decides.
        clock.advance(Duration::from_millis(2));
        assert!(cache.get(&rec.scope, &rec.key).is_none());
    }

    #[test]
    fn only_completed_records_are_kept() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let cache = CompletedCache::with_clock(1 << 20, clock.clone());
        let mut in_flight = completed("k1", 10, clock.now(), Duration::from_secs(60));
        in_flight.completed_at = None;
        in_flight.response = None;
        in_flight.expires_at = Timestamp::NEVER;
        cache.insert(in_flight.clone());
        assert!(cache.get(&in_flight.scope, &in_flight.key).is_none());

        let expired = completed("k2", 10, clock.now(), Duration::from_millis(500));
        cache.insert(expired.clone());
        assert!(cache.get(&expired.scope, &expired.key).is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn the_bound_is_in_bytes_and_a_record_over_it_is_not_kept() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let cache = CompletedCache::with_clock(64 * 1024, clock.clone());
        for i in 0..200 {
            cache.insert(completed(
                &format!("k{i}"),
                4096,
                clock.now(),
                Duration::from_secs(60),
            ));
            assert!(cache.bytes() <= 64 * 1024, "{} bytes", cache.bytes());
        }
        assert!(
            cache.len() < 200 && cache.len() >= 8,
            "{} records",
            cache.len()
        );

        let huge = completed("huge", 128 * 1024, clock.now(), Duration::from_secs(60));
        cache.insert(huge.clone());
        assert!(cache.get(&huge.scope, &huge.key).is_none());
    }

    #[test]
    fn scopes_never_meet_in_the_cache() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let cache = CompletedCache::with_clock(1 << 20, clock.clone());
        let rec = completed("k1", 10, clock.now(), Duration::from_secs(60));
        cache.insert(rec.clone());
        let other = Scope::new("other-tenant").expect("scope");
        assert!(cache.get(&other, &rec.key).is_none());
    }
}
