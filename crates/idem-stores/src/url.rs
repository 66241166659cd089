//! Store URLs: parsing, redaction and opening.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use idem_core::{MemoryStore, StoreError};
use idem_store_postgres::{PgOptions, PgStore};
use idem_store_redis::{RedisOptions, RedisStore};
use idem_store_sqlite::{SqliteOptions, SqliteStore};

use crate::AnyStore;

/// The store used when none is named: the embedded SQLite file in the working directory.
/// Defined here once so that `idem serve`, the operator commands and the bindings all fall
/// back to the same file, and so a gateway and `idem inspect` run side by side meet.
pub const DEFAULT_STORE: &str = "sqlite:idem.db";

/// A parsed store URL. `Debug` and `Display` hide passwords, so it can be logged and put in
/// messages as it is.
///
/// Build one with [`str::parse`]: the PostgreSQL and Redis forms are checked then (their
/// `schema=` and `prefix=` parameters included), so a mistake is reported before anything
/// connects. The variants are public for matching; one built by hand is checked only when
/// it is opened.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`: a store in this process that is gone when it exits.
    Memory,
    /// `sqlite:PATH`, `sqlite://PATH` (relative) or `sqlite:///abs/path`, optionally with
    /// `?timeout=DURATION` (`2s`, `500ms`): the bound on each operation and on a lock wait
    /// (default [`idem_store_sqlite::DEFAULT_TIMEOUT`]).
    Sqlite {
        /// The file.
        path: PathBuf,
        /// `timeout=`, if given.
        timeout: Option<Duration>,
    },
    /// The URL as given (checked when parsed); `?schema=NAME` picks the schema.
    Postgres(String),
    /// The URL as given (checked when parsed); `?prefix=NAME` picks the key prefix.
    Redis(String),
}

const SCHEMES: &str =
    "memory:, sqlite:PATH, postgres://..., redis://... or redis+cluster://HOST:PORT,HOST:PORT/...";

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    // Neither message repeats the URL: a mistyped scheme or a `key=value` connection string
    // may hold a password.
    /// There is no `scheme:` at all (a bare path, say).
    #[error("the store URL has no scheme; use {SCHEMES} (e.g. {DEFAULT_STORE})")]
    NoScheme,
    /// The scheme is none of idem's (only the scheme is kept).
    #[error("the store URL has an unknown scheme {0:?}; use {SCHEMES}")]
    UnknownScheme(String),
    /// The PostgreSQL URL or its `schema=` was refused. Shown redacted.
    #[error("store URL {url}: {err}", url = redact(.0), err = .1)]
    Postgres(String, idem_store_postgres::PgUrlError),
    /// The Redis URL or its `prefix=` was refused. Shown redacted.
    #[error("store URL {url}: {err}", url = redact(.0), err = .1)]
    Redis(String, idem_store_redis::RedisUrlError),
    /// `sqlite:` with no path.
    #[error("store URL {0:?} names no file; use sqlite:PATH (e.g. {DEFAULT_STORE})")]
    EmptyPath(String),
    /// `memory:` followed by something.
    #[error("store URL {0:?}: memory: takes no path")]
    MemoryWithPath(String),
    /// A `sqlite:` option idem does not know, or a bad value.
    #[error("store URL {0:?}: {1}")]
    SqliteOption(String, String),
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
                let (target, query) = match rest.split_once('?') {
                    Some((target, query)) => (target, query),
                    None => (rest, ""),
                };
                // Accept sqlite:PATH, sqlite://PATH (relative) and sqlite:///abs/path.
                let path = target.strip_prefix("//").unwrap_or(target);
                if path.is_empty() {
                    return Err(StoreUrlError::EmptyPath(url.to_owned()));
                }
                let mut timeout = None;
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let bad = |why: String| StoreUrlError::SqliteOption(url.to_owned(), why);
                    match pair.split_once('=') {
                        Some(("timeout", v)) => match humantime::parse_duration(v) {
                            // Whole milliseconds at least: the busy timeout SQLite takes is in
                            // milliseconds, and 500us would silently become no wait at all.
                            Ok(d) if d >= Duration::from_millis(1) => timeout = Some(d),
                            _ => {
                                return Err(bad(format!(
                                    "timeout={v} is not a duration of at least 1ms, like 2s or 500ms"
                                )));
                            }
                        },
                        _ => {
                            return Err(bad(format!(
                                "unknown option {pair:?}; sqlite: takes timeout=DURATION"
                            )));
                        }
                    }
                }
                Ok(StoreUrl::Sqlite {
                    path: PathBuf::from(path),
                    timeout,
                })
            }
            "postgres" | "postgresql" => match PgOptions::from_url(url) {
                Ok(_) => Ok(StoreUrl::Postgres(url.to_owned())),
                Err(e) => Err(StoreUrlError::Postgres(url.to_owned(), e)),
            },
            "redis" | "rediss" | idem_store_redis::CLUSTER_SCHEME => {
                match RedisOptions::from_url(url) {
                    Ok(_) => Ok(StoreUrl::Redis(url.to_owned())),
                    Err(e) => Err(StoreUrlError::Redis(url.to_owned(), e)),
                }
            }
            other => Err(StoreUrlError::UnknownScheme(other.to_owned())),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite { path, timeout } => {
                write!(f, "sqlite:{}", path.display())?;
                match timeout {
                    Some(t) if t.subsec_nanos() == 0 => write!(f, "?timeout={}s", t.as_secs()),
                    Some(t) => write!(f, "?timeout={}ms", t.as_millis()),
                    None => Ok(()),
                }
            }
            StoreUrl::Postgres(url) | StoreUrl::Redis(url) => f.write_str(&redact(url)),
        }
    }
}

/// [`StoreUrl::open_existing`] was pointed at a SQLite file that is not there. It reaches the
/// caller inside [`StoreError::Unavailable`], so a front end can recognise it (with
/// `downcast_ref`) and say which of its own flags to check.
#[derive(Debug, thiserror::Error)]
#[error("no store file at {}", .0.display())]
pub struct NoStoreFile(pub PathBuf);

impl StoreUrl {
    /// Opens the store, creating what it needs: the SQLite file if absent, the PostgreSQL
    /// schema if absent. A schema a newer idem wrote is refused. What serving commands use.
    pub async fn open(&self) -> Result<AnyStore, StoreError> {
        self.open_with(false).await
    }

    /// Opens a store that must already exist: for SQLite, an absent file is refused with
    /// [`NoStoreFile`] and not created, and for PostgreSQL an absent schema with
    /// [`crate::postgres::NoSchema`], since an operator command (`idem inspect`, `resolve`,
    /// `gc`) pointed at a mistyped path or `schema=` should say so, not answer "no record"
    /// from an empty store it just made. Redis opens as with [`StoreUrl::open`]: its keys
    /// are made by the writes themselves, so a mistyped prefix creates nothing.
    pub async fn open_existing(&self) -> Result<AnyStore, StoreError> {
        self.open_with(true).await
    }

    async fn open_with(&self, must_exist: bool) -> Result<AnyStore, StoreError> {
        match self {
            StoreUrl::Memory => Ok(AnyStore::Memory(MemoryStore::new())),
            StoreUrl::Sqlite { path, timeout } => {
                if must_exist && !path.exists() {
                    return Err(StoreError::unavailable(NoStoreFile(path.clone())));
                }
                let options = timeout.map(SqliteOptions::with_timeout).unwrap_or_default();
                Ok(AnyStore::Sqlite(SqliteStore::open_with(path, options)?))
            }
            StoreUrl::Postgres(url) if must_exist => Ok(AnyStore::Postgres(
                PgStore::connect_existing_url(url).await?,
            )),
            StoreUrl::Postgres(url) => Ok(AnyStore::Postgres(PgStore::connect_url(url).await?)),
            StoreUrl::Redis(url) => Ok(AnyStore::Redis(RedisStore::connect_url(url).await?)),
        }
    }
}

/// The URL with any password replaced by `***`, for messages and logs: in the user part and
/// in a `password=` query parameter. For text that may not even parse as a store URL; a
/// parsed [`StoreUrl`] already displays this way.
pub fn redact(url: &str) -> String {
    // The user part first, whatever it holds: a password may contain `/`, `?` or `:`, and a
    // mistyped URL may have one slash or none. Everything between the scheme and the last
    // `@` is user information; what follows its first `:` is masked. Masking too much (an
    // `@` in a query value) is the safe mistake.
    let url = match (url.split_once(':'), url.rfind('@')) {
        (Some((scheme, rest)), Some(at)) if scheme.len() < at => {
            let slashes = rest.len() - rest.trim_start_matches('/').len();
            let start = scheme.len() + 1 + slashes;
            let userinfo = url.get(start..at).unwrap_or("");
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..start], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    };
    match url.split_once('?') {
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
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let ok = |s: &str| s.parse::<StoreUrl>().map_err(|e| e.to_string());
        assert_eq!(ok("memory:"), Ok(StoreUrl::Memory));
        let sqlite = |path: &str| StoreUrl::Sqlite {
            path: path.into(),
            timeout: None,
        };
        assert_eq!(ok("sqlite:idem.db"), Ok(sqlite("idem.db")));
        assert_eq!(ok("sqlite://rel/x.db"), Ok(sqlite("rel/x.db")));
        assert_eq!(ok("sqlite:///abs/x.db"), Ok(sqlite("/abs/x.db")));
        assert_eq!(ok("SQLITE:a.db"), Ok(sqlite("a.db")));
        let timed = StoreUrl::Sqlite {
            path: "/abs/x.db".into(),
            timeout: Some(Duration::from_millis(2500)),
        };
        assert_eq!(ok("sqlite:///abs/x.db?timeout=2s500ms"), Ok(timed.clone()));
        assert_eq!(timed.to_string(), "sqlite:/abs/x.db?timeout=2500ms");
        assert_eq!(ok(&timed.to_string()), Ok(timed));
        let pg = "postgres://idem:pw@db:5432/app?schema=idem_gw";
        assert_eq!(ok(pg), Ok(StoreUrl::Postgres(pg.into())));
        let pg = "postgres://idem@db1:5432,db2:5432/app?schema=idem_gw&pooler=transaction\
                  &durability=volatile&pool_size=32&target_session_attrs=read-write";
        assert_eq!(ok(pg), Ok(StoreUrl::Postgres(pg.into())));
        assert!(
            "postgres://db/app?pooler=statement"
                .parse::<StoreUrl>()
                .is_err()
        );
        let redis = "redis://127.0.0.1:6379/1?prefix=gw";
        assert_eq!(ok(redis), Ok(StoreUrl::Redis(redis.into())));
        let cluster = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000/?prefix=gw";
        assert_eq!(ok(cluster), Ok(StoreUrl::Redis(cluster.into())));
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
        assert!(err("redis+cluster://h:7000/2").contains("only database 0"));
        for secret in [
            "postgress://idem:s3cret@db/app",
            "host=db user=idem password=s3cret",
            "postgres://idem@db/app?password=s3cret&schema=Bad",
            "postgres://idem:s3cret@db/app?schema=Bad",
            "postgres://idem:s3cret@db/app?schem=other",
            "redis://u:s3cret@h/?prefx=other",
            "redis://default:2024?s3cret@127.0.0.1:6379/?prefix=a",
            "postgres://u:p@s3cret?k=v@127.0.0.1:5432/test",
        ] {
            assert!(!err(secret).contains("s3cret"), "{}", err(secret));
        }
        assert!(err("sqlite:").contains("names no file"));
        assert!(err("sqlite:a.db?timeout=soon").contains("not a duration of at least 1ms"));
        assert!(err("sqlite:a.db?timeout=500us").contains("not a duration of at least 1ms"));
        assert!(err("sqlite:a.db?timeout=0s").contains("not a duration of at least 1ms"));
        assert!(err("sqlite:a.db?mode=ro").contains("unknown option \"mode=ro\""));
        assert!(err("memory:x").contains("takes no path"));
        assert!(err("postgres://h/db?schema=Bad").contains("plain identifier"));
        assert!(err("postgres://h/db?pool_size=0").contains("pool_size=0 is not a whole number"));
        assert!(err("redis://h?prefix=a:b").contains("prefix"));
        assert!(
            err("redis://h/?prefx=b")
                .contains("unknown option \"prefx\"; idem's Redis URLs take prefix=")
        );
        assert!(
            err("postgres://h/db?schem=b").contains("unknown option `schem`; idem takes schema=")
        );
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
        // Passwords holding URL delimiters, and schemes written with one slash or none.
        for (url, shown) in [
            (
                "postgres://idem:s3?cret@db/app",
                "postgres://idem:***@db/app",
            ),
            (
                "postgres://idem:s3/cret@db/app",
                "postgres://idem:***@db/app",
            ),
            ("postgres:/idem:s3cret@db/app", "postgres:/idem:***@db/app"),
            ("postgresql:idem:s3cret@db", "postgresql:idem:***@db"),
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            (
                "redis+cluster://u:s3cret@h1:7000,h2:7000/",
                "redis+cluster://u:***@h1:7000,h2:7000/",
            ),
        ] {
            assert_eq!(redact(url), shown);
            let err = url.parse::<StoreUrl>().err().map(|e| e.to_string());
            let shown_parsed = url.parse::<StoreUrl>().map(|u| format!("{u} {u:?}"));
            for text in [err.unwrap_or_default(), shown_parsed.unwrap_or_default()] {
                assert!(!text.contains("s3"), "{url}: {text}");
            }
        }
        let url: StoreUrl = "postgres://idem@db/app?password=s3cret"
            .parse()
            .expect("parses");
        assert_eq!(
            format!("{url:?}"),
            "StoreUrl(postgres://idem@db/app?password=***)"
        );
    }
}
