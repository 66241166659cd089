//! `idem mcp -- COMMAND ARGS...`: stdio to the client, and the upstream spawned as a child
//! process speaking MCP on its stdin and stdout (its stderr passes through to ours).

use std::ffi::OsString;
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result};
use idem_core::{Scope, Store};
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;

use crate::policy::Policies;
use crate::proxy::{Proxy, ScopeBy};

/// How long calls already forwarded may run on once the client has gone or SIGTERM came, so
/// their results are stored instead of left abandoned.
pub const DRAIN: Duration = Duration::from_secs(30);

/// Spawns `command`, connects to it as an MCP client, and serves the proxy on this process's
/// stdin and stdout until the client or the upstream goes away, or `shutdown` resolves. Then
/// calls still running get up to [`DRAIN`] to finish before the upstream is closed.
pub async fn serve<S: Store + Clone>(
    command: OsString,
    args: Vec<OsString>,
    store: S,
    policies: Policies,
    scope: Scope,
    shutdown: impl Future<Output = ()>,
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
        .clone()
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .context("the MCP client did not initialize")?;
    let peer = upstream.peer().clone();
    let closed = async move {
        while !peer.is_transport_closed() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        quit = server.waiting() => tracing::debug!(?quit, "the client went away"),
        () = closed => {
            tracing::warn!("the upstream MCP server went away");
            return Ok(());
        }
        () = shutdown => tracing::debug!("shutting down"),
    }
    proxy.drain(DRAIN).await;
    // Closes the upstream's stdin; its child process is ended when the transport drops.
    let _ = upstream.cancel().await;
    Ok(())
}
