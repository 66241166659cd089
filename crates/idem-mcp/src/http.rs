//! `idem mcp --listen ADDR --upstream-url URL`: streamable HTTP on both sides.
//!
//! The proxy serves MCP at `/mcp` and holds one client connection to the upstream. A caller's
//! scope is the hash of its configured headers (by default `Authorization`), as the gateway
//! computes it, so two tenants' keys never meet.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use http::{HeaderName, HeaderValue};
use idem_core::Store;
use rmcp::ServerHandler;
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::policy::Policies;
use crate::proxy::{Proxy, ScopeBy};

/// Where and how the HTTP proxy serves.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Host names the server answers to besides loopback (DNS rebinding protection).
    pub allowed_hosts: Vec<String>,
}

/// Serves `handler` (a fresh clone per session) over streamable HTTP at `/mcp`, reports the
/// bound address through `on_bound`, and stops when `shutdown` resolves.
pub async fn serve_handler<H: ServerHandler + Clone>(
    handler: H,
    options: &HttpOptions,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let ct = CancellationToken::new();
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    hosts.extend(options.allowed_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_cancellation_token(ct.child_token());
    let service: StreamableHttpService<H, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    on_bound(listener.local_addr()?);
    let stop = ct.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            stop.cancel();
        })
        .await
        .context("the HTTP server failed")
}

/// The upstream MCP server of the HTTP proxy.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Its streamable HTTP endpoint, e.g. `http://127.0.0.1:3001/mcp` (plain HTTP: the proxy
    /// runs beside it).
    pub url: String,
    /// Headers sent on every request to it (its own credentials, say).
    pub headers: HashMap<HeaderName, HeaderValue>,
}

/// Connects to `upstream` and serves the proxy until `shutdown` resolves. Callers are scoped
/// by `scope_headers`.
pub async fn serve<S: Store + Clone>(
    options: HttpOptions,
    upstream: Upstream,
    store: S,
    policies: Policies,
    scope_headers: Vec<HeaderName>,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // The upstream may be starting alongside the proxy (a service manager, a shell line
    // with `&`): keep trying for a while before giving up, as a sidecar should.
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    let client = loop {
        let config = StreamableHttpClientTransportConfig::with_uri(upstream.url.as_str())
            .custom_headers(upstream.headers.clone());
        match ().serve(StreamableHttpClientTransport::from_config(config)).await {
            Ok(client) => break client,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "upstream MCP server not ready; trying again");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "cannot connect to the upstream MCP server at {} within {}s: {}",
                    upstream.url,
                    CONNECT_PATIENCE.as_secs(),
                    short(&e.to_string())
                ));
            }
        }
    };
    let proxy = Proxy::new(
        client.peer().clone(),
        store,
        policies,
        ScopeBy::Headers(scope_headers),
    );
    let served = serve_handler(proxy.clone(), &options, on_bound, shutdown).await;
    proxy.drain(crate::stdio::DRAIN).await;
    let _ = client.cancel().await;
    served
}

/// How long the proxy waits for its upstream to come up at start.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// rmcp's transport errors name its generic types; the last part says what happened.
fn short(e: &str) -> &str {
    e.rsplit("error: ").next().unwrap_or(e).trim()
}
