//! The Store contract: an atomic, durable, fenced claim of an idempotency key.
//!
//! Everything in idem stands on [`Store::claim`]. Every backend (memory, SQLite, PostgreSQL,
//! Redis) implements this one trait and passes one conformance suite (`idem-conformance`),
//! so the HTTP layer, the gateway and the MCP proxy are written once against it.
//!
//! The decisions themselves (what a claim of an in-flight record answers, when a token is
//! stale) live in [`crate::machine`]; a backend's job is to apply them atomically.
//!
//! # Cancel safety
//! A claim whose future is dropped may still have been applied. A backend that can tell its
//! caller is gone before answering (the SQLite writer can) releases the lease it just granted,
//! since nobody will execute; otherwise the record stays in flight until its lease ends and
//! then reads as abandoned, which is safe (nothing executes twice) but needs `idem resolve`.

pub mod columns;
mod error;
pub mod list;
mod metered;

use std::future::Future;
use std::time::Duration;

pub use error::{BoxError, Stale, StoreError};
pub use list::{ListRecords, Listed, Listing, RecordFilter};
pub use metered::MeteredStore;

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{FencingToken, Record, StoredResponse};
use crate::scope::Scope;

/// Default retention of completed records ([design §2](docs/design.md#2-the-records-life)).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// What to do with a claim of an abandoned record: what an unknown outcome gets
/// ([design §5](docs/design.md#5-unknown-outcomes)). Configuration files write it `on_unknown =
/// "reject"` or `"retry"`; every file refuses other words with the same message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum AbandonedPolicy {
    /// Answer [`Claim::Abandoned`] until an operator resolves the record.
    #[default]
    Reject,
    /// Take the lease over (a new token, `attempts + 1`) and execute again.
    Retry,
}

impl std::str::FromStr for AbandonedPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reject" => Ok(AbandonedPolicy::Reject),
            "retry" => Ok(AbandonedPolicy::Retry),
            other => Err(format!(
                "an unknown outcome gets \"reject\" or \"retry\", not {other:?}"
            )),
        }
    }
}

impl TryFrom<String> for AbandonedPolicy {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A request to claim (scope, key) for one execution.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Whose key.
    pub scope: Scope,
    /// The key.
    pub key: Key,
    /// The request the key names now.
    pub fingerprint: Fingerprint,
    /// How long the lease lasts unless extended.
    pub lease: Duration,
    /// How long the completed record is kept.
    pub retention: Duration,
    /// What a claim of an abandoned record does.
    pub on_abandoned: AbandonedPolicy,
}

/// The lease an executor holds after [`Claim::Acquired`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Present it to `complete`, `release` and `extend`.
    pub token: FencingToken,
    /// When the lease ends unless extended.
    pub expires_at: Timestamp,
    /// 1 for the first execution, more after takeovers of abandoned records.
    pub attempt: u32,
}

/// The answer to a claim ([design §3](docs/design.md#3-what-a-request-with-a-key-gets), at the
/// store level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was absent (or expired, or abandoned under [`AbandonedPolicy::Retry`]): execute.
    Acquired(Lease),
    /// A result is stored for the same fingerprint: replay it. The record's `replays` already
    /// counts this replay.
    Completed(Record),
    /// Another executor holds the lease for the same fingerprint.
    InFlight(Record),
    /// A lease ended without a result for the same fingerprint: the outcome is unknown.
    Abandoned(Record),
    /// The key is held, in any state, for another request.
    Mismatch(Record),
}

/// How an operator settles an abandoned record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The effect surely did not happen: forget the key, so a retry executes.
    Release,
    /// The effect happened with this result: store it, so retries replay it.
    Complete(StoredResponse),
}

/// A backend that keeps idempotency records.
///
/// Every method reads the time from the store's [`crate::Clock`]. A record past its
/// `expires_at` is absent to every method, whether or not the backend has deleted it yet.
pub trait Store: Send + Sync + 'static {
    /// Atomically: insert a fresh in-flight record if (scope, key) is absent or expired, or
    /// answer what is there. Two claims of one key never both acquire. An acquired claim is
    /// durable before this returns, since the side effect runs next.
    fn claim(&self, req: ClaimRequest) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Stores the result and makes the record completed. Refused with [`StoreError::Stale`]
    /// unless `token` is the current lease's; a refused call changes nothing.
    fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> impl Future<Output = Result<Record, StoreError>> + Send;

    /// Deletes the record: the effect surely did not happen. Fenced like `complete`.
    fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Moves the lease's end to `now + lease` (a heartbeat while the effect runs). Fenced like
    /// `complete`. Returns the new end.
    fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send;

    /// The record, or `None` when absent or expired.
    fn get(
        &self,
        scope: &Scope,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Deletes at most `limit` expired records; returns how many. Callers loop while it
    /// returns `limit`, so no single call holds the store for long.
    fn purge_expired(&self, limit: usize)
    -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Settles an abandoned record for an operator. Refused with [`StoreError::NotAbandoned`]
    /// while a lease runs or once completed, and [`StoreError::NotFound`] when absent.
    /// Returns the completed record, or `None` after a release.
    fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// A handle on the same records for callers on the runtime this is awaited on.
    ///
    /// A store whose connection is driven by a task of its own (Redis's multiplexed
    /// connection, PostgreSQL's batchers and their pooled connections) runs that task on the
    /// runtime that opened it, so every call from another runtime crosses threads twice:
    /// there to be written, back to be answered. A caller with a runtime per thread
    /// (`idem serve`'s serving threads) takes one handle per thread, and such a store opens a
    /// connection (or batchers) driven by that thread; records, fencing and clock stay the
    /// store's. Every other store answers a clone. The handle belongs to that runtime:
    /// its calls stall while the runtime is not running, and fail once it has shut down.
    fn for_this_runtime(&self) -> impl Future<Output = Result<Self, StoreError>> + Send
    where
        Self: Sized + Clone,
    {
        std::future::ready(Ok(self.clone()))
    }
}

/// Removes `name=value` from a store URL's query; returns the URL without it and the value.
/// Store URLs carry idem's own parameters (`schema`, `prefix`) beside the driver's, which
/// would refuse them.
pub fn take_url_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((k, v)) if k == name => {
                value = Some(v.to_owned());
                false
            }
            _ => true,
        })
        .collect();
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, value)
}

/// The first of `names` given more than once in a store URL's query. [`take_url_param`]
/// keeps the last, so `?prefix=a&prefix=b` would quietly use `b`: the stores refuse it
/// instead, as they refuse a misspelled name, since either could put one deployment's keys
/// beside another's.
pub fn repeated_url_param<'a>(url: &str, names: &[&'a str]) -> Option<&'a str> {
    let (_, query) = url.split_once('?')?;
    names.iter().copied().find(|name| {
        query
            .split('&')
            .filter(|pair| pair.split_once('=').is_some_and(|(k, _)| k == *name))
            .nth(1)
            .is_some()
    })
}

#[cfg(test)]
mod url_param_tests {
    use super::*;

    #[test]
    fn a_parameter_given_twice_is_found() {
        let names = ["schema", "pooler"];
        assert_eq!(
            repeated_url_param("p://h/d?schema=a&x=1&schema=b", &names),
            Some("schema")
        );
        assert_eq!(
            repeated_url_param("p://h/d?schema=a&pooler=none", &names),
            None
        );
        assert_eq!(
            repeated_url_param("p://h/d?schemas=a&schema=b", &names),
            None
        );
        assert_eq!(repeated_url_param("p://h/d", &names), None);
        assert_eq!(
            take_url_param("p://h/d?schema=a&schema=b", "schema")
                .1
                .as_deref(),
            Some("b")
        );
    }
}
