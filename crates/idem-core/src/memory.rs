//! The in-memory store: for tests, and for one process that can afford to forget its keys on
//! restart.
//!
//! Records live in shards, each a mutex over a map plus an index by expiry, so unrelated keys
//! rarely contend and `purge_expired` touches only what is due instead of scanning everything.
//! Every transition is decided by [`crate::machine`] while the shard's lock is held, which is
//! what makes `claim` atomic here.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::key::Key;
use crate::machine::{self, Write};
use crate::record::{FencingToken, Record, StoredResponse};
use crate::scope::Scope;
use crate::store::{
    Claim, ClaimRequest, ListRecords, Listed, Listing, RecordFilter, Resolution, Store, StoreError,
};

const SHARDS: usize = 32;

type Id = (Scope, Key);

/// The maps' hasher (here and in the completed-record cache): keyed at random per process, as
/// std's is (a client chooses the keys), at a fraction of SipHash's cost on a scope and a key.
pub(crate) type Hashing = ahash::RandomState;

#[derive(Default)]
struct Shard {
    records: HashMap<Id, Record, Hashing>,
    /// (expires_at, id) for every record, kept in step with `records`.
    by_expiry: BTreeSet<(Timestamp, Id)>,
}

impl Shard {
    /// Inserts or replaces `rec`, hashing its id once and touching the expiry index only when
    /// the expiry moves (a lease extension leaves it at never).
    fn put(&mut self, rec: Record) {
        match self.records.entry((rec.scope.clone(), rec.key.clone())) {
            Entry::Occupied(mut held) => {
                let old = held.get().expires_at;
                if old != rec.expires_at {
                    let id = held.key().clone();
                    self.by_expiry.remove(&(old, id.clone()));
                    self.by_expiry.insert((rec.expires_at, id));
                }
                held.insert(rec);
            }
            Entry::Vacant(slot) => {
                self.by_expiry.insert((rec.expires_at, slot.key().clone()));
                slot.insert(rec);
            }
        }
    }

    fn delete(&mut self, id: &Id) {
        if let Some(old) = self.records.remove(id) {
            self.by_expiry.remove(&(old.expires_at, id.clone()));
        }
    }
}

/// A sharded in-memory [`Store`]. Cloning shares the same records.
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>]>,
    /// Picks a record's shard; seeded apart from the shards' own maps.
    spread: Hashing,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let shards: Vec<Mutex<Shard>> = (0..SHARDS).map(|_| Mutex::default()).collect();
        MemoryStore {
            shards: shards.into(),
            spread: Hashing::new(),
            clock,
        }
    }

    fn shard(&self, scope: &Scope, key: &Key) -> MutexGuard<'_, Shard> {
        let i = (self.spread.hash_one((scope, key)) as usize) % self.shards.len();
        // A panic while holding a shard cannot leave a record half-written: every write is
        // one map insert or remove after the decision was made. So a poisoned lock is usable.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a fenced transition under the shard lock.
    fn fenced<T>(
        &self,
        scope: &Scope,
        key: &Key,
        decide: impl FnOnce(Option<&Record>, Timestamp) -> Result<(T, Write), StoreError>,
    ) -> Result<T, StoreError> {
        let id = (scope.clone(), key.clone());
        let mut shard = self.shard(scope, key);
        let now = self.clock.now();
        let (out, write) = decide(shard.records.get(&id), now)?;
        match write {
            Write::Nothing => {}
            Write::Put(rec) => shard.put(rec),
            Write::CountReplay => {
                if let Some(r) = shard.records.get_mut(&id) {
                    r.replays = r.replays.saturating_add(1);
                }
            }
            Write::Delete => shard.delete(&id),
        }
        Ok(out)
    }

    /// How many records are held, expired or not (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).records.len())
            .sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Store for MemoryStore {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        self.fenced(&req.scope, &req.key, |existing, now| {
            Ok(machine::claim(existing, &req, now, FencingToken::random()))
        })
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        self.fenced(scope, key, |existing, now| {
            let rec = machine::complete(existing, token, response, now)?;
            Ok((rec.clone(), Write::Put(rec)))
        })
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        self.fenced(scope, key, |existing, now| {
            machine::release(existing, token, now).map(|()| ((), Write::Delete))
        })
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        self.fenced(scope, key, |existing, now| {
            let rec = machine::extend(existing, token, lease, now)?;
            Ok((rec.lease_expires_at, Write::Put(rec)))
        })
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        let id = (scope.clone(), key.clone());
        let shard = self.shard(scope, key);
        Ok(machine::read(
            shard.records.get(&id).cloned(),
            self.clock.now(),
        ))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut purged = 0;
        for shard in self.shards.iter() {
            if purged >= limit {
                break;
            }
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let now = self.clock.now();
            while purged < limit {
                let Some((expires_at, id)) = shard.by_expiry.first().cloned() else {
                    break;
                };
                if expires_at > now {
                    break;
                }
                shard.delete(&id);
                purged += 1;
            }
        }
        Ok(purged)
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        self.fenced(scope, key, |existing, now| {
            machine::resolve(existing, resolution, now)
        })
    }
}

impl ListRecords for MemoryStore {
    /// Looks at every record, one shard lock at a time: the store is in memory, so that is
    /// bounded by what the process holds.
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        let now = self.clock.now();
        let mut found = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            // The listed fields only: no stored body is copied.
            found.extend(
                shard
                    .records
                    .values()
                    .map(Listed::from)
                    .filter(|r| filter.matches(r, now)),
            );
        }
        Ok(filter.finish(found, now, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AbandonedPolicy;
    use crate::clock::ManualClock;
    use crate::fingerprint::Fingerprint;

    fn ok<T>(r: Result<T, StoreError>) -> T {
        r.unwrap_or_else(|e| panic!("{e}"))
    }

    /// The expiry index holds exactly one entry per record, at the record's expiry.
    fn assert_index_in_step(store: &MemoryStore) {
        for shard in store.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let expected: BTreeSet<(Timestamp, Id)> = shard
                .records
                .iter()
                .map(|(id, r)| (r.expires_at, id.clone()))
                .collect();
            assert_eq!(shard.by_expiry, expected);
        }
    }

    #[tokio::test]
    async fn the_expiry_index_follows_every_transition() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        let store = MemoryStore::with_clock(clock.clone());
        let scope = Scope::anonymous();
        let request = |key: &str| ClaimRequest {
            scope: scope.clone(),
            key: Key::new(key).unwrap_or_else(|e| panic!("{e}")),
            fingerprint: Fingerprint::from_bytes([7; 32]),
            lease: Duration::from_secs(10),
            retention: Duration::from_secs(60),
            on_abandoned: AbandonedPolicy::Retry,
        };
        let lease = |claim: Claim| match claim {
            Claim::Acquired(lease) => lease,
            other => panic!("not acquired: {other:?}"),
        };
        for i in 0..20 {
            let req = request(&format!("key-{i}"));
            let key = req.key.clone();
            let held = lease(ok(store.claim(req.clone()).await));
            assert_index_in_step(&store);
            ok(store
                .extend(&scope, &key, held.token, Duration::from_secs(20))
                .await);
            assert_index_in_step(&store);
            match i % 3 {
                0 => {
                    ok(store
                        .complete(&scope, &key, held.token, StoredResponse::new(201, "ok"))
                        .await);
                }
                1 => ok(store.release(&scope, &key, held.token).await),
                // Left in flight, to be taken over once abandoned, then completed.
                _ => {
                    clock.advance(Duration::from_secs(30));
                    let again = lease(ok(store.claim(req).await));
                    assert_index_in_step(&store);
                    ok(store
                        .complete(&scope, &key, again.token, StoredResponse::new(201, "ok"))
                        .await);
                }
            }
            assert_index_in_step(&store);
        }
        clock.advance(Duration::from_secs(3_600));
        let purged = ok(store.purge_expired(1_000).await);
        assert_eq!(
            purged, 13,
            "the completed records (two in three), every one expired"
        );
        assert_index_in_step(&store);
        assert!(store.is_empty());
    }
}
