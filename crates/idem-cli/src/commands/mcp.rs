//! `idem mcp`: the MCP proxy, and `idem example-mcp`: the example MCP server.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use http::{HeaderName, HeaderValue};
use idem_core::{Scope, ScopeHeaders};
use idem_demo::mcp_server::ExampleServer;
use idem_mcp::Policies;
use idem_mcp::http::{Callers, HttpOptions, Upstream};
use idem_mcp::policy::DEFAULT_SCOPE;

use crate::cli::{ExampleMcpArgs, McpArgs};
use crate::commands::serve::{install_metrics, shutdown_signal};

pub(crate) async fn run(args: McpArgs) -> Result<()> {
    let policies = match &args.policy {
        Some(path) => Policies::load(path)?,
        None => Policies::default(),
    };
    let store = args
        .store
        .open()
        .await
        .with_context(|| format!("cannot open the store {}", args.store))?;
    if let Some(admin) = args.admin_listen {
        // The same admin listener as `idem serve`'s: /healthz, /metrics (the engine's
        // idem_requests_total by outcome, replays, store errors), /keys/KEY.
        let metrics = install_metrics()?;
        let token = args
            .admin_token_env
            .as_deref()
            .map(|var| idem_gateway::config::admin_token_from_env(var, "--admin-token-env"))
            .transpose()?;
        let router = idem_gateway::admin::router(store.clone(), metrics, token);
        let listener = tokio::net::TcpListener::bind(admin)
            .await
            .with_context(|| format!("cannot listen on {admin} (--admin-listen)"))?;
        // stdout may be the MCP channel: the address goes to stderr.
        eprintln!("idem mcp: admin on http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "the admin listener failed");
            }
        });
    }
    if let Some(listen) = args.listen {
        let Some(url) = args.upstream_url.clone() else {
            bail!("--listen needs --upstream-url");
        };
        if !args.command.is_empty() {
            bail!("give either --listen with --upstream-url, or a command after --, not both");
        }
        let mut headers = HashMap::new();
        for h in &args.upstream_header {
            let (name, value) = header(h).with_context(|| format!("--upstream-header {h:?}"))?;
            headers.insert(name, value);
        }
        // The gateway's default scope headers (credentials, cookies, API keys) unless the
        // command line or the policy file names others.
        let names = if args.scope_header.is_empty() {
            policies.scope_headers.clone()
        } else {
            Some(args.scope_header.clone())
        };
        let scope_headers = match names {
            None => ScopeHeaders::default(),
            Some(names) => ScopeHeaders::checked(
                names
                    .iter()
                    .map(|n| {
                        HeaderName::from_bytes(n.trim().as_bytes())
                            .with_context(|| format!("{n:?} is not a header name"))
                    })
                    .collect::<Result<Vec<_>>>()?,
            )
            .context("scope headers")?,
        };
        let cookies = if args.scope_cookie.is_empty() {
            policies.scope_cookies.clone().unwrap_or_default()
        } else {
            args.scope_cookie.clone()
        };
        let callers = Callers {
            scope_headers: scope_headers
                .with_cookies(cookies)
                .context("scope cookies")?,
            anonymous: args.anonymous.or(policies.anonymous).unwrap_or_default(),
        };
        let options = HttpOptions {
            listen,
            allowed_hosts: args.allowed_host.clone(),
        };
        let store_url = args.store.to_string();
        let announce = {
            let url = url.clone();
            move |addr| {
                println!(
                    "idem mcp: listening on http://{addr}/mcp; upstream {url}; store {store_url}"
                );
            }
        };
        return idem_mcp::http::serve(
            options,
            Upstream {
                url,
                headers,
                ca_file: args.upstream_ca.clone(),
            },
            store,
            policies,
            callers,
            announce,
            shutdown_signal(),
        )
        .await;
    }
    // The upstream: after --, else --upstream-cmd, else $IDEM_MCP_UPSTREAM. The variable is
    // read only here, where nothing on the command line names an upstream, so a value left in
    // the environment never conflicts with one given, and it is not handed to the upstream
    // (an `idem mcp` there would spawn the same command again).
    let line = match args.upstream_cmd {
        Some(line) => Some(("--upstream-cmd", line)),
        None if args.command.is_empty() => {
            std::env::var(UPSTREAM_ENV).ok().map(|l| (UPSTREAM_ENV, l))
        }
        None => None,
    };
    let command = match line {
        Some((from, line)) => upstream_words(from, &line)?,
        None => args.command,
    };
    let mut command = command.into_iter();
    let Some(program) = command.next() else {
        bail!(
            "name the upstream MCP server to run after --, e.g. idem mcp -- my-server --flag \
             (or as one value: --upstream-cmd 'my-server --flag')"
        );
    };
    let label = args
        .scope
        .or_else(|| policies.scope.clone())
        .unwrap_or_else(|| DEFAULT_SCOPE.to_owned());
    let scope = Scope::new(label.clone()).with_context(|| format!("scope {label:?}"))?;
    let mut upstream = tokio::process::Command::new(program);
    upstream.args(command).env_remove(UPSTREAM_ENV);
    idem_mcp::stdio::serve(upstream, store, policies, scope, shutdown_signal()).await
}

/// The environment variable that names the upstream's command line where the command line
/// names none (`--upstream-cmd`'s value, for launchers that take no arguments of their own).
const UPSTREAM_ENV: &str = "IDEM_MCP_UPSTREAM";

/// An upstream's command line (from `from`: the flag or the variable) as the words a POSIX
/// shell would pass: quotes and backslashes honoured; no variables, globs or pipes, since no
/// shell runs it. A word a shell would read as a comment (`#` at its start, unquoted) is
/// refused rather than dropped with the rest of the line.
fn upstream_words(from: &str, line: &str) -> Result<Vec<std::ffi::OsString>> {
    if let Some(at) = comment_at(line) {
        bail!(
            "{from} {line:?}: the word at byte {at} starts with #, which a shell reads as a \
             comment that drops the rest of the line; quote it ('#...') if it is an argument"
        );
    }
    let Some(words) = shlex::split(line) else {
        bail!("{from} {line:?}: unbalanced quotes, or a backslash at the end");
    };
    if words.is_empty() {
        bail!("{from} is empty: give the upstream MCP server's command line");
    }
    Ok(words.into_iter().map(Into::into).collect())
}

/// Where an unquoted `#` starts a word in `line`, as a POSIX shell reads quotes and escapes.
fn comment_at(line: &str) -> Option<usize> {
    let (mut quote, mut escaped, mut word_start) = (None, false, true);
    for (i, c) in line.char_indices() {
        let starts = std::mem::replace(&mut word_start, false);
        if std::mem::replace(&mut escaped, false) {
            continue;
        }
        match quote {
            Some('\'') => quote = (c != '\'').then_some('\''),
            Some(_) => match c {
                '\\' => escaped = true,
                '"' => quote = None,
                _ => {}
            },
            None => match c {
                '\\' => escaped = true,
                '\'' | '"' => quote = Some(c),
                '#' if starts => return Some(i),
                c if c.is_whitespace() => word_start = true,
                _ => {}
            },
        }
    }
    None
}

fn header(h: &str) -> Result<(HeaderName, HeaderValue)> {
    let (name, value) = h.split_once(':').context("expected 'NAME: VALUE'")?;
    Ok((
        HeaderName::from_bytes(name.trim().as_bytes()).context("not a header name")?,
        HeaderValue::from_str(value.trim()).context("not a header value")?,
    ))
}

pub(crate) async fn example(args: ExampleMcpArgs) -> Result<()> {
    let server = ExampleServer::open(&args.db)?;
    match args.listen {
        None => server.serve_stdio().await,
        Some(listen) => {
            let db = args.db.display().to_string();
            let options = HttpOptions {
                listen,
                allowed_hosts: Vec::new(),
            };
            idem_mcp::http::serve_handler(
                server,
                &options,
                move |addr| {
                    println!("idem example-mcp: listening on http://{addr}/mcp; charges in {db}");
                },
                shutdown_signal(),
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::upstream_words;

    #[test]
    fn an_upstream_command_line_is_split_as_a_shell_would() {
        let words = |line: &str| -> Vec<String> {
            upstream_words("--upstream-cmd", line)
                .unwrap_or_else(|e| panic!("{line:?}: {e}"))
                .into_iter()
                .map(|w| w.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            words(r#"npx -y @scope/server --root "/my docs" --tag 'a b' c\ d"#),
            [
                "npx",
                "-y",
                "@scope/server",
                "--root",
                "/my docs",
                "--tag",
                "a b",
                "c d"
            ]
        );
        // No shell runs it: what a shell would expand stays as written.
        assert_eq!(words("server $HOME *.txt"), ["server", "$HOME", "*.txt"]);
        // A # inside a word, quoted or escaped is an argument.
        assert_eq!(
            words(r##"s a#b '#c' "#d" \#e x\ #f"##),
            ["s", "a#b", "#c", "#d", "#e", "x #f"]
        );
        for bad in [
            "server 'open",
            "server \"open",
            "server \\",
            "",
            "  \t ",
            "s --token #abc --x",
            "#s",
        ] {
            assert!(upstream_words("--upstream-cmd", bad).is_err(), "{bad:?}");
        }
    }
}
