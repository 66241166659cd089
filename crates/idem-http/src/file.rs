//! The TOML file every HTTP front end reads: `idem serve --config`, and the Python and Node
//! middleware (`config="idem.toml"`), one format and one parser, so the routes, the caller
//! rules, the limits and the refusals' envelope a service is configured with are read the
//! same way whichever front end runs them.
//!
//! [`FileConfig::http`] validates what every HTTP front end applies (the [`Config`] of the
//! HTTP core); `idem serve` resolves its own settings beside it (listen addresses, the
//! upstream, threads, the admin listener), which the middleware does not read.
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
//! [problems]
//! format = "rfc9457"                # or "stripe", or "template"
//! base = "urn:idem:problem:"        # RFC 9457 type URIs (also spelt problem_base = "...")
//! # template = '{"error": {"code": "{name}", "message": "{detail}"}}'
//! # content_type = "application/json"
//! # statuses = { "key-reused" = 409 }
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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use http::{HeaderName, Method};
use idem_core::{AbandonedPolicy, Anonymous, DEFAULT_RETENTION, Policy, ScopeHeaders};
use serde::Deserialize;

use crate::config::Config;
use crate::policy::{DEFAULT_MAX_BODY, PathPattern, RoutePolicy, Routes};
use crate::problem::{DEFAULT_PROBLEM_BASE, ProblemFormat, ProblemTemplate};

/// The default of `[timeouts] body_read`.
pub const DEFAULT_BODY_READ: Duration = Duration::from_secs(30);

/// The default of `[timeouts] lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The file, as written. Every field is optional; [`FileConfig::http`] validates what every
/// HTTP front end applies, and `idem serve` its own settings beside it.
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
    /// Headers naming the caller (`ScopeHeaders::default` if absent).
    pub scope_headers: Option<Vec<String>>,
    /// The cookies that name the caller, if only they of the `Cookie` header should.
    pub scope_cookies: Option<Vec<String>>,
    /// What a keyed request that names no caller gets: `refuse` (the default) or `allow`.
    pub anonymous: Option<Anonymous>,
    /// Base of problem type URIs (the same as `[problems] base`).
    pub problem_base: Option<String>,
    /// How refusals are written.
    #[serde(default)]
    pub problems: ProblemsFile,
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

/// `[problems]`: how refusals are written ([`ProblemFormat`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProblemsFile {
    /// `rfc9457` (the default), `stripe` or `template`.
    pub format: Option<ProblemsFormatName>,
    /// The base of RFC 9457 type URIs, and of a template's `{type}`.
    pub base: Option<String>,
    /// `format = "template"`: the JSON body, with `{name}`, `{title}`, `{detail}`, `{type}`
    /// and `{status}`.
    pub template: Option<String>,
    /// `format = "template"`: its content type (`application/json` if absent).
    pub content_type: Option<String>,
    /// `format = "template"`: statuses per problem name, where they differ from idem's.
    #[serde(default)]
    pub statuses: BTreeMap<String, u16>,
}

/// The envelopes `[problems] format` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProblemsFormatName {
    /// RFC 9457 problem details.
    Rfc9457,
    /// Stripe's error envelope.
    Stripe,
    /// The operator's template.
    Template,
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

    /// What every HTTP front end applies: the routes and their policies, the caller rules,
    /// the limits the core enforces, the lease, the body read bound and the refusals'
    /// envelope, validated, with the same messages in every front end.
    pub fn http(&self) -> Result<Config> {
        let scope = self.scope()?;
        let body_read = self.timeouts.body_read.unwrap_or(DEFAULT_BODY_READ);
        if body_read.is_zero() {
            bail!("timeouts.body_read must be more than 0s (default {DEFAULT_BODY_READ:?})");
        }
        let lease = self.timeouts.lease.unwrap_or(DEFAULT_LEASE);
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
                max_stored_body: self.limits.max_stored_body_bytes.unwrap_or(1024 * 1024),
                ..Policy::default()
            },
            max_body: self.limits.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY),
        };
        if self.defaults.path.is_some() || self.defaults.method.is_some() {
            bail!("[defaults] applies to requests no route matches; it takes no method or path");
        }
        let default = route_policy(&self.defaults, &base, "[defaults]")?;
        let mut routes = Routes::new(default.clone());
        for (i, r) in self.routes.iter().enumerate() {
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
        Ok(Config {
            routes,
            scope,
            anonymous: self.anonymous.unwrap_or_default(),
            problems: self.problems()?,
            max_response_bytes: self
                .limits
                .max_response_bytes
                .unwrap_or(Config::default().max_response_bytes),
            body_read: Some(body_read),
            cache_bytes: self
                .limits
                .cache_bytes
                .unwrap_or(crate::DEFAULT_CACHE_BYTES),
            ..Config::default()
        })
    }

    /// `[problems]` (and `problem_base`), validated.
    fn problems(&self) -> Result<ProblemFormat> {
        let p = &self.problems;
        let base = match (&self.problem_base, &p.base) {
            (Some(_), Some(_)) => {
                bail!("problem_base and [problems] base are one setting; give it once")
            }
            (Some(b), None) | (None, Some(b)) => b.clone(),
            (None, None) => DEFAULT_PROBLEM_BASE.to_owned(),
        };
        let template_only =
            p.template.is_some() || p.content_type.is_some() || !p.statuses.is_empty();
        match p.format.unwrap_or(ProblemsFormatName::Rfc9457) {
            ProblemsFormatName::Template => {
                let body = p
                    .template
                    .clone()
                    .context("[problems] format = \"template\" needs template = '...'")?;
                let content_type = p
                    .content_type
                    .clone()
                    .unwrap_or_else(|| "application/json".to_owned());
                Ok(ProblemFormat::Template(
                    ProblemTemplate::new(body, content_type, base, p.statuses.clone())
                        .context("[problems]")?,
                ))
            }
            _ if template_only => bail!(
                "[problems] template, content_type and statuses are for format = \"template\""
            ),
            ProblemsFormatName::Stripe => Ok(ProblemFormat::Stripe),
            ProblemsFormatName::Rfc9457 => Ok(ProblemFormat::Rfc9457 { base }),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn http(text: &str) -> Result<Config> {
        FileConfig::parse(text)?.http()
    }

    fn err(text: &str) -> String {
        http(text)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    }

    #[test]
    fn the_middleware_reads_idem_serves_file_without_an_upstream() {
        let c = http(
            "upstream = \"http://x:1\"\nlisten = \"127.0.0.1:8080\"\nanonymous = \"allow\"\n[[routes]]\nmethod = \"POST\"\npath = \"/v1/charges\"\nwait = \"2s\"",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let p = c.routes.policy_for(&Method::POST, "/v1/charges");
        assert!(p.require_key);
        assert_eq!(p.engine.wait, Some(Duration::from_secs(2)));
        assert_eq!(c.anonymous, Anonymous::Allow);
        assert_eq!(c.problems, ProblemFormat::default());
        assert!(http("").is_ok(), "every setting has a default");
    }

    #[test]
    fn problems_are_written_in_the_envelope_the_file_names() {
        assert_eq!(
            http("problem_base = \"https://api.example/problems/\"")
                .map(|c| c.problems)
                .ok(),
            Some(ProblemFormat::Rfc9457 {
                base: "https://api.example/problems/".into()
            })
        );
        assert_eq!(
            http("[problems]\nformat = \"stripe\"")
                .map(|c| c.problems)
                .ok(),
            Some(ProblemFormat::Stripe)
        );
        let t = http(
            "[problems]\nformat = \"template\"\ntemplate = '{\"error\": \"{name}\", \"status\": {status}}'\nstatuses = { \"key-reused\" = 409 }",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(matches!(t.problems, ProblemFormat::Template(_)));
        assert!(err("problem_base = \"a\"\n[problems]\nbase = \"b\"").contains("give it once"));
        assert!(err("[problems]\nformat = \"template\"").contains("needs template"));
        assert!(err("[problems]\nformat = \"template\"\ntemplate = '{name}'").contains("not JSON"));
        assert!(
            err("[problems]\nformat = \"stripe\"\nstatuses = { \"key-reused\" = 409 }")
                .contains("for format = \"template\"")
        );
        assert!(err("[problems]\nformat = \"xml\"").contains("unknown variant"));
    }
}
