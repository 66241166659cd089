//! Listing records for an operator: the admin page's "what is there, abandoned first".
//!
//! A capability of its own, beside [`Store`](crate::Store) rather than in it: nothing on a
//! request's path lists, and a backend can answer it with a scan that would be wrong for a
//! claim. Every backend (memory, SQLite, PostgreSQL, Redis, and `AnyStore` over them)
//! implements it and passes the same conformance case.
//!
//! The filter and the order are decided here once ([`RecordFilter::matches`],
//! [`RecordFilter::finish`]); a database backend may push both into its query, but runs its
//! rows through [`RecordFilter::finish`] too, so every backend answers the same list.

use std::cmp::Ordering;
use std::future::Future;

use crate::clock::Timestamp;
use crate::key::Key;
use crate::record::{Record, RecordState};
use crate::scope::Scope;
use crate::store::StoreError;

/// The most records one listing returns, whatever the caller asks.
pub const MAX_LIST: usize = 500;

/// Which records to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    /// Only records in this state (at the store's `now`); every state when `None`.
    pub state: Option<RecordState>,
    /// Only keys starting with this (exact match is a prefix match on the whole key).
    pub key_prefix: String,
    /// Only scopes starting with this.
    pub scope_prefix: String,
    /// At most this many records (clamped to `1..=`[`MAX_LIST`]).
    pub limit: usize,
}

/// What a listing shows of one record: whose, which key, when it was claimed, what its state
/// is read from, and its counts. Never its fingerprint, token or stored response: a response
/// can be megabytes, and a page of [`MAX_LIST`] records must read what the page shows (each
/// at most a 255-byte key and a 128-byte scope), not every body (four pages of 500 records of
/// 1 MB took a gateway from 94 MB to 685 MB when listings read whole records). A record's
/// full story is one [`Store::get`](crate::Store::get) away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Whose key.
    pub scope: Scope,
    /// The key.
    pub key: Key,
    /// When the key was first claimed.
    pub created_at: Timestamp,
    /// When the current lease ends.
    pub lease_expires_at: Timestamp,
    /// When the result was stored.
    pub completed_at: Option<Timestamp>,
    /// When retention ends.
    pub expires_at: Timestamp,
    /// How many times an executor acquired the lease.
    pub attempts: u32,
    /// How many times the store answered a replay.
    pub replays: u32,
}

impl Listed {
    /// The record's state at `now`, as [`Record::state`] reads it.
    pub fn state(&self, now: Timestamp) -> RecordState {
        RecordState::of(self.completed_at, self.lease_expires_at, now)
    }

    /// Whether retention has ended at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }
}

impl From<&Record> for Listed {
    fn from(r: &Record) -> Self {
        Listed {
            scope: r.scope.clone(),
            key: r.key.clone(),
            created_at: r.created_at,
            lease_expires_at: r.lease_expires_at,
            completed_at: r.completed_at,
            expires_at: r.expires_at,
            attempts: r.attempts,
            replays: r.replays,
        }
    }
}

/// What a listing found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The records, abandoned first, then in flight, then completed; newest first within a
    /// state.
    pub records: Vec<Listed>,
    /// More records may match than were returned: the limit cut the list, or the backend
    /// stopped its bounded scan (Redis) before seeing every record.
    pub more: bool,
    /// When the store took the listing: states are as of this time.
    pub now: Timestamp,
}

/// The order a listing is in: abandoned (what needs an operator) before in flight before
/// completed.
pub const fn state_rank(state: RecordState) -> u8 {
    match state {
        RecordState::Abandoned => 0,
        RecordState::InFlight => 1,
        RecordState::Completed => 2,
    }
}

impl RecordFilter {
    /// The limit actually applied.
    pub fn effective_limit(&self) -> usize {
        self.limit.clamp(1, MAX_LIST)
    }

    /// Whether `r` belongs in the listing at `now`; an expired record never does (it is
    /// absent to every reader).
    pub fn matches(&self, r: &Listed, now: Timestamp) -> bool {
        !r.is_expired(now)
            && r.key.as_str().starts_with(&self.key_prefix)
            && r.scope.as_str().starts_with(&self.scope_prefix)
            && self.state.is_none_or(|s| r.state(now) == s)
    }

    /// Filters `candidates`, orders them and cuts them to the limit. `more_beyond` says the
    /// backend already knows it did not look at every record.
    pub fn finish(&self, candidates: Vec<Listed>, now: Timestamp, more_beyond: bool) -> Listing {
        let mut records: Vec<Listed> = candidates
            .into_iter()
            .filter(|r| self.matches(r, now))
            .collect();
        records.sort_by(|a, b| listing_order(a, b, now));
        let limit = self.effective_limit();
        let cut = records.len() > limit;
        records.truncate(limit);
        Listing {
            records,
            more: cut || more_beyond,
            now,
        }
    }
}

/// Abandoned first, then in flight, then completed; newest claim first within a state; then
/// by scope and key (bytewise), so the order is total and the same in every backend.
pub fn listing_order(a: &Listed, b: &Listed, now: Timestamp) -> Ordering {
    state_rank(a.state(now))
        .cmp(&state_rank(b.state(now)))
        .then_with(|| b.created_at.cmp(&a.created_at))
        .then_with(|| a.scope.as_str().cmp(b.scope.as_str()))
        .then_with(|| a.key.as_str().cmp(b.key.as_str()))
}

/// A store that can list its records for an operator.
pub trait ListRecords: Send + Sync + 'static {
    /// The records matching `filter`, in [`listing_order`], at most
    /// [`RecordFilter::effective_limit`] of them. Reads only; never on a request's path.
    fn list(
        &self,
        filter: &RecordFilter,
    ) -> impl Future<Output = Result<Listing, StoreError>> + Send;
}

impl<S: ListRecords> ListRecords for crate::store::MeteredStore<S> {
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        self.get_ref().list(filter).await
    }
}
