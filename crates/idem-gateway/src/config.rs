//! The gateway's configuration: one TOML file, with command-line flags and `IDEM_*`
//! environment variables on top (flags win over the environment, which wins over the file).
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! threads = 4                       # threads serving connections, each with its own upstream pool (--threads; default: the CPUs idem may use)
//! upstream = "http://127.0.0.1:3000"  # or the [upstream] table below
//! store = "sqlite:idem.db"
//! scope_headers = ["authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token"]
//! scope_cookies = ["session"]       # only these cookies name the caller (default: the whole header)
//! anonymous = "refuse"              # a keyed request naming no caller: 400 principal-missing; or "allow"
//!
//! # [upstream]                       # instead of upstream = "...", with its options
//! # url = "https://api.example.com"
//! # ca_file = "ca.pem"               # trust these CAs instead of the system's
//! # pool_idle_timeout = "1s"         # below the upstream's keep-alive timeout
//!
//! [limits]
//! max_body_bytes = 1048576          # request bodies are buffered to fingerprint them
//! max_stored_body_bytes = 1048576   # larger responses are kept as a digest
//! max_response_bytes = 67108864     # larger responses: 502 and outcome unknown
//! max_connections = 10000           # more wait to be accepted (default: from RLIMIT_NOFILE)
//! cache_bytes = 67108864            # completed records kept in memory for replays; 0: none
//!
//! [timeouts]
//! upstream = "30s"                  # sent but no answer by then: 504, outcome unknown
//! shutdown = "10s"                  # SIGTERM: how long in-flight requests may finish
//! lease = "30s"
//! header_read = "10s"               # a request's headers must arrive within this
//! body_read = "30s"                 # and its body within this (keyed: 408 body-timeout)
//!
//! [admin]
//! listen = "127.0.0.1:9090"
//! token_env = "IDEM_ADMIN_TOKEN"    # bearer token, read from this variable
//! purge_interval = "60s"
//! purge_batch = 1000
//!
//! [[routes]]
//! method = "POST"
//! path = "/v1/charges"
//! require_key = true
//! retention = "24h"
//! wait = "5s"
//! on_unknown = "reject"             # or "retry" (also spelt on_abandoned)
//! release_statuses = [429, 503]
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http::{HeaderName, Method, Uri};
use idem_core::{AbandonedPolicy, Anonymous, DEFAULT_RETENTION, Policy, ScopeHeaders};
use idem_http::policy::DEFAULT_MAX_BODY;
use idem_http::{PathPattern, RoutePolicy, Routes};
use idem_stores::{DEFAULT_STORE, StoreUrl};
use serde::Deserialize;

/// The file, as written. Every field is optional; [`Settings`] holds the validated result.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Address to serve on.
    pub listen: Option<SocketAddr>,
    /// Threads serving client connections, each with a runtime and an upstream pool of its
    /// own.
    pub threads: Option<usize>,
    /// The service behind the gateway: `upstream = "URL"`, or an `[upstream]` table.
    #[serde(default, deserialize_with = "UpstreamFile::deserialize_either")]
    pub upstream: Option<UpstreamFile>,
    /// Store URL.
    pub store: Option<String>,
    /// Headers naming the caller ([`idem_core::scope::DEFAULT_SCOPE_HEADERS`] if absent).
    pub scope_headers: Option<Vec<String>>,
    /// The cookies that name the caller, if only they of the `Cookie` header should.
    pub scope_cookies: Option<Vec<String>>,
    /// What a keyed request that names no caller gets: `refuse` (the default) or `allow`.
    pub anonymous: Option<Anonymous>,
    /// Base of problem type URIs.
    pub problem_base: Option<String>,
    /// Size bounds.
    #[serde(default)]
    pub limits: Limits,
    /// Time bounds.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// The admin listener.
    #[serde(default)]
    pub admin: AdminFile,
    /// The policy of requests no route matches.
    #[serde(default)]
    pub defaults: RouteFile,
    /// Per-route policies, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteFile>,
}

/// The upstream as written: `upstream = "URL"`, or an `[upstream]` table with `url` and the
/// connection's options.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// Base URL of the service behind the gateway.
    pub url: Option<String>,
    /// PEM file of the CA certificates to trust for an `https://` upstream, instead of the
    /// system's.
    pub ca_file: Option<PathBuf>,
    /// How long an idle pooled connection to the upstream is kept for reuse.
    #[serde(default, with = "humantime_serde")]
    pub pool_idle_timeout: Option<Duration>,
}

impl UpstreamFile {
    /// Reads the value of `upstream`: a string is the URL, a table the whole
    /// [`UpstreamFile`], with its own errors (an unknown field is named).
    fn deserialize_either<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Self>, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = UpstreamFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a URL like \"http://127.0.0.1:3000\", or an [upstream] table")
            }
            fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<UpstreamFile, E> {
                Ok(UpstreamFile {
                    url: Some(url.to_owned()),
                    ..UpstreamFile::default()
                })
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                map: M,
            ) -> Result<UpstreamFile, M::Error> {
                UpstreamFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_any(Either).map(Some)
    }
}

/// The default of `[upstream] pool_idle_timeout`: below the shortest keep-alive timeout of
/// common servers (gunicorn's 2 s; Node's and uvicorn's 5 s), so the gateway retires an idle
/// connection before the upstream closes it under a request (design §4).
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// `[limits]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Request body bound.
    pub max_body_bytes: Option<usize>,
    /// Stored response body bound.
    pub max_stored_body_bytes: Option<usize>,
    /// The most of an upstream response buffered for a keyed request.
    pub max_response_bytes: Option<usize>,
    /// Client connections served at once on the main listener; more wait to be accepted.
    pub max_connections: Option<usize>,
    /// The completed-record cache's bound in bytes; 0 turns it off.
    pub cache_bytes: Option<u64>,
}

/// `[timeouts]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Until the upstream's response headers arrive.
    #[serde(default, with = "humantime_serde")]
    pub upstream: Option<Duration>,
    /// How long shutdown waits for in-flight requests.
    #[serde(default, with = "humantime_serde")]
    pub shutdown: Option<Duration>,
    /// Lease of a claim (extended while the upstream works).
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    /// How long a client has to send a request's headers, on a new connection or an idle
    /// kept-alive one; then the connection is closed.
    #[serde(default, with = "humantime_serde")]
    pub header_read: Option<Duration>,
    /// How long a client has to send a request's body, from when its headers arrived; then
    /// a keyed request gets 408 `body-timeout` and a passthrough one is cut off upstream, and
    /// the connection is closed.
    #[serde(default, with = "humantime_serde")]
    pub body_read: Option<Duration>,
}

/// `[admin]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// Address of the admin listener.
    pub listen: Option<SocketAddr>,
    /// Environment variable holding the bearer token.
    pub token_env: Option<String>,
    /// Time between background purges.
    #[serde(default, with = "humantime_serde")]
    pub purge_interval: Option<Duration>,
    /// Records deleted per purge transaction.
    pub purge_batch: Option<usize>,
}

/// A `[[routes]]` entry, or `[defaults]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// HTTP method; absent or `"*"` for any.
    pub method: Option<String>,
    /// Path pattern (not for `[defaults]`).
    pub path: Option<String>,
    /// Refuse requests without a key.
    pub require_key: Option<bool>,
    /// Retention of completed records.
    #[serde(default, with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// How long a duplicate waits for an in-flight first request.
    #[serde(default, with = "humantime_serde")]
    pub wait: Option<Duration>,
    /// What a retry of an unknown outcome gets: `reject` or `retry` (also spelt
    /// `on_abandoned`, the name this setting had first).
    #[serde(alias = "on_abandoned")]
    pub on_unknown: Option<AbandonedPolicy>,
    /// Statuses that release the key.
    pub release_statuses: Option<Vec<u16>>,
    /// Request body bound for this route.
    pub max_body_bytes: Option<usize>,
}

/// Flags and environment variables, already parsed by the CLI; `None` means "not given".
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--listen` / `IDEM_LISTEN`.
    pub listen: Option<SocketAddr>,
    /// `--upstream` / `IDEM_UPSTREAM`.
    pub upstream: Option<String>,
    /// `--upstream-ca` / `IDEM_UPSTREAM_CA`.
    pub upstream_ca: Option<PathBuf>,
    /// `--store` / `IDEM_STORE`.
    pub store: Option<String>,
    /// `--admin-listen` / `IDEM_ADMIN_LISTEN`.
    pub admin_listen: Option<SocketAddr>,
    /// `--threads` / `IDEM_THREADS`.
    pub threads: Option<usize>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to serve on.
    pub listen: SocketAddr,
    /// Threads serving client connections (at least 1). Each runs a single-threaded runtime
    /// with its own upstream pool, so a request is served start to end on one thread; the
    /// store and the completed-record cache are shared.
    pub threads: usize,
    /// Base URI of the upstream (`http://host:port` or `https://host[:port]`, optionally
    /// with a path prefix).
    pub upstream: Uri,
    /// The CA certificates trusted for an `https://` upstream, instead of the system's.
    pub upstream_ca_file: Option<PathBuf>,
    /// How long an idle pooled upstream connection is kept.
    pub pool_idle_timeout: Duration,
    /// The store, parsed and checked here so that a mistyped URL is refused with the rest of
    /// the configuration; the caller opens it (the gateway is generic over `Store`). Its
    /// `Debug` hides passwords (`admin_token` is not hidden: do not log `Settings`).
    pub store: StoreUrl,
    /// The layer's configuration.
    pub layer: idem_http::Config,
    /// Until the upstream's response headers arrive.
    pub upstream_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// How long a client has to send a request's headers (both listeners).
    pub header_read_timeout: Duration,
    /// How long a client has to send a request's body (`[timeouts] body_read`); also in
    /// `layer.body_read`, for the bodies the layer buffers.
    pub body_read_timeout: Duration,
    /// Client connections served at once on the main listener; more wait in the kernel's
    /// accept queue until one closes.
    pub max_connections: usize,
    /// Admin listener address.
    pub admin_listen: SocketAddr,
    /// Bearer token for the admin listener, if any.
    pub admin_token: Option<String>,
    /// Time between background purges.
    pub purge_interval: Duration,
    /// Records deleted per purge transaction.
    pub purge_batch: usize,
}

impl FileConfig {
    /// Parses configuration text.
    pub fn parse(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| {
            // `upstream = "URL"` and an `[upstream]` table are two spellings of one setting;
            // TOML only says "duplicate key", which does not say what to do.
            let upstream_twice = e.message().contains("duplicate key")
                && e.span()
                    .and_then(|span| text.get(span))
                    .is_some_and(|key| key.contains("upstream"));
            if upstream_twice {
                anyhow::anyhow!(
                    "{e}\nuse either upstream = \"URL\" or an [upstream] table with url = \"URL\", not both"
                )
            } else {
                e.into()
            }
        })
    }

    /// Which headers (and cookies) name the caller ([design §1](docs/design.md#1-words)):
    /// `scope_headers` and `scope_cookies`, validated. `idem inspect --config` reads them too,
    /// so it hashes a caller's headers as the gateway does.
    pub fn scope(&self) -> Result<ScopeHeaders> {
        match &self.scope_headers {
            None => ScopeHeaders::default(),
            Some(names) => ScopeHeaders::checked(
                names
                    .iter()
                    .map(|h| {
                        HeaderName::from_bytes(h.as_bytes())
                            .with_context(|| format!("scope_headers: {h:?} is not a header name"))
                    })
                    .collect::<Result<Vec<_>>>()?,
            )
            .context("scope_headers")?,
        }
        .with_cookies(self.scope_cookies.clone().unwrap_or_default())
        .context("scope_cookies")
    }

    /// Reads and parses a file; errors name the file and the offending line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| {
            format!(
                "config file {} is invalid (addresses are IP:PORT like \"127.0.0.1:8080\"; durations like \"250ms\", \"30s\", \"24h\")",
                path.display()
            )
        })
    }
}

/// The default of `[timeouts] header_read`.
pub const DEFAULT_HEADER_READ: Duration = Duration::from_secs(10);

/// The shortest admin token accepted: an empty or trivially short one would leave the admin
/// listener (and the resolve form on its page) open while it looks guarded.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// The admin token held by the environment variable `var`, which the setting `what` names
/// (`admin.token_env` in `idem serve`'s file, `--admin-token-env` of `idem mcp`). Read from
/// the environment, not the command line, so it shows in no process listing.
pub fn admin_token_from_env(var: &str, what: &str) -> Result<String> {
    let token =
        std::env::var(var).with_context(|| format!("{what} names {var}, which is not set"))?;
    // An empty token would match a request that sends none: the listener would be open
    // while the operator believes it guarded.
    if token.trim().len() < MIN_ADMIN_TOKEN_LEN {
        bail!(
            "{what} names {var}, which holds {} characters; an admin token needs at least {MIN_ADMIN_TOKEN_LEN}",
            token.trim().len()
        );
    }
    Ok(token)
}

/// The default of `[timeouts] body_read`.
pub const DEFAULT_BODY_READ: Duration = Duration::from_secs(30);

/// The default of `threads`: the CPUs this process may run on (its affinity mask and cgroup
/// quota, as the standard library reads them), or 1 if that cannot be read.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The most `[limits] max_connections` defaults to.
pub const MAX_DEFAULT_CONNECTIONS: usize = 10_000;

/// File descriptors kept for everything but client connections: listeners, the admin
/// listener's connections, the store, logs.
pub const RESERVED_FDS: u64 = 128;

/// The default connection cap: what the process's file descriptor limit (`RLIMIT_NOFILE`,
/// `ulimit -n`) leaves room for, at most [`MAX_DEFAULT_CONNECTIONS`]. Each client connection
/// may hold an upstream connection too, so half of what is left after [`RESERVED_FDS`]; so
/// a flood of connections waits at the cap instead of making `accept` fail with "too many
/// open files" for everyone.
pub fn default_max_connections() -> usize {
    #[cfg(unix)]
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    #[cfg(not(unix))]
    let soft: Option<u64> = None;
    match soft {
        Some(n) => usize::try_from(n.saturating_sub(RESERVED_FDS) / 2)
            .unwrap_or(MAX_DEFAULT_CONNECTIONS)
            .clamp(1, MAX_DEFAULT_CONNECTIONS),
        None => MAX_DEFAULT_CONNECTIONS,
    }
}

fn route_policy(r: &RouteFile, base: &RoutePolicy, where_: &str) -> Result<RoutePolicy> {
    let policy = RoutePolicy {
        require_key: r.require_key.unwrap_or(base.require_key),
        engine: Policy {
            retention: r.retention.unwrap_or(base.engine.retention),
            on_abandoned: r.on_unknown.unwrap_or(base.engine.on_abandoned),
            wait: r.wait.or(base.engine.wait),
            release_statuses: r
                .release_statuses
                .clone()
                .unwrap_or_else(|| base.engine.release_statuses.clone()),
            ..base.engine.clone()
        },
        max_body: r.max_body_bytes.unwrap_or(base.max_body),
    };
    // The same refusals, in the same words, as the MCP proxy's policy file.
    policy
        .engine
        .validate()
        .with_context(|| where_.to_owned())?;
    Ok(policy)
}

impl Settings {
    /// Merges the file and the overrides, and validates the result.
    pub fn resolve(file: FileConfig, over: Overrides) -> Result<Self> {
        let scope = file.scope()?;
        let upstream_file = file.upstream.unwrap_or_default();
        let upstream_text = over
            .upstream
            .or(upstream_file.url)
            .context("no upstream: pass --upstream URL (or IDEM_UPSTREAM, or upstream = \"...\" in the config file)")?;
        let upstream: Uri = upstream_text.parse().with_context(|| {
            format!("upstream {upstream_text:?} is not a URL like http://127.0.0.1:3000")
        })?;
        let upstream_ca_file = over.upstream_ca.or(upstream_file.ca_file);
        if upstream.query().is_some() {
            bail!(
                "upstream {upstream_text:?}: a query string is not forwarded; remove it (the client's own query is kept)"
            );
        }
        match (upstream.scheme_str(), upstream.authority()) {
            (Some("http"), Some(_)) if upstream_ca_file.is_some() => bail!(
                "upstream {upstream_text:?}: a CA file (ca_file, --upstream-ca) is for an https:// upstream"
            ),
            (Some("http" | "https"), Some(_)) => {}
            _ => bail!(
                "upstream {upstream_text:?} must look like http://host:port or https://host[:port]"
            ),
        }
        if let Some(ca) = &upstream_ca_file {
            // Read now, so that a wrong path is refused with the rest of the configuration.
            crate::proxy::load_ca_file(ca)?;
        }
        let pool_idle_timeout = upstream_file
            .pool_idle_timeout
            .unwrap_or(DEFAULT_POOL_IDLE_TIMEOUT);
        let upstream_timeout = file.timeouts.upstream.unwrap_or(Duration::from_secs(30));
        let header_read_timeout = file.timeouts.header_read.unwrap_or(DEFAULT_HEADER_READ);
        if header_read_timeout.is_zero() {
            bail!("timeouts.header_read must be more than 0s (default {DEFAULT_HEADER_READ:?})");
        }
        let body_read_timeout = file.timeouts.body_read.unwrap_or(DEFAULT_BODY_READ);
        if body_read_timeout.is_zero() {
            bail!("timeouts.body_read must be more than 0s (default {DEFAULT_BODY_READ:?})");
        }
        let threads = match over.threads.or(file.threads) {
            Some(0) => bail!("threads must be at least 1"),
            Some(n) => n,
            None => default_threads(),
        };
        let max_connections = match file.limits.max_connections {
            Some(0) => bail!("limits.max_connections must be at least 1"),
            Some(n) => n,
            None => default_max_connections(),
        };
        Policy::validate_upstream_timeout(upstream_timeout).context("timeouts.upstream")?;
        let lease = file.timeouts.lease.unwrap_or(Duration::from_secs(30));
        // Checked here too, so the error names the setting the user wrote (the routes' check
        // below would blame [defaults]).
        Policy {
            lease,
            ..Policy::default()
        }
        .validate()
        .context("timeouts.lease")?;
        let base = RoutePolicy {
            require_key: false,
            engine: Policy {
                lease,
                retention: DEFAULT_RETENTION,
                max_stored_body: file.limits.max_stored_body_bytes.unwrap_or(1024 * 1024),
                ..Policy::default()
            },
            max_body: file.limits.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY),
        };
        if file.defaults.path.is_some() || file.defaults.method.is_some() {
            bail!("[defaults] applies to requests no route matches; it takes no method or path");
        }
        let default = route_policy(&file.defaults, &base, "[defaults]")?;
        let mut routes = Routes::new(default.clone());
        for (i, r) in file.routes.iter().enumerate() {
            let where_ = format!("routes[{i}]");
            let path = r
                .path
                .as_deref()
                .with_context(|| format!("{where_}: path is required"))?;
            let pattern = PathPattern::new(path).with_context(|| where_.clone())?;
            let method = match r.method.as_deref() {
                None | Some("*") => None,
                Some(m) => Some(
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .with_context(|| format!("{where_}: method {m:?} is not an HTTP method"))?,
                ),
            };
            // A route that requires keys rejects unknown outcomes unless told otherwise (§5).
            let route_base = RoutePolicy {
                require_key: true,
                engine: Policy {
                    on_abandoned: AbandonedPolicy::Reject,
                    ..default.engine.clone()
                },
                ..default.clone()
            };
            routes = routes.route(method, pattern, route_policy(r, &route_base, &where_)?);
        }
        let admin_token = file
            .admin
            .token_env
            .as_deref()
            .map(|var| admin_token_from_env(var, "admin.token_env"))
            .transpose()?;
        // The same words `idem inspect --store` uses, the password hidden in them.
        let store: StoreUrl = over
            .store
            .or(file.store)
            .as_deref()
            .unwrap_or(DEFAULT_STORE)
            .parse()?;
        let loopback: SocketAddr = ([127, 0, 0, 1], 9090).into();
        Ok(Settings {
            listen: over
                .listen
                .or(file.listen)
                .unwrap_or(([127, 0, 0, 1], 8080).into()),
            threads,
            upstream,
            upstream_ca_file,
            pool_idle_timeout,
            store,
            layer: idem_http::Config {
                routes,
                scope,
                anonymous: file.anonymous.unwrap_or_default(),
                problem_base: file
                    .problem_base
                    .unwrap_or_else(|| idem_http::DEFAULT_PROBLEM_BASE.to_owned()),
                max_response_bytes: file
                    .limits
                    .max_response_bytes
                    .unwrap_or(idem_http::Config::default().max_response_bytes),
                body_read: Some(body_read_timeout),
                cache_bytes: file
                    .limits
                    .cache_bytes
                    .unwrap_or(idem_http::DEFAULT_CACHE_BYTES),
                ..idem_http::Config::default()
            },
            upstream_timeout,
            shutdown_timeout: file.timeouts.shutdown.unwrap_or(Duration::from_secs(10)),
            header_read_timeout,
            body_read_timeout,
            max_connections,
            admin_listen: over.admin_listen.or(file.admin.listen).unwrap_or(loopback),
            admin_token,
            purge_interval: file.admin.purge_interval.unwrap_or(Duration::from_secs(60)),
            purge_batch: file.admin.purge_batch.unwrap_or(1000).max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings> {
        let file = FileConfig::parse(text)?;
        Settings::resolve(file, Overrides::default())
    }

    #[test]
    fn a_full_file_resolves() {
        let s = parse(
            r#"
            upstream = "http://127.0.0.1:3000"
            scope_headers = ["authorization", "x-tenant"]
            [timeouts]
            upstream = "2s"
            lease = "10s"
            [[routes]]
            method = "post"
            path = "/v1/charges"
            retention = "1h"
            wait = "5s"
            on_abandoned = "retry"
            release_statuses = [429]
            "#,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.upstream_timeout, Duration::from_secs(2));
        assert_eq!(s.layer.scope.headers().len(), 2);
        let p = s.layer.routes.policy_for(&Method::POST, "/v1/charges");
        assert!(p.require_key);
        assert_eq!(p.engine.retention, Duration::from_secs(3600));
        assert_eq!(p.engine.lease, Duration::from_secs(10));
        assert_eq!(p.engine.on_abandoned, AbandonedPolicy::Retry);
        assert_eq!(p.engine.release_statuses, vec![429]);
        assert_eq!(p.engine.wait, Some(Duration::from_secs(5)));
        assert!(
            !s.layer
                .routes
                .policy_for(&Method::POST, "/other")
                .require_key
        );
        assert_eq!(s.store.to_string(), DEFAULT_STORE);
        assert_eq!(s.header_read_timeout, DEFAULT_HEADER_READ);
        assert_eq!(s.body_read_timeout, DEFAULT_BODY_READ);
        assert_eq!(s.layer.body_read, Some(DEFAULT_BODY_READ));
        assert_eq!(s.max_connections, default_max_connections());
        assert_eq!(s.threads, default_threads());
        assert!(s.threads >= 1);
    }

    #[test]
    fn threads_are_read_and_checked() {
        let s = parse("threads = 3\nupstream = \"http://x:1\"").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.threads, 3);
        let flag = Settings::resolve(
            FileConfig::parse("threads = 3\nupstream = \"http://x:1\"")
                .unwrap_or_else(|e| panic!("{e:#}")),
            Overrides {
                threads: Some(5),
                ..Overrides::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(flag.threads, 5, "the flag wins over the file");
        let e = parse("threads = 0\nupstream = \"http://x:1\"")
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(e.contains("threads must be at least 1"), "{e}");
    }

    #[test]
    fn connection_limits_are_read_and_checked() {
        let s = parse(
            "upstream = \"http://x:1\"\n[limits]\nmax_connections = 7\n[timeouts]\nheader_read = \"1500ms\"\nbody_read = \"5s\"",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.max_connections, 7);
        assert_eq!(s.header_read_timeout, Duration::from_millis(1500));
        assert_eq!(s.body_read_timeout, Duration::from_secs(5));
        assert_eq!(s.layer.body_read, Some(Duration::from_secs(5)));
        let err = |t: &str| parse(t).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(
            err("upstream = \"http://x:1\"\n[limits]\nmax_connections = 0").contains("at least 1")
        );
        assert!(
            err("upstream = \"http://x:1\"\n[timeouts]\nheader_read = \"0s\"")
                .contains("more than 0s")
        );
        assert!(
            err("upstream = \"http://x:1\"\n[timeouts]\nbody_read = \"0s\"")
                .contains("timeouts.body_read must be more than 0s")
        );
        let n = default_max_connections();
        assert!((1..=MAX_DEFAULT_CONNECTIONS).contains(&n), "{n}");
    }

    #[test]
    fn callers_are_named_by_credentials_cookies_and_api_keys_and_anonymous_ones_refused() {
        let s = parse("upstream = \"http://x:1\"").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.layer.scope, ScopeHeaders::default());
        assert_eq!(s.layer.anonymous, Anonymous::Refuse);
        let s = parse(
            "upstream = \"http://x:1\"\nanonymous = \"allow\"\nscope_headers = [\"x-api-key\", \"Cookie\"]\nscope_cookies = [\"session\"]",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.layer.anonymous, Anonymous::Allow);
        assert_eq!(s.layer.scope.describe(), "x-api-key, cookie (session)");
        let err = |t: &str| parse(t).err().map(|e| format!("{e:#}")).unwrap_or_default();
        let e = err("upstream = \"http://x:1\"\nanonymous = \"maybe\"");
        assert!(e.contains("expected `refuse` or `allow`"), "{e}");
        let e = err(
            "upstream = \"http://x:1\"\nscope_headers = [\"authorization\"]\nscope_cookies = [\"s\"]",
        );
        assert!(
            e.contains("`cookie` is not one of the scope headers"),
            "{e}"
        );
        let e = err("upstream = \"http://x:1\"\nscope_cookies = [\"a b\"]");
        assert!(e.contains("is not a cookie name"), "{e}");
    }

    #[test]
    fn mistakes_are_named() {
        let err = |t: &str| parse(t).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err("").contains("no upstream"));
        assert!(err("upstream = \"ftp://x\"").contains("must look like http://host:port"));
        assert!(err("[upstream]\nurl = \"http://x:1\"\nca = \"x\"").contains("unknown field `ca`"));
        assert!(
            err("upstream = \"http://x:1\"\n[upstream]\nurl = \"http://x:2\"")
                .contains("use either upstream = \"URL\" or an [upstream] table")
        );
        assert!(
            err("[upstream]\nurl = \"http://x:1\"\nca_file = \"/nonexistent/ca.pem\"")
                .contains("is for an https:// upstream")
        );
        assert!(
            err("[upstream]\nurl = \"https://x\"\nca_file = \"/nonexistent/ca.pem\"")
                .contains("/nonexistent/ca.pem")
        );
        assert!(err("upstream = \"http://x:1\"\nbogus = 1").contains("unknown field"));
        let short = err("upstream = \"http://x:1\"\n[timeouts]\nlease = \"500ms\"");
        assert!(
            short.starts_with("timeouts.lease: lease 500ms is under 1s"),
            "{short}"
        );
        assert!(
            err("upstream = \"http://x:1\"\n[[routes]]\nmethod = \"POST\"")
                .contains("path is required")
        );
        assert!(
            err("upstream = \"http://x:1\"\n[[routes]]\npath = \"v1\"")
                .contains("must start with /")
        );
        assert!(
            err("upstream = \"http://x:1\"\n[[routes]]\npath = \"/a\"\non_abandoned = \"maybe\"")
                .contains("\"reject\" or \"retry\"")
        );
        assert!(
            err("upstream = \"http://x:1\"\n[[routes]]\npath = \"/a\"\nrelease_statuses = [42]")
                .contains("not an HTTP status")
        );
        assert!(
            err("upstream = \"http://x:1\"\n[timeouts]\nupstream = \"soon\"").contains("invalid")
        );
    }

    #[test]
    fn a_bad_store_url_is_a_config_error_without_its_password() {
        let err = |t: &str| parse(t).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(
            err("upstream = \"http://x:1\"\nstore = \"idem.db\"")
                .contains("the store URL has no scheme")
        );
        let e =
            err("upstream = \"http://x:1\"\nstore = \"postgres://idem:s3cret@db/app?schema=Bad\"");
        assert!(e.contains("plain identifier"), "{e}");
        assert!(e.contains("postgres://idem:***@db/app"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn key_routes_reject_unknown_outcomes_even_if_defaults_retry() {
        let s = parse("upstream = \"http://x:1\"\n[defaults]\non_abandoned = \"retry\"\n[[routes]]\npath = \"/c\"")
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(
            s.layer
                .routes
                .policy_for(&Method::POST, "/c")
                .engine
                .on_abandoned,
            AbandonedPolicy::Reject
        );
        assert_eq!(
            s.layer
                .routes
                .policy_for(&Method::POST, "/x")
                .engine
                .on_abandoned,
            AbandonedPolicy::Retry
        );
    }

    #[test]
    fn overrides_win() {
        let file: FileConfig =
            toml::from_str("upstream = \"http://127.0.0.1:1\"\nstore = \"memory:\"")
                .unwrap_or_else(|e| panic!("{e}"));
        let s = Settings::resolve(
            file,
            Overrides {
                upstream: Some("http://127.0.0.1:2".into()),
                ..Overrides::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.upstream.port_u16(), Some(2));
        assert_eq!(s.store, StoreUrl::Memory);
        // --upstream-ca wins over ca_file, and is read while resolving.
        let file: FileConfig = toml::from_str(
            "[upstream]\nurl = \"https://api.example.com\"\nca_file = \"/from/file.pem\"",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let e = Settings::resolve(
            file,
            Overrides {
                upstream_ca: Some("/from/flag.pem".into()),
                ..Overrides::default()
            },
        )
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
        assert!(
            e.contains("cannot read the upstream CA file /from/flag.pem"),
            "{e}"
        );
    }

    #[test]
    fn the_upstream_is_a_url_or_a_table() {
        let s = parse("upstream = \"http://127.0.0.1:3000\"").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.upstream.to_string(), "http://127.0.0.1:3000/");
        assert_eq!(s.upstream_ca_file, None);
        // Below gunicorn's keep-alive timeout, the shortest of the common servers'.
        assert!(s.pool_idle_timeout < Duration::from_secs(2));
        let s = parse(
            "[upstream]\nurl = \"https://api.example.com/v2\"\npool_idle_timeout = \"250ms\"",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(s.upstream.scheme_str(), Some("https"));
        assert_eq!(s.pool_idle_timeout, Duration::from_millis(250));
    }
}
