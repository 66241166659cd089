//! Store URLs: `memory:`, `sqlite:PATH`. One enum dispatches to the backend chosen at run time,
//! so the libraries stay generic over `Store` and only the binary picks.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, MemoryStore, Record, Resolution, Scope, Store,
    StoreError, StoredResponse, Timestamp,
};
use idem_store_sqlite::SqliteStore;

/// The default store: the embedded SQLite file in the working directory.
pub(crate) const DEFAULT_STORE: &str = "sqlite:idem.db";

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    Memory,
    Sqlite(PathBuf),
}

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreUrlError {
    #[error("store URL {0:?} has no scheme; use memory: or sqlite:PATH (e.g. {DEFAULT_STORE})")]
    NoScheme(String),
    #[error("store URL {0:?} has an unknown scheme {1:?}; use memory: or sqlite:PATH")]
    UnknownScheme(String, String),
    #[error("store URL {0:?} names no file; use sqlite:PATH (e.g. {DEFAULT_STORE})")]
    EmptyPath(String),
    #[error("store URL {0:?}: memory: takes no path")]
    MemoryWithPath(String),
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(StoreUrlError::NoScheme(url.to_owned()));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "memory" if rest.is_empty() => Ok(StoreUrl::Memory),
            "memory" => Err(StoreUrlError::MemoryWithPath(url.to_owned())),
            "sqlite" => {
                // Accept sqlite:PATH, sqlite://PATH (relative) and sqlite:///abs/path.
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    Err(StoreUrlError::EmptyPath(url.to_owned()))
                } else {
                    Ok(StoreUrl::Sqlite(PathBuf::from(path)))
                }
            }
            other => Err(StoreUrlError::UnknownScheme(
                url.to_owned(),
                other.to_owned(),
            )),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
        }
    }
}

impl StoreUrl {
    /// Opens the store. For SQLite the file is created if absent, unless `must_exist`: an
    /// operator command pointed at a mistyped path should say so, not create an empty store.
    pub(crate) fn open(&self, must_exist: bool) -> Result<AnyStore, StoreError> {
        match self {
            StoreUrl::Memory => Ok(AnyStore::Memory(MemoryStore::new())),
            StoreUrl::Sqlite(path) => {
                if must_exist && !path.exists() {
                    return Err(StoreError::Unavailable(
                        format!("no store file at {} (check --store)", path.display()).into(),
                    ));
                }
                Ok(AnyStore::Sqlite(SqliteStore::open(path)?))
            }
        }
    }
}

/// A store chosen by URL.
#[derive(Debug, Clone)]
pub(crate) enum AnyStore {
    Memory(MemoryStore),
    Sqlite(SqliteStore),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call.await,
            AnyStore::Sqlite($s) => $call.await,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let ok = |s: &str| s.parse::<StoreUrl>().map_err(|e| e.to_string());
        assert_eq!(ok("memory:"), Ok(StoreUrl::Memory));
        assert_eq!(ok("sqlite:idem.db"), Ok(StoreUrl::Sqlite("idem.db".into())));
        assert_eq!(
            ok("sqlite://rel/x.db"),
            Ok(StoreUrl::Sqlite("rel/x.db".into()))
        );
        assert_eq!(
            ok("sqlite:///abs/x.db"),
            Ok(StoreUrl::Sqlite("/abs/x.db".into()))
        );
        assert_eq!(ok("SQLITE:a.db"), Ok(StoreUrl::Sqlite("a.db".into())));
    }

    #[test]
    fn refusals_say_what_to_write() {
        let err = |s: &str| {
            s.parse::<StoreUrl>()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("idem.db").contains("no scheme"));
        assert!(err("mysql://x").contains("unknown scheme \"mysql\""));
        assert!(err("sqlite:").contains("names no file"));
        assert!(err("memory:x").contains("takes no path"));
    }
}
