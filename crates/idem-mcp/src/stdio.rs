//! `idem mcp -- COMMAND ARGS...`: stdio to the client, and the upstream spawned as a child
//! process speaking MCP on its stdin and stdout (its stderr passes through to ours).

use std::ffi::OsString;

use anyhow::{Context, Result};
use idem_core::{Scope, Store};
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;

use crate::policy::Policies;
use crate::proxy::{Proxy, ScopeBy};

/// Spawns `command`, connects to it as an MCP client, and serves the proxy on this process's
/// stdin and stdout until the client or the upstream goes away.
pub async fn serve<S: Store + Clone>(
    command: OsString,
    args: Vec<OsString>,
    store: S,
    policies: Policies,
    scope: Scope,
) -> Result<()> {
    let mut cmd = tokio::process::Command::new(&command);
    cmd.args(&args);
    let name = command.to_string_lossy().into_owned();
    let child = TokioChildProcess::new(cmd)
        .with_context(|| format!("cannot start the upstream MCP server {name:?}"))?;
    let upstream = ()
        .serve(child)
        .await
        .with_context(|| format!("the upstream MCP server {name:?} did not initialize"))?;
    let proxy = Proxy::new(
        upstream.peer().clone(),
        store,
        policies,
        ScopeBy::Fixed(scope),
    );
    let server = proxy
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not initialize")?;
    // Whichever side ends first ends the proxy; dropping the other stops it (and the child).
    tokio::select! {
        quit = server.waiting() => tracing::debug!(?quit, "the client went away"),
        quit = upstream.waiting() => tracing::warn!(?quit, "the upstream MCP server went away"),
    }
    Ok(())
}
