//! Store URLs: `memory:`, `sqlite:PATH`, `postgres://...`, `redis://...`. One enum dispatches to the backend chosen at run time,
//! so the libraries stay generic over `Store` and only the binary picks.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, MemoryStore, Record, Resolution, Scope, Store,
    StoreError, StoredResponse, Timestamp,
};
use idem_store_postgres::{PgOptions, PgStore};
use idem_store_redis::{RedisOptions, RedisStore};
use idem_store_sqlite::SqliteStore;

/// The default store: the embedded SQLite file in the working directory.
pub(crate) const DEFAULT_STORE: &str = "sqlite:idem.db";

/// A parsed store URL. `Debug` and `Display` hide passwords.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    Memory,
    Sqlite(PathBuf),
    /// The URL as given (checked when parsed); `?schema=NAME` picks the schema.
    Postgres(String),
    /// The URL as given (checked when parsed); `?prefix=NAME` picks the key prefix.
    Redis(String),
}

const SCHEMES: &str = "memory:, sqlite:PATH, postgres://... or redis://...";

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreUrlError {
    // Neither message repeats the URL: a mistyped scheme or a `key=value` connection string
    // may hold a password.
    #[error("the store URL has no scheme; use {SCHEMES} (e.g. {DEFAULT_STORE})")]
    NoScheme,
    #[error("the store URL has an unknown scheme {0:?}; use {SCHEMES}")]
    UnknownScheme(String),
    #[error("store URL {url}: {err}", url = redact(.0), err = .1)]
    Postgres(String, idem_store_postgres::PgUrlError),
    #[error("store URL {url}: {err}", url = redact(.0), err = .1)]
    Redis(String, idem_store_redis::RedisUrlError),
    #[error("store URL {0:?} names no file; use sqlite:PATH (e.g. {DEFAULT_STORE})")]
    EmptyPath(String),
    #[error("store URL {0:?}: memory: takes no path")]
    MemoryWithPath(String),
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(StoreUrlError::NoScheme);
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
            "postgres" | "postgresql" => match PgOptions::from_url(url) {
                Ok(_) => Ok(StoreUrl::Postgres(url.to_owned())),
                Err(e) => Err(StoreUrlError::Postgres(url.to_owned(), e)),
            },
            "redis" | "rediss" => match RedisOptions::from_url(url) {
                Ok(_) => Ok(StoreUrl::Redis(url.to_owned())),
                Err(e) => Err(StoreUrlError::Redis(url.to_owned(), e)),
            },
            other => Err(StoreUrlError::UnknownScheme(other.to_owned())),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// Parses `--store` for clap without echoing the raw value in errors (clap's own message
/// for a refused value repeats it, password included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreUrlParser;

impl clap::builder::TypedValueParser for StoreUrlParser {
    type Value = StoreUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<StoreUrl, clap::Error> {
        use clap::error::ErrorKind;
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(ErrorKind::InvalidUtf8, "the store URL is not UTF-8\n").with_cmd(cmd)
        })?;
        text.parse().map_err(|e: StoreUrlError| {
            clap::Error::raw(
                ErrorKind::ValueValidation,
                format!("invalid --store: {e}\n"),
            )
            .with_cmd(cmd)
        })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            StoreUrl::Postgres(url) | StoreUrl::Redis(url) => f.write_str(&redact(url)),
        }
    }
}

impl StoreUrl {
    /// Opens the store. For SQLite the file is created if absent, unless `must_exist`: an
    /// operator command pointed at a mistyped path should say so, not create an empty store.
    pub(crate) async fn open(&self, must_exist: bool) -> Result<AnyStore, StoreError> {
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
            StoreUrl::Postgres(url) => Ok(AnyStore::Postgres(PgStore::connect_url(url).await?)),
            StoreUrl::Redis(url) => Ok(AnyStore::Redis(RedisStore::connect_url(url).await?)),
        }
    }
}

/// A store chosen by URL.
#[derive(Debug, Clone)]
pub(crate) enum AnyStore {
    Memory(MemoryStore),
    Sqlite(SqliteStore),
    Postgres(PgStore),
    Redis(RedisStore),
}

/// The URL with any password replaced, for messages and logs: in the user part and in a
/// `password=` query parameter.
fn redact(url: &str) -> String {
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => url.to_owned(),
    };
    let url = url.as_str();
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call.await,
            AnyStore::Sqlite($s) => $call.await,
            AnyStore::Postgres($s) => $call.await,
            AnyStore::Redis($s) => $call.await,
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
        let pg = "postgres://idem:pw@db:5432/app?schema=idem_gw";
        assert_eq!(ok(pg), Ok(StoreUrl::Postgres(pg.into())));
        let redis = "redis://127.0.0.1:6379/1?prefix=gw";
        assert_eq!(ok(redis), Ok(StoreUrl::Redis(redis.into())));
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
        for secret in [
            "postgress://idem:s3cret@db/app",
            "host=db user=idem password=s3cret",
            "postgres://idem@db/app?password=s3cret&schema=Bad",
            "postgres://idem:s3cret@db/app?schema=Bad",
        ] {
            assert!(!err(secret).contains("s3cret"), "{}", err(secret));
        }
        assert!(err("sqlite:").contains("names no file"));
        assert!(err("memory:x").contains("takes no path"));
        assert!(err("postgres://h/db?schema=Bad").contains("plain identifier"));
        assert!(err("redis://h?prefix=a:b").contains("prefix"));
    }

    #[test]
    fn passwords_never_show() {
        let url: StoreUrl = "postgres://idem:s3cret@db:5432/app"
            .parse()
            .expect("parses");
        assert_eq!(url.to_string(), "postgres://idem:***@db:5432/app");
        let err = "redis://u:s3cret@h/?prefix=a:b"
            .parse::<StoreUrl>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!err.contains("s3cret"), "{err}");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        let url: StoreUrl = "postgres://idem@db/app?password=s3cret"
            .parse()
            .expect("parses");
        assert_eq!(
            format!("{url:?}"),
            "StoreUrl(postgres://idem@db/app?password=***)"
        );
    }
}
