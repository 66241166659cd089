//! [`AnyStore`]: one `Store` over the backend a URL chose.

use std::time::Duration;

use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, ListRecords, Listing, MemoryStore, Record,
    RecordFilter, Resolution, Scope, Store, StoreError, StoredResponse, Timestamp,
};
use idem_store_postgres::PgStore;
use idem_store_redis::RedisStore;
use idem_store_sqlite::SqliteStore;

/// A store chosen by URL (see [`crate::StoreUrl::open`]). The libraries stay generic over
/// `Store`, which monomorphises per backend; a program that learns the backend only at run
/// time holds this enum instead, and each call is one `match` away from the backend's own.
///
/// The variants are public so that a caller can reach what only one backend has (the
/// PostgreSQL schema, the Redis key prefix); the accessors below cover what callers need
/// without matching.
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// `memory:`.
    Memory(MemoryStore),
    /// `sqlite:PATH`.
    Sqlite(SqliteStore),
    /// `postgres://...`.
    Postgres(PgStore),
    /// `redis://...`.
    Redis(RedisStore),
}

impl AnyStore {
    /// What in the server's configuration makes claims less than durable or lets records be
    /// evicted (and so a key run twice), read when the store connected. Redis and PostgreSQL
    /// have such settings to read, and a server that falls short is refused unless its URL
    /// says `durability=volatile`; so this is empty for the other stores, when all is well,
    /// and non-empty only for a server opened with that opt-in. `idem migrate` prints these so an
    /// operator sees them before any gateway trusts the store.
    pub fn durability_warnings(&self) -> &[String] {
        match self {
            AnyStore::Redis(r) => r.durability_warnings(),
            AnyStore::Postgres(p) => p.durability_warnings(),
            AnyStore::Memory(_) | AnyStore::Sqlite(_) => &[],
        }
    }

    /// Stops the store now, for every handle on it, when its process is about to exit while
    /// handles remain: a SQLite store commits what is queued and closes its file, leaving no
    /// WAL beside it ([`SqliteStore::close`]); later calls fail closed. The other stores keep
    /// nothing on this side that their server does not already have: nothing to do.
    pub fn close(&self) {
        if let AnyStore::Sqlite(s) = self {
            s.close();
        }
    }
}

/// Calls the backend's own method. The memory store's futures are a few words and stay
/// inline; the others' are boxed, since an enum's future is as large as its largest variant's,
/// and the engine's futures hold several of these: inline, a PostgreSQL or Redis call's state
/// (kilobytes of driver futures) would be copied with every request on every backend
/// (docs/benchmarks.md, "Issue 16, second pass"). One allocation is nothing beside a round trip
/// to a database.
macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call.await,
            AnyStore::Sqlite($s) => Box::pin($call).await,
            AnyStore::Postgres($s) => Box::pin($call).await,
            AnyStore::Redis($s) => Box::pin($call).await,
        }
    };
}

impl Store for AnyStore {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        dispatch!(self, s => s.claim(req))
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        dispatch!(self, s => s.complete(scope, key, token, response))
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.release(scope, key, token))
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        dispatch!(self, s => s.extend(scope, key, token, lease))
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        dispatch!(self, s => s.get(scope, key))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        dispatch!(self, s => s.purge_expired(limit))
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        dispatch!(self, s => s.resolve(scope, key, resolution))
    }

    async fn for_this_runtime(&self) -> Result<Self, StoreError> {
        match self {
            AnyStore::Redis(s) => Ok(AnyStore::Redis(s.for_this_runtime().await?)),
            AnyStore::Postgres(s) => Ok(AnyStore::Postgres(s.for_this_runtime().await?)),
            AnyStore::Memory(_) | AnyStore::Sqlite(_) => Ok(self.clone()),
        }
    }
}

impl ListRecords for AnyStore {
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        dispatch!(self, s => s.list(filter))
    }
}
