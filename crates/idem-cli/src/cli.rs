//! Command-line flags, and their validation into typed values.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use idem_core::{Key, Scope};
use idem_stores::{DEFAULT_STORE, StoreUrl, StoreUrlError};

/// idem makes agent tool calls safe to retry: a repeated idempotency key gets the original
/// result instead of running the side effect again.
#[derive(Debug, Parser)]
#[command(name = "idem", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The double charge an agent's retry causes, reproduced over real HTTP and prevented.
    ///
    /// Runs N charge intents through a link that loses a share of responses after the payment
    /// API acted: once with naive retries, once with keys derived at intent and the gateway
    /// (on the embedded SQLite store) in front. Charges are counted from the API's database.
    Demo(DemoArgs),
    /// Run the example payment API (deliberately not idempotent) used by the demo.
    ExampleApi(ExampleApiArgs),
    /// Run the gateway: a reverse proxy that makes an upstream's unsafe requests idempotent.
    ///
    /// Requests with an Idempotency-Key execute upstream at most once; repeats get the stored
    /// response with Idempotent-Replayed: true. Example:
    ///
    ///   idem serve --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000
    ///
    /// Routes, limits, timeouts and the admin listener come from --config FILE (TOML; see
    /// docs/gateway.md). Flags override IDEM_* environment variables, which override the file.
    Serve(ServeArgs),
    /// Put idem in front of an MCP server: its side-effecting tools become safe to retry.
    ///
    /// Over stdio (what MCP clients' configs launch), the upstream server is spawned:
    ///
    ///   idem mcp --store sqlite:idem.db -- my-mcp-server --its-flags
    ///
    /// Over streamable HTTP on both sides:
    ///
    ///   idem mcp --listen 127.0.0.1:8090 --upstream-url http://127.0.0.1:3001/mcp
    ///
    /// Each effect tool gets a required idempotency_key argument; a repeated key returns the
    /// first result (marked _meta.idem.replayed) without running the tool again. See
    /// docs/mcp.md.
    Mcp(McpArgs),
    /// Run the example MCP server (charge_card is deliberately not idempotent).
    ExampleMcp(ExampleMcpArgs),
    /// Derive the idempotency key of an intent (idem/v1; see docs/key-derivation.md).
    Key(KeyArgs),
    /// Print one record's whole story: state, fingerprint, times, counters, stored response.
    Inspect(InspectArgs),
    /// Settle an abandoned record (outcome unknown): release it, or record its result.
    Resolve(ResolveArgs),
    /// Delete expired records now, in bounded batches.
    Gc(GcArgs),
    /// Create or check the store's schema (PostgreSQL tables, SQLite file) and print its
    /// version. Every command does this on connect; run it apart when the gateways' database
    /// user may not create tables.
    Migrate(MigrateArgs),
}

/// Which record an operator command is about.
#[derive(Debug, Args)]
pub(crate) struct TargetArgs {
    /// The store: sqlite:PATH, memory:, postgres://...[?schema=NAME], redis://...[?prefix=NAME] or redis+cluster://HOST:PORT,HOST:PORT/[?prefix=NAME].
    #[arg(long, env = "IDEM_STORE", default_value = DEFAULT_STORE, value_name = "URL", value_parser = StoreUrlParser)]
    pub(crate) store: StoreUrl,
    /// The scope label as stored: `anonymous` for callers without a principal (where they are
    /// allowed), `p:<hash>` for a hashed principal (the gateway logs it), or the name a runtime
    /// chose [default: anonymous; with neither --scope nor --principal, a key not found there
    /// is looked for in every scope].
    #[arg(long, value_name = "SCOPE", conflicts_with = "principal")]
    pub(crate) scope: Option<String>,
    /// One of the caller's headers, as the gateway hashes it into the scope: 'NAME: VALUE',
    /// e.g. 'authorization: Bearer tok' or 'cookie: session=abc'. Repeat it for each scope
    /// header the caller sent, in any order.
    #[arg(long, value_name = "NAME: VALUE")]
    pub(crate) principal: Vec<String>,
    /// The gateway's config file: --principal is hashed with its scope_headers and
    /// scope_cookies.
    #[arg(long, value_name = "FILE", requires = "principal")]
    pub(crate) config: Option<PathBuf>,
    /// The gateway's scope_headers, in its order (repeatable) [default: authorization,
    /// proxy-authorization, cookie, x-api-key, api-key, x-auth-token].
    #[arg(
        long = "scope-header",
        value_name = "NAME",
        requires = "principal",
        conflicts_with = "config"
    )]
    pub(crate) scope_headers: Vec<String>,
    /// The gateway's scope_cookies (repeatable).
    #[arg(
        long = "scope-cookie",
        value_name = "NAME",
        requires = "principal",
        conflicts_with = "config"
    )]
    pub(crate) scope_cookies: Vec<String>,
    /// The idempotency key as the client sent it (without header quoting).
    #[arg(value_name = "KEY")]
    pub(crate) key: String,
}

/// A validated [`TargetArgs`].
pub(crate) struct Target {
    pub(crate) store: StoreUrl,
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    /// Whether the scope was named (--scope or --principal), not the default.
    pub(crate) named: bool,
}

impl TargetArgs {
    pub(crate) fn resolve(self) -> Result<Target> {
        let key = Key::new(self.key.clone())
            .with_context(|| format!("KEY {:?} is not a valid idempotency key", self.key))?;
        let named = self.scope.is_some() || !self.principal.is_empty();
        let scope = if self.principal.is_empty() {
            let label = self
                .scope
                .clone()
                .unwrap_or_else(|| idem_core::scope::ANONYMOUS.to_owned());
            Scope::new(label.clone())
                .with_context(|| format!("--scope {label:?} is not a valid scope"))?
        } else {
            // The gateway's own reading of its file, so the two hash alike.
            let file = match &self.config {
                Some(path) => idem_gateway::FileConfig::load(path)?,
                None => idem_gateway::FileConfig {
                    scope_headers: (!self.scope_headers.is_empty())
                        .then(|| self.scope_headers.clone()),
                    scope_cookies: Some(self.scope_cookies.clone()),
                    ..Default::default()
                },
            };
            let scope_headers = file.scope().context("the scope headers")?;
            let mut headers = http::HeaderMap::new();
            for p in &self.principal {
                let (name, value) = p
                    .split_once(':')
                    .with_context(|| format!("--principal {p:?} is not 'NAME: VALUE'"))?;
                let name = http::HeaderName::from_bytes(name.trim().as_bytes())
                    .with_context(|| format!("--principal {p:?}: {name:?} is not a header name"))?;
                let value = http::HeaderValue::from_str(value.trim()).with_context(|| {
                    format!("--principal {p:?}: the value is not a header value")
                })?;
                if !scope_headers.headers().contains(&name) {
                    bail!(
                        "--principal {p:?}: {name} is not one of the scope headers ({}), so the gateway does not hash it; pass the gateway's with --config or --scope-header",
                        scope_headers.describe()
                    );
                }
                headers.append(name, value);
            }
            scope_headers.principal(&headers).with_context(|| {
                format!(
                    "--principal names no caller: its cookie header has none of the scope cookies ({})",
                    scope_headers.cookies().join(", ")
                )
            })?
        };
        Ok(Target {
            store: self.store,
            scope,
            key,
            named,
        })
    }
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["release", "status"])))]
pub(crate) struct ResolveArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// The side effect surely did not happen: forget the key, so the next request executes.
    #[arg(long, conflicts_with_all = ["status", "body", "header"])]
    pub(crate) release: bool,
    /// The side effect happened: store this HTTP status as its result, replayed from now on.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(100..=599))]
    pub(crate) status: Option<u16>,
    /// File holding the response body to store with --status.
    #[arg(long, value_name = "FILE", requires = "status")]
    pub(crate) body: Option<PathBuf>,
    /// A response header to store with --status, as NAME:VALUE (repeatable).
    #[arg(long, value_name = "NAME:VALUE", requires = "status")]
    pub(crate) header: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// The store: sqlite:PATH, memory:, postgres://...[?schema=NAME], redis://...[?prefix=NAME] or redis+cluster://HOST:PORT,HOST:PORT/[?prefix=NAME].
    #[arg(long, env = "IDEM_STORE", default_value = DEFAULT_STORE, value_name = "URL", value_parser = StoreUrlParser)]
    pub(crate) store: StoreUrl,
    /// Records deleted per transaction, so the store is never locked for long.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) batch: u32,
}

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The store: sqlite:PATH, memory:, postgres://...[?schema=NAME], redis://...[?prefix=NAME] or redis+cluster://HOST:PORT,HOST:PORT/[?prefix=NAME].
    #[arg(long, env = "IDEM_STORE", default_value = DEFAULT_STORE, value_name = "URL", value_parser = StoreUrlParser)]
    pub(crate) store: StoreUrl,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR", value_parser = socket_addr)]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// The service behind the gateway: http://host:port or https://host (port optional), with an
    /// optional path prefix (http://host:port/api).
    #[arg(long, env = "IDEM_UPSTREAM", value_name = "URL")]
    pub(crate) upstream: Option<String>,
    /// PEM file of the CA certificates to trust for an https:// upstream, instead of the
    /// system's.
    #[arg(long, env = "IDEM_UPSTREAM_CA", value_name = "FILE")]
    pub(crate) upstream_ca: Option<PathBuf>,
    /// The store: sqlite:PATH, memory:, postgres://..., redis://... or redis+cluster://... [default: sqlite:idem.db].
    #[arg(long, env = "IDEM_STORE", value_name = "URL")]
    pub(crate) store: Option<String>,
    /// TOML configuration file: routes, scope headers, limits, timeouts, admin listener.
    #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Address of the admin listener (/healthz, /metrics, /keys/KEY) [default: 127.0.0.1:9090].
    #[arg(long, env = "IDEM_ADMIN_LISTEN", value_name = "ADDR", value_parser = socket_addr)]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// Threads serving client connections, each with its own upstream pool [default: the
    /// CPUs idem may use].
    #[arg(long, env = "IDEM_THREADS", value_name = "N")]
    pub(crate) threads: Option<usize>,
}

#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The intent's scope: a conversation turn, a task id handed to sub-agents, an order id.
    #[arg(long, value_name = "SCOPE")]
    pub(crate) scope: String,
    /// The tool being called.
    #[arg(long, value_name = "TOOL")]
    pub(crate) tool: String,
    /// The tool's arguments as JSON text, or @FILE to read them from a file.
    #[arg(long, value_name = "JSON|@FILE")]
    pub(crate) args: String,
    /// Separates two deliberate, identical calls in one scope.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=(1u64 << 53)))]
    pub(crate) ordinal: u64,
    /// Name of an environment variable holding a secret: the digest becomes an HMAC, for
    /// arguments an outsider could guess (amounts, e-mail addresses).
    #[arg(long, value_name = "VAR")]
    pub(crate) secret_env: Option<String>,
}

/// Parses `--store` for clap. Parsing itself is [`StoreUrl`]'s; this only keeps clap from
/// echoing the raw value in errors (its own message for a refused value repeats it, password
/// included) and says which flag was wrong.
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

fn socket_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse().map_err(|_| {
        format!(
            "{s:?} is not IP:PORT (like 127.0.0.1:8080 or [::1]:8080; host names are not resolved)"
        )
    })
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Charge intents per run.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) intents: u32,
    /// Share of responses lost on the way back after the API acted, from 0 to 0.9 (the link
    /// also resets a quarter as many calls before they are sent).
    #[arg(long, default_value_t = 0.3, allow_negative_numbers = true)]
    pub(crate) loss: f64,
    /// Seed of the link's losses, so a run repeats.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// The gateway's store: sqlite:PATH, memory:, postgres://..., redis://... or redis+cluster://... [default: a fresh sqlite file in the demo's directory].
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// Keep the payment API's databases (naive.db, keyed.db) and the store in this directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// Print the figures as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ExampleApiArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000", value_parser = socket_addr)]
    pub(crate) listen: std::net::SocketAddr,
    /// The SQLite file that holds the charges.
    #[arg(long, default_value = "charges.db")]
    pub(crate) db: PathBuf,
}

#[derive(Debug, Args)]
// One upstream, at most: after --, --upstream-cmd, or --listen's --upstream-url. None on the
// command line is allowed here: IDEM_MCP_UPSTREAM may name it (commands/mcp.rs).
#[command(group(clap::ArgGroup::new("transport").args(["command", "listen", "upstream_cmd"])))]
pub(crate) struct McpArgs {
    /// The store: sqlite:PATH, memory:, postgres://...[?schema=NAME], redis://...[?prefix=NAME] or redis+cluster://HOST:PORT,HOST:PORT/[?prefix=NAME].
    #[arg(long, env = "IDEM_STORE", default_value = DEFAULT_STORE, value_name = "URL", value_parser = StoreUrlParser)]
    pub(crate) store: StoreUrl,
    /// TOML file: per-tool class, retention, wait and unknown-outcome policy (docs/mcp.md).
    #[arg(long, env = "IDEM_MCP_POLICY", value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,
    /// Over stdio: the scope of every key (the policy file's `scope`, else "mcp"). Keep it
    /// the same across restarts so a reconnecting runtime gets its replays.
    #[arg(long, value_name = "SCOPE", conflicts_with = "listen")]
    pub(crate) scope: Option<String>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (needs --upstream-url).
    #[arg(long, value_name = "ADDR", value_parser = socket_addr, requires = "upstream_url")]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// The upstream MCP server's streamable HTTP endpoint, e.g. http://127.0.0.1:3001/mcp.
    #[arg(long, value_name = "URL", requires = "listen")]
    pub(crate) upstream_url: Option<String>,
    /// A header sent to the upstream on every request, as 'NAME: VALUE' (repeatable).
    #[arg(long, value_name = "NAME: VALUE", requires = "listen")]
    pub(crate) upstream_header: Vec<String>,
    /// Over HTTP: a header naming the caller, hashed into the scope (repeatable; default
    /// the policy file's scope_headers, else idem serve's: authorization,
    /// proxy-authorization, cookie, x-api-key, api-key, x-auth-token).
    #[arg(long, value_name = "NAME", requires = "listen")]
    pub(crate) scope_header: Vec<String>,
    /// Over HTTP: a cookie naming the caller, where Cookie is a scope header (repeatable;
    /// default the policy file's scope_cookies, else the whole Cookie header counts).
    #[arg(long, value_name = "NAME", requires = "listen")]
    pub(crate) scope_cookie: Vec<String>,
    /// Over HTTP: what an effect call from a caller sending none of the scope headers gets:
    /// refused with principal-missing (the default, the policy file's anonymous else), or,
    /// with allow, accepted in one scope every such caller shares.
    #[arg(long, value_name = "refuse|allow", value_parser = anonymous, requires = "listen")]
    pub(crate) anonymous: Option<idem_core::Anonymous>,
    /// Over HTTP: a Host the server answers to besides loopback (repeatable).
    #[arg(long, value_name = "HOST", requires = "listen")]
    pub(crate) allowed_host: Vec<String>,
    /// PEM certificates to trust for an https:// --upstream-url, besides the system's roots.
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub(crate) upstream_ca: Option<PathBuf>,
    /// Serve /healthz and /metrics (Prometheus) and /keys/KEY at this address (stdio or HTTP).
    /// Without --admin-token-env it answers only requests addressed to an IP or localhost.
    #[arg(long, env = "IDEM_MCP_ADMIN_LISTEN", value_name = "ADDR", value_parser = socket_addr)]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// The environment variable holding the admin listener's bearer token (at least 16
    /// characters), as idem serve's admin.token_env: every route but /healthz then needs
    /// Authorization: Bearer TOKEN.
    #[arg(long, value_name = "VAR", requires = "admin_listen")]
    pub(crate) admin_token_env: Option<String>,
    /// The upstream MCP server to spawn, as one command line, in place of a command after --
    /// (split into words as a POSIX shell does, quotes included; no shell runs it). For MCP
    /// clients whose launcher re-parses the command line it runs (the MCP Inspector's CLI
    /// drops a `--`, so the server's words would reach idem as its own arguments). Where the
    /// command line names no upstream, IDEM_MCP_UPSTREAM may hold this value.
    #[arg(long, value_name = "COMMAND LINE", conflicts_with_all = ["command", "listen"])]
    pub(crate) upstream_cmd: Option<String>,
    /// The upstream MCP server to spawn, and its arguments (after --).
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

fn anonymous(s: &str) -> Result<idem_core::Anonymous, String> {
    match s {
        "refuse" => Ok(idem_core::Anonymous::Refuse),
        "allow" => Ok(idem_core::Anonymous::Allow),
        other => Err(format!("{other:?} is neither refuse nor allow")),
    }
}

#[derive(Debug, Args)]
pub(crate) struct ExampleMcpArgs {
    /// The SQLite file that holds the charges and e-mails.
    #[arg(long, default_value = "example-mcp.db", value_name = "FILE")]
    pub(crate) db: PathBuf,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio.
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    pub(crate) listen: Option<std::net::SocketAddr>,
}
