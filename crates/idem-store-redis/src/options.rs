//! Where the server is, and the few choices a deployment makes.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Clock;

/// The key prefix used unless the URL names another.
pub const DEFAULT_PREFIX: &str = "idem";

/// The deployment a store talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Server {
    /// One server (which may have replicas), as the redis crate reads its URL.
    Single(String),
    /// A Redis Cluster: the URLs of the nodes to learn its topology from (any reachable one
    /// is enough; the client asks it for the rest).
    Cluster(Vec<String>),
}

/// How to open a [`crate::RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The server or cluster, without idem's own parameters.
    pub server: Server,
    /// Every key idem writes starts with `PREFIX:`. Each test uses its own.
    pub prefix: String,
    /// Where time comes from. `None` (the default) reads Redis's clock inside each script.
    pub clock: Option<Arc<dyn Clock>>,
    /// The bound on any one operation: past it the store is unavailable and the request
    /// fails closed, rather than hang on a dead server.
    pub op_timeout: Duration,
    /// Whether a server that can lose a claim is refused (the default) or accepted.
    pub durability: Durability,
}

/// What [`crate::RedisStore::connect`] does with a server whose configuration can lose an
/// acknowledged claim or evict a record before its retention ends (and so let a retry run
/// again): [design §6](docs/design.md#6-a-store-failure-fails-closed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Refuse it, naming the settings to change: the server must run with `appendonly yes`,
    /// `appendfsync always` and no eviction (`maxmemory 0` or `maxmemory-policy
    /// noeviction`), and let idem read these with `CONFIG GET`. The default;
    /// `durability=required` in the URL says so explicitly.
    #[default]
    Required,
    /// `durability=volatile`: the operator accepts that a crash or an eviction may lose
    /// claims; each shortfall is logged as a warning and the store runs.
    Volatile,
}

/// Why a Redis URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum RedisUrlError {
    /// The redis crate refused the URL.
    #[error("{0}")]
    Url(#[from] redis::RedisError),
    /// The prefix holds characters that would make keys hard to read or match.
    #[error("prefix {0:?} must be 1 to 64 of A-Z a-z 0-9 _ - .")]
    Prefix(String),
    /// `durability=` is neither `required` nor `volatile`.
    #[error("durability={0} is not required or volatile")]
    Durability(String),
    /// A query parameter neither idem nor the redis crate reads. The redis crate ignores
    /// what it does not know, so a misspelled `prefix=` would otherwise put this deployment's
    /// keys in the default prefix, beside another's. Empty when the parameter has no name.
    #[error("unknown option {0:?}; idem's Redis URLs take prefix=, durability= and protocol=")]
    UnknownOption(String),
    /// An `@` after the host's end: most likely a user name or password holding a raw `/`,
    /// `?` or `#`, which ends the host part early (no parameter takes an `@`). Refused before
    /// anything else reads the URL, since what follows would be read as a path or a query
    /// and could be shown in a refusal.
    #[error(
        "the URL has an `@` after its host part: percent-encode a `/`, `?` or `#` in a user name or password (%2F, %3F, %23); no parameter takes an `@`"
    )]
    UnencodedUserinfo,
    /// One of idem's or the redis crate's parameters given twice: the last would win
    /// quietly, and a `prefix=` that is not the one meant puts the keys beside another
    /// deployment's.
    #[error("{0}= is given twice; give it once")]
    Repeated(&'static str),
    /// A cluster URL that names no node, or a database other than 0 (a cluster has one).
    #[error("{0}")]
    Cluster(String),
}

/// The scheme of a cluster URL: `redis+cluster://HOST:PORT,HOST:PORT/?prefix=...`.
pub const CLUSTER_SCHEME: &str = "redis+cluster";

impl RedisOptions {
    /// Parses `redis://...` (one server) or `redis+cluster://HOST:PORT,HOST:PORT/...` (a
    /// cluster, from any of the nodes listed), taking idem's `prefix=NAME` and
    /// `durability=required|volatile` query parameters out first.
    pub fn from_url(url: &str) -> Result<Self, RedisUrlError> {
        if unencoded_userinfo(url) {
            return Err(RedisUrlError::UnencodedUserinfo);
        }
        let names = ["prefix", "durability", "protocol"];
        if let Some(name) = idem_core::store::repeated_url_param(url, &names) {
            return Err(RedisUrlError::Repeated(name));
        }
        let (rest, durability) = idem_core::store::take_url_param(url, "durability");
        let durability = match durability.as_deref() {
            None | Some("required") => Durability::Required,
            Some("volatile") => Durability::Volatile,
            Some(other) => return Err(RedisUrlError::Durability(other.to_owned())),
        };
        let (rest, prefix) = idem_core::store::take_url_param(&rest, "prefix");
        let prefix = prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
        let ok = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !ok {
            return Err(RedisUrlError::Prefix(prefix));
        }
        let server = match rest
            .strip_prefix(CLUSTER_SCHEME)
            .and_then(|r| r.strip_prefix("://"))
        {
            Some(after) => Server::Cluster(cluster_nodes(after)?),
            None => Server::Single(rest),
        };
        // Parse now, so a bad URL is refused before anything connects.
        let urls = match &server {
            Server::Single(url) => std::slice::from_ref(url),
            Server::Cluster(nodes) => nodes.as_slice(),
        };
        for url in urls {
            redis::Client::open(url.as_str())?;
            if let Some(name) = unknown_option(url) {
                return Err(RedisUrlError::UnknownOption(name));
            }
        }
        Ok(RedisOptions {
            server,
            prefix,
            clock: None,
            op_timeout: Duration::from_secs(5),
            durability,
        })
    }
}

/// Whether an `@` comes after the end of the URL's host part (the first `/`, `?` or `#`
/// after the scheme): then the user name or password holds one of those unencoded. No `@`
/// belongs after it in a Redis URL: idem's parameters and `protocol=` take none.
fn unencoded_userinfo(url: &str) -> bool {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    after_scheme
        .find(['/', '?', '#'])
        .is_some_and(|end| after_scheme[end..].contains('@'))
}

/// The first query parameter left in a server's `url` (idem's own taken out) that the redis
/// crate does not read either: it reads only `protocol=` from a TCP URL, its name
/// percent-decoded. The query is the one the redis crate's own parser finds. The name is
/// returned as written (idem's own were taken out as written); never its value, which may
/// be a secret put in the wrong place.
fn unknown_option(url: &str) -> Option<String> {
    let parsed = redis::parse_redis_url(url)?;
    let written = parsed
        .query()?
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').map_or(pair, |(name, _value)| name));
    // `query_pairs` splits the same way and skips the same empty pieces, decoding each.
    let decoded = parsed.query_pairs().map(|(name, _value)| name);
    written
        .zip(decoded)
        .find(|(_, decoded)| decoded != "protocol")
        .map(|(written, _)| written.to_owned())
}

/// Each node's own `redis://` URL from what follows `redis+cluster://`: `[USER:PASS@]` and the
/// query apply to every node; the path may only name database 0.
fn cluster_nodes(after_scheme: &str) -> Result<Vec<String>, RedisUrlError> {
    let (authority, path_query) = match after_scheme.find(['/', '?']) {
        Some(i) => after_scheme.split_at(i),
        None => (after_scheme, ""),
    };
    let (path, query) = match path_query.find('?') {
        Some(i) => path_query.split_at(i),
        None => (path_query, ""),
    };
    if !matches!(path, "" | "/" | "/0") {
        return Err(RedisUrlError::Cluster(format!(
            "a Redis Cluster has only database 0; the URL names {path:?}"
        )));
    }
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{userinfo}{h}/{query}"))
        .collect();
    if nodes.is_empty() {
        return Err(RedisUrlError::Cluster(
            "a redis+cluster:// URL names at least one node: redis+cluster://HOST:PORT,HOST:PORT/"
                .to_owned(),
        ));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_comes_out_of_the_url() {
        let o = RedisOptions::from_url("redis://127.0.0.1:6379/2?prefix=t-1").expect("parses");
        assert_eq!(
            (o.prefix.as_str(), &o.server),
            (
                "t-1",
                &Server::Single("redis://127.0.0.1:6379/2".to_owned())
            )
        );
        let o = RedisOptions::from_url("redis://127.0.0.1").expect("parses");
        assert_eq!(o.prefix, DEFAULT_PREFIX);
        assert_eq!(o.durability, Durability::Required);
    }

    #[test]
    fn durability_comes_out_of_the_url() {
        let o = RedisOptions::from_url("redis://h:6379/1?durability=volatile&prefix=p")
            .expect("parses");
        assert_eq!(
            (o.durability, o.prefix.as_str(), &o.server),
            (
                Durability::Volatile,
                "p",
                &Server::Single("redis://h:6379/1".to_owned())
            )
        );
        let o = RedisOptions::from_url("redis://h/?durability=required").expect("parses");
        assert_eq!(o.durability, Durability::Required);
        assert!(matches!(
            RedisOptions::from_url("redis://h/?durability=yolo"),
            Err(RedisUrlError::Durability(v)) if v == "yolo"
        ));
    }

    #[test]
    fn refuses_bad_prefixes_and_urls() {
        for bad in ["", "a b", "x{y}", "a:b"] {
            assert!(
                matches!(
                    RedisOptions::from_url(&format!("redis://h/?prefix={bad}")),
                    Err(RedisUrlError::Prefix(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            RedisOptions::from_url("redis://h:notaport"),
            Err(RedisUrlError::Url(_))
        ));
    }

    #[test]
    fn refuses_options_nobody_reads() {
        for (url, name) in [
            ("redis://h/?prefx=tenant_b", "prefx"),
            ("redis://h/?prefix=p&durabilty=volatile", "durabilty"),
            ("redis://h/?password=hunter2", "password"),
            ("redis+cluster://h:7000/?prefix=p&db=1", "db"),
            ("redis://h/?timeout", "timeout"),
            ("redis://u:pw@h/?prefix=p&pre%66ix=q", "pre%66ix"),
            ("redis://h/?=x", ""),
        ] {
            match RedisOptions::from_url(url) {
                Err(e @ RedisUrlError::UnknownOption(_)) => {
                    let said = e.to_string();
                    assert!(said.contains(&format!("{name:?}")), "{said}");
                    assert!(said.contains("prefix="), "{said}");
                    assert!(!said.contains("hunter2"), "{said}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        for fine in [
            "redis://h/?pro%74ocol=resp2",
            "redis://h/?protocol=resp2&prefix=p",
            "redis://h/?prefix=p&",
        ] {
            assert!(RedisOptions::from_url(fine).is_ok(), "{fine}");
        }
    }

    /// A raw `/`, `?` or `#` in a password ends the host part early, and the rest would be
    /// read as a path or a query: refused first, naming none of it.
    #[test]
    fn a_password_holding_url_delimiters_is_refused_unseen() {
        for url in [
            "redis://u:s3?cret@h/?prefix=a",
            "redis://default:2024?Summer!@127.0.0.1:6379/?prefix=a",
            "redis://default:123?cret@127.0.0.1:6379/",
            "redis://u:s3/cret@h/",
            "redis://u:s3#cret@h/",
            "redis+cluster://u:123?cret=x@127.0.0.1:7000,127.0.0.1:7001/?prefix=a",
            "redis+cluster://u:s3/cret@127.0.0.1:7000,127.0.0.1:7001/?prefix=a",
            "redis://127.0.0.1:6379/?prefix=tri@l27&durability=volatile",
        ] {
            match RedisOptions::from_url(url) {
                Err(e @ RedisUrlError::UnencodedUserinfo) => {
                    let said = e.to_string();
                    assert!(!said.contains("cret") && !said.contains("Summer"), "{said}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(RedisOptions::from_url("redis://u:s3%3Fcret@h/?prefix=a").is_ok());
    }

    #[test]
    fn a_parameter_given_twice_is_refused() {
        for (url, name) in [
            ("redis://h/?prefix=a&prefix=b", "prefix"),
            (
                "redis://h/?durability=volatile&prefix=a&durability=required",
                "durability",
            ),
            (
                "redis+cluster://h:7000/?protocol=resp2&protocol=resp3",
                "protocol",
            ),
        ] {
            assert!(
                matches!(RedisOptions::from_url(url), Err(RedisUrlError::Repeated(n)) if n == name),
                "{url}"
            );
        }
    }

    #[test]
    fn a_cluster_url_names_its_nodes() {
        let o = RedisOptions::from_url(
            "redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001/?prefix=p&protocol=resp2",
        )
        .expect("parses");
        assert_eq!(o.prefix, "p");
        assert_eq!(
            o.server,
            Server::Cluster(vec![
                "redis://u:pw@127.0.0.1:7000/?protocol=resp2".to_owned(),
                "redis://u:pw@127.0.0.1:7001/?protocol=resp2".to_owned(),
            ])
        );
        let o = RedisOptions::from_url("redis+cluster://h:7000").expect("parses");
        assert_eq!(
            o.server,
            Server::Cluster(vec!["redis://h:7000/".to_owned()])
        );
        for bad in ["redis+cluster://h:7000/3", "redis+cluster:///?prefix=p"] {
            assert!(
                matches!(RedisOptions::from_url(bad), Err(RedisUrlError::Cluster(_))),
                "{bad}"
            );
        }
    }
}
