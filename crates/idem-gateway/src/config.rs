//! The gateway's configuration: one TOML file ([`FileConfig`], whose format and HTTP part
//! live in `idem_http::file`, shared with the Python and Node middleware), with command-line
//! flags and `IDEM_*` environment variables on top (flags win over the environment, which
//! wins over the file). The file's format, with every setting, is documented there.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http::Uri;
use idem_core::Policy;
pub use idem_http::file::{
    AdminFile, DEFAULT_BODY_READ, FileConfig, Limits, RouteFile, Timeouts, UpstreamFile,
};
use idem_stores::{DEFAULT_STORE, StoreUrl};

/// The default of `[upstream] pool_idle_timeout`: below the shortest keep-alive timeout of
/// common servers (gunicorn's 2 s; Node's and uvicorn's 5 s), so the gateway retires an idle
/// connection before the upstream closes it under a request (design §4).
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

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

impl Settings {
    /// Merges the file and the overrides, and validates the result.
    pub fn resolve(file: FileConfig, over: Overrides) -> Result<Self> {
        let layer = file.http()?;
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
        let body_read_timeout = layer.body_read.unwrap_or(DEFAULT_BODY_READ);
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
            layer,
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
    use http::Method;
    use idem_core::{AbandonedPolicy, Anonymous, ScopeHeaders};

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
