//! `idem mcp --listen ADDR --upstream-url URL`: streamable HTTP on both sides.
//!
//! The proxy serves MCP at `/mcp` as a reverse proxy of the upstream's endpoint: each request
//! (POST, the GET of a server's event stream, DELETE) is forwarded with the client's headers,
//! its `Mcp-Session-Id` and `MCP-Protocol-Version` included, and the answer (JSON or an SSE
//! stream) comes back as the upstream sent it. So every client session is a session of the
//! upstream's, with the client's own capabilities, and notifications, server-to-client
//! requests (elicitation, sampling, roots) and their answers pass through unchanged. The
//! proxy reads only `initialize`, `tools/list` and `server/discover` answers, and `tools/call`
//! requests of effect tools, which it forwards with an id of its own, relaying the events of
//! their stream (progress, elicitation) to the client while it waits for the result.
//!
//! A caller's scope is the hash of its configured headers (by default the gateway's:
//! credentials, `Cookie`, API-key headers) and cookies, as the gateway computes it, so two
//! tenants' keys never meet; an effect call from a caller that sends none of them is refused
//! (`principal-missing`) unless anonymous callers are allowed ([`Callers`]).
//!
//! The upstream may be `https://`: rustls with the system's roots, plus a CA file
//! ([`Upstream::ca_file`]). When the upstream has lost a session (it answers 404 to the
//! session's id), the client gets that 404 and starts a new session, as the protocol says;
//! an effect call that was not received is released, and calls in flight when a connection
//! broke are abandoned (outcome unknown), never re-sent.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use idem_core::{Anonymous, Outcome, ProblemType, Scope, ScopeHeaders, Store, ToolClass};
use rmcp::ServerHandler;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::io::BufReader;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::io::StreamReader;
use tokio_util::sync::CancellationToken;

use crate::call::{Forwarded, refusal};
use crate::inbound::{self, BATCH_VERSION, Inbound, Interpreted};
use crate::policy::Policies;
use crate::proxy::Proxy;
use crate::rpc::{self, Envelope, Line, Lines, MAX_MESSAGE};
use crate::stdio::{list_params, protocol_meta};

/// Where and how the HTTP proxy serves.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Host names the server answers to besides loopback (DNS rebinding protection).
    pub allowed_hosts: Vec<String>,
}

impl HttpOptions {
    fn hosts(&self) -> Vec<String> {
        let mut hosts = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
            "[::1]".to_owned(),
        ];
        hosts.extend(self.allowed_hosts.iter().cloned());
        hosts
    }
}

/// Serves an rmcp `handler` (a fresh clone per session) over streamable HTTP at `/mcp`,
/// reports the bound address through `on_bound`, and stops when `shutdown` resolves. The
/// example server (`idem example-mcp --listen`) is served this way.
pub async fn serve_handler<H: ServerHandler + Clone>(
    handler: H,
    options: &HttpOptions,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let ct = CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(options.hosts())
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
    /// Its streamable HTTP endpoint, `http://` or `https://`, e.g. `http://127.0.0.1:3001/mcp`.
    pub url: String,
    /// Headers sent on every request to it (its own credentials, say).
    pub headers: HashMap<HeaderName, HeaderValue>,
    /// PEM certificates trusted for an `https://` upstream besides the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// The HTTP client of the upstream: rustls (ring) with the system's roots and the CA file's
/// certificates; HTTP/1.1.
pub fn client(upstream: &Upstream) -> Result<reqwest::Client> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &upstream.ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<std::result::Result<Vec<_>, _>>)
            .with_context(|| format!("cannot read the CA file {}", path.display()))?;
        if certs.is_empty() {
            anyhow::bail!("the CA file {} holds no PEM certificate", path.display());
        }
        for cert in certs {
            roots
                .add(cert)
                .with_context(|| format!("a certificate in {} is not usable", path.display()))?;
        }
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .context("cannot build the upstream HTTP client")
}

/// How long the proxy waits for its upstream to come up at start.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// An error and its causes, on one line (a TLS failure names the certificate problem).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Whose keys an HTTP caller's are ([design §1](docs/design.md#1-words), as `idem serve`
/// reads them): the hash of its scope headers; a caller naming no one is refused unless
/// anonymous callers are allowed, and then shares the one `anonymous` scope.
#[derive(Debug, Clone)]
pub struct Callers {
    /// The headers (and cookies) that name a caller.
    pub scope_headers: ScopeHeaders,
    /// What an effect call from a caller naming no one gets.
    pub anonymous: Anonymous,
}

impl Default for Callers {
    fn default() -> Self {
        Callers {
            scope_headers: ScopeHeaders::default(),
            anonymous: Anonymous::Refuse,
        }
    }
}

struct Shared<S> {
    proxy: Proxy<S>,
    client: reqwest::Client,
    upstream: Upstream,
    callers: Callers,
    hosts: Vec<String>,
    nonce: String,
    next: AtomicU64,
}

/// Serves the proxy in front of `upstream` until `shutdown` resolves. Callers are scoped as
/// `idem serve` scopes them ([`Callers`]).
pub async fn serve<S: Store + Clone>(
    options: HttpOptions,
    upstream: Upstream,
    store: S,
    policies: Policies,
    callers: Callers,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let client = client(&upstream)?;
    // The upstream may be starting alongside the proxy (a service manager, a shell line with
    // `&`): keep trying for a while before giving up, as a sidecar should. Any HTTP answer
    // will do; a certificate that does not verify will not get better, so it fails at once.
    // An upstream that accepts connections and never answers stops the proxy at the deadline
    // too, instead of holding its startup forever.
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    loop {
        let patience = deadline.saturating_duration_since(tokio::time::Instant::now());
        match client
            .get(&upstream.url)
            .header(header::ACCEPT, "text/event-stream")
            .timeout(patience.max(Duration::from_secs(1)))
            .send()
            .await
        {
            Ok(_) => break,
            Err(e) if !e.is_connect() || tokio::time::Instant::now() >= deadline => {
                anyhow::bail!(
                    "cannot reach the upstream MCP server at {}: {}",
                    upstream.url,
                    chain(&e)
                );
            }
            // rustls says "invalid peer certificate" in the error's sources, which the
            // error's own Debug does not show.
            Err(e) if chain(&e).contains("certificate") => {
                anyhow::bail!(
                    "cannot reach the upstream MCP server at {}: {}",
                    upstream.url,
                    chain(&e)
                );
            }
            Err(e) => {
                tracing::debug!(error = %chain(&e), "upstream MCP server not ready; trying again");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    let proxy = Proxy::new(store, policies);
    let shared = Arc::new(Shared {
        proxy: proxy.clone(),
        client,
        upstream,
        callers,
        hosts: options.hosts(),
        nonce: format!("{:x}", std::process::id()),
        next: AtomicU64::new(1),
    });
    let router = axum::Router::new()
        .route("/mcp", axum::routing::any(handle::<S>))
        .with_state(shared);
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    on_bound(listener.local_addr()?);
    // Shutdown has one bound, DRAIN from the signal, as over stdio: for the requests under
    // way (an open event stream, a call whose upstream takes minutes) and for calls still
    // executing. Past it the server stops waiting for open requests (their connections'
    // tasks end with the runtime); their calls go on in tasks of their own until the end of
    // the bound, and those still running then read as abandoned.
    let (signalled, mut at_signal) = tokio::sync::oneshot::channel();
    let shutdown = async move {
        shutdown.await;
        let _ = signalled.send(tokio::time::Instant::now() + crate::stdio::DRAIN);
    };
    let serving = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .into_future();
    tokio::pin!(serving);
    let mut deadline = None;
    let served = tokio::select! {
        served = &mut serving => served,
        Ok(at) = &mut at_signal => {
            deadline = Some(at);
            match tokio::time::timeout_at(at, &mut serving).await {
                Ok(served) => served,
                Err(_) => {
                    tracing::warn!(bound = ?crate::stdio::DRAIN, "requests still open at the shutdown bound were dropped");
                    Ok(())
                }
            }
        }
    };
    let grace = deadline.map_or(crate::stdio::DRAIN, |at| {
        at.saturating_duration_since(tokio::time::Instant::now())
    });
    proxy.drain(grace).await;
    served.context("the HTTP server failed")
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "title": status.canonical_reason(),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// Headers not forwarded either way: hop-by-hop ones, and those that describe a body the
/// proxy may rewrite.
fn hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "content-length"
    )
}

async fn handle<S: Store + Clone>(State(st): State<Arc<Shared<S>>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| match h.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => h,
        });
    if !host.is_some_and(|h| st.hosts.iter().any(|a| a.eq_ignore_ascii_case(h))) {
        return problem(
            StatusCode::FORBIDDEN,
            "this Host is not allowed (DNS rebinding protection; see --allowed-host)",
        );
    }
    match parts.method {
        Method::POST => {}
        // A GET opens the server's event stream and a DELETE ends a session; neither carries
        // a message, so no body is forwarded that an upstream could read as one.
        Method::GET | Method::DELETE => {
            return pass(&st, parts.method, &parts.headers, reqwest::Body::from("")).await;
        }
        _ => {
            let mut resp = problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "MCP's streamable HTTP transport uses POST, GET and DELETE",
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            return resp;
        }
    }
    let bytes = match axum::body::to_bytes(body, MAX_MESSAGE).await {
        Ok(b) => b,
        Err(_) => {
            return problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request is over the {MAX_MESSAGE} bytes the idempotency proxy relays"
                ),
            );
        }
    };
    match inbound::read(&bytes) {
        Inbound::Batch(members) => batch(&st, &parts.headers, &members).await,
        message => respond(&st, &parts.headers, &bytes, message).await,
    }
}

/// The answer to one client message that is not a batch (a batch's member included), as
/// [`inbound::read`] classified it.
async fn respond<S: Store + Clone>(
    st: &Arc<Shared<S>>,
    headers: &HeaderMap,
    bytes: &Bytes,
    message: Inbound<'_>,
) -> Response {
    match message {
        Inbound::Relay => pass(st, Method::POST, headers, bytes.clone().into()).await,
        Inbound::Refused(refusal) => refused(&refusal),
        Inbound::Batch(_) => refused(&inbound::nested_batch()),
        Inbound::Request {
            id,
            method: Interpreted::Initialize,
            params,
        } => match params.and_then(|p| st.proxy.clamp_initialize(p)) {
            Some(params) => {
                let body = rpc::request(&id, "initialize", &params);
                pass(st, Method::POST, headers, body.into()).await
            }
            None => pass(st, Method::POST, headers, bytes.clone().into()).await,
        },
        Inbound::Request { id, method, .. } => {
            rewritten(st, headers, bytes.clone(), &id, method.method()).await
        }
        Inbound::Call { id, params } => {
            tools_call(st.clone(), headers.clone(), bytes.clone(), id, params).await
        }
    }
}

/// A message the proxy does not forward: 400, with the JSON-RPC error as the body, as the
/// transport answers a message it cannot accept.
fn refused(refusal: &inbound::Refusal) -> Response {
    tracing::warn!(reason = %refusal.message, "refused a client message");
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        refusal.answer(),
    )
        .into_response()
}

/// A batch (protocol 2025-03-26, the only one with batches: a session that sends no
/// `MCP-Protocol-Version` speaks it): each member is answered as if it came alone, and the
/// answers come back as the events of one SSE stream, as the transport allows. In any other
/// version the batch is refused, an error per request.
async fn batch<S: Store + Clone>(
    st: &Arc<Shared<S>>,
    headers: &HeaderMap,
    members: &[&RawValue],
) -> Response {
    let version = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok());
    if version.is_some_and(|v| v != BATCH_VERSION) {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            inbound::refuse_batch(members, version),
        )
            .into_response();
    }
    let (tx, rx) = mpsc::channel::<Vec<u8>>(64);
    for member in members {
        let bytes = Bytes::copy_from_slice(member.get().as_bytes());
        let (st, headers, tx) = (st.clone(), headers.clone(), tx.clone());
        tokio::spawn(async move {
            let message = match inbound::read(&bytes) {
                Inbound::Request {
                    method: Interpreted::Initialize,
                    id,
                    ..
                } => Inbound::Refused(inbound::Refusal {
                    id: Some(id),
                    code: inbound::INVALID_REQUEST,
                    message: "initialize must not be part of a batch (MCP 2025-03-26)".into(),
                }),
                other => other,
            };
            let id = Envelope::parse(&bytes)
                .filter(Envelope::is_request)
                .and_then(|e| e.id_text());
            let resp = respond(&st, &headers, &bytes, message).await;
            as_events(resp, id, tx).await;
        });
    }
    drop(tx);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(channel_body(rx))
        .unwrap_or_else(|_| problem(StatusCode::INTERNAL_SERVER_ERROR, "cannot answer"))
}

/// One batch member's answer as SSE events on `tx`: an event stream as it is, a JSON answer
/// as one event, an HTTP error as a JSON-RPC error to the member's request `id`, nothing for
/// an accepted notification or response.
async fn as_events(resp: Response, id: Option<String>, tx: mpsc::Sender<Vec<u8>>) {
    let status = resp.status();
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body().into_data_stream();
    if status.is_success() && sse {
        while let Ok(Some(chunk)) = body.try_next().await {
            if tx.send(chunk.to_vec()).await.is_err() {
                return;
            }
        }
        return;
    }
    let mut text = Vec::new();
    while let Ok(Some(chunk)) = body.try_next().await {
        text.extend_from_slice(&chunk);
        if text.len() > MAX_MESSAGE {
            break;
        }
    }
    let message = if status.is_success() {
        text
    } else if let Some(id) = id {
        match serde_json::from_slice::<Value>(&text) {
            // Already a JSON-RPC error (a refusal): as it is.
            Ok(v) if v.get("error").is_some() => text,
            _ => rpc::error_response(
                &id,
                &rpc::error_object(
                    rpc::INTERNAL_ERROR,
                    &format!(
                        "answered {status}: {}",
                        String::from_utf8_lossy(&text)
                            .chars()
                            .take(300)
                            .collect::<String>()
                    ),
                ),
            ),
        }
    } else {
        return;
    };
    if !message.iter().all(u8::is_ascii_whitespace) {
        let _ = tx
            .send([b"data: ".as_slice(), message.trim_ascii(), b"\n\n"].concat())
            .await;
    }
}

fn to_upstream<S>(st: &Shared<S>, method: Method, headers: &HeaderMap) -> reqwest::RequestBuilder {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        if !hop(name) {
            out.append(name.clone(), value.clone());
        }
    }
    for (name, value) in &st.upstream.headers {
        out.insert(name.clone(), value.clone());
    }
    // Inside a tool call's span, the upstream's spans join its trace.
    idem_telemetry::inject(&mut out);
    st.client.request(method, &st.upstream.url).headers(out)
}

fn bad_gateway(e: &reqwest::Error) -> Response {
    problem(
        StatusCode::BAD_GATEWAY,
        &format!("the upstream MCP server did not answer: {}", chain(e)),
    )
}

/// The upstream's answer as it is, streamed.
fn streamed(resp: reqwest::Response) -> Response {
    let mut builder = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !hop(name) {
            builder = builder.header(name, value);
        }
    }
    let body = Body::from_stream(resp.bytes_stream());
    builder
        .body(body)
        .unwrap_or_else(|_| problem(StatusCode::BAD_GATEWAY, "unusable upstream answer"))
}

async fn pass<S>(
    st: &Shared<S>,
    method: Method,
    headers: &HeaderMap,
    body: reqwest::Body,
) -> Response {
    match to_upstream(st, method, headers).body(body).send().await {
        Ok(resp) => streamed(resp),
        Err(e) => bad_gateway(&e),
    }
}

fn is_sse(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

fn reader(resp: reqwest::Response) -> BufReader<impl tokio::io::AsyncRead + Unpin> {
    let stream = resp.bytes_stream().map_err(std::io::Error::other);
    BufReader::with_capacity(64 * 1024, StreamReader::new(stream))
}

/// A `tools/list` or `server/discover`: forwarded, its result rewritten in the JSON answer
/// or in the SSE event that carries it; every other event passes as it came.
async fn rewritten<S: Store + Clone>(
    st: &Arc<Shared<S>>,
    headers: &HeaderMap,
    bytes: Bytes,
    id: &str,
    method: &str,
) -> Response {
    let resp = match to_upstream(st, Method::POST, headers)
        .body(bytes)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return bad_gateway(&e),
    };
    if !resp.status().is_success() {
        return streamed(resp);
    }
    let mut builder = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !hop(name) {
            builder = builder.header(name, value);
        }
    }
    let sse = is_sse(&resp);
    let mut lines = if sse {
        Lines::sse(reader(resp), MAX_MESSAGE)
    } else {
        Lines::new(reader(resp), MAX_MESSAGE)
    };
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    let (st, id, method) = (st.clone(), id.to_owned(), method.to_owned());
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next().await {
            let mut out = match line {
                Line::Whole(b) => rewrite_line(&st.proxy, b, &id, &method, sse),
                Line::Oversized { len, .. } => {
                    let e = rpc::error_object(
                        rpc::INTERNAL_ERROR,
                        &format!(
                            "the upstream's answer was {len} bytes, over the {MAX_MESSAGE} bytes the idempotency proxy relays"
                        ),
                    );
                    let msg = rpc::error_response(&id, &e);
                    if sse {
                        [b"data: ".as_slice(), &msg].concat()
                    } else {
                        msg
                    }
                }
            };
            out.push(b'\n');
            if tx.send(out).await.is_err() {
                break;
            }
        }
    });
    builder
        .body(channel_body(rx))
        .unwrap_or_else(|_| problem(StatusCode::BAD_GATEWAY, "unusable upstream answer"))
}

fn channel_body(rx: mpsc::Receiver<Vec<u8>>) -> Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(Bytes::from(chunk)), rx))
    });
    Body::from_stream(stream)
}

fn rewrite_line<S: Store + Clone>(
    proxy: &Proxy<S>,
    line: Vec<u8>,
    id: &str,
    method: &str,
    sse: bool,
) -> Vec<u8> {
    let json = if sse {
        match line.strip_prefix(b"data:") {
            Some(rest) => rest,
            None => return line,
        }
    } else {
        &line[..]
    };
    let Some(env) = Envelope::parse(json) else {
        return line;
    };
    if !env.is_response() || env.id_text().as_deref() != Some(id) {
        return line;
    }
    let Some(rewritten) = env.result.and_then(|r| proxy.rewrite_result(method, r)) else {
        return line;
    };
    let msg = rpc::response(id, rewritten.get());
    if sse {
        [b"data: ".as_slice(), &msg].concat()
    } else {
        msg
    }
}

/// The tool result refusing an effect call from a caller that names no one: its key would be
/// shared with every other such caller, and their results replayed to each other.
fn principal_missing(tool: &str, names: &ScopeHeaders) -> Box<RawValue> {
    refusal(
        ProblemType::PrincipalMissing,
        format!(
            "{tool} was not run: it has side effects, and its idempotency key must belong to a \
             caller, named by one of these request headers: {}. This request sends none, so \
             its result could be replayed to any other caller that sends none. Calling it \
             again will not help; the MCP client must send its credentials (an operator can \
             accept callers without them: anonymous = \"allow\" in the policy file).",
            names.describe()
        ),
    )
}

/// Headers for a request the proxy makes in the client's session: the client's, with the
/// 2026-07-28 standard headers naming this request.
fn own_headers(headers: &HeaderMap, method: &str) -> HeaderMap {
    let mut h = headers.clone();
    if h.contains_key("mcp-method") {
        if let Ok(v) = HeaderValue::from_str(method) {
            h.insert("mcp-method", v);
        }
        if method != "tools/call" {
            let names: Vec<HeaderName> = h
                .keys()
                .filter(|k| k.as_str() == "mcp-name" || k.as_str().starts_with("mcp-param-"))
                .cloned()
                .collect();
            for n in names {
                h.remove(n);
            }
        }
    }
    h.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h
}

/// Sends a request of the proxy's own and reads its answer, relaying the other events of an
/// SSE answer to `events` (as SSE lines). `lost` is set when the upstream says the session is
/// gone.
async fn exchange<S>(
    st: &Shared<S>,
    headers: HeaderMap,
    method: &str,
    params: &Value,
    events: Option<mpsc::Sender<Vec<u8>>>,
    lost: &AtomicBool,
) -> Forwarded {
    let id = format!(
        "\"idem-{}-{}\"",
        st.nonce,
        st.next.fetch_add(1, Ordering::Relaxed)
    );
    let body = rpc::request(&id, method, params);
    let resp = match to_upstream(st, Method::POST, &own_headers(&headers, method))
        .body(body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Forwarded::NotSent(chain(&e)),
        Err(e) => return Forwarded::Lost(chain(&e)),
    };
    let status = resp.status();
    if status == StatusCode::NOT_FOUND && headers.contains_key("mcp-session-id") {
        lost.store(true, Ordering::Relaxed);
        return Forwarded::NotSent("the upstream no longer knows this session".into());
    }
    if status.is_client_error() {
        let text = resp.text().await.unwrap_or_default();
        return Forwarded::NotSent(format!(
            "it refused the request ({status}): {}",
            text.chars().take(300).collect::<String>()
        ));
    }
    if !status.is_success() {
        return Forwarded::Lost(format!("it answered {status}"));
    }
    let sse = is_sse(&resp);
    let mut lines = if sse {
        Lines::sse(reader(resp), MAX_MESSAGE)
    } else {
        Lines::new(reader(resp), MAX_MESSAGE)
    };
    loop {
        let line = match lines.next().await {
            Ok(Some(l)) => l,
            Ok(None) => return Forwarded::Lost("the answer ended without a result".into()),
            Err(e) => return Forwarded::Lost(chain(&e)),
        };
        let bytes = match line {
            Line::Oversized {
                id: Some(got),
                len,
                sha256,
            } if got == id => {
                return Forwarded::TooLarge { len, sha256 };
            }
            Line::Oversized { len, .. } => {
                tracing::warn!(
                    len,
                    "dropped an event from the upstream over the size bound"
                );
                continue;
            }
            Line::Whole(b) => b,
        };
        let json = if sse {
            match bytes.strip_prefix(b"data:") {
                Some(rest) => rest,
                None => continue,
            }
        } else {
            &bytes[..]
        };
        let Some(env) = Envelope::parse(json) else {
            continue;
        };
        if env.is_response() && env.id_text().as_deref() == Some(id.as_str()) {
            return match (env.result, env.error) {
                (Some(r), _) => Forwarded::Result(r.to_owned()),
                (None, Some(e)) => Forwarded::Error(e.to_owned()),
                (None, None) => Forwarded::Lost("an answer with neither result nor error".into()),
            };
        }
        if let Some(events) = &events {
            // The client may have gone: the call goes on without it.
            let _ =
                events.try_send([b"data: ".as_slice(), json.trim_ascii_start(), b"\n\n"].concat());
        }
    }
}

async fn tools_call<S: Store + Clone>(
    st: Arc<Shared<S>>,
    headers: HeaderMap,
    bytes: Bytes,
    id: String,
    params: Map<String, Value>,
) -> Response {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let envelope = protocol_meta(&params);
    let ignored = AtomicBool::new(false);
    let list = |cursor: Option<String>| {
        let (st, headers, envelope, ignored) = (&st, headers.clone(), envelope.clone(), &ignored);
        async move {
            let params = list_params(cursor, envelope);
            match exchange(st, headers, "tools/list", &params, None, ignored).await {
                Forwarded::Result(r) => serde_json::from_str(r.get()).map_err(|e| e.to_string()),
                other => Err(format!("{other:?}")),
            }
        }
    };
    let known = st.proxy.known(&name, list).await;
    if known.class != ToolClass::Effect {
        return pass(&st, Method::POST, &headers, bytes.into()).await;
    }
    let scope = match (
        st.callers.scope_headers.principal(&headers),
        st.callers.anonymous,
    ) {
        (Some(scope), _) => scope,
        (None, Anonymous::Allow) => Scope::anonymous(),
        (None, Anonymous::Refuse) => {
            Outcome::Invalid.count();
            let refusal = principal_missing(&name, &st.callers.scope_headers);
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                rpc::response(&id, refusal.get()),
            )
                .into_response();
        }
    };
    let wants_sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let (events_tx, mut events_rx) = mpsc::channel::<Vec<u8>>(64);
    let lost = Arc::new(AtomicBool::new(false));
    let forward = {
        let (st, headers, lost) = (st.clone(), headers.clone(), lost.clone());
        move |p: Map<String, Value>, timeout: Duration| async move {
            let events = wants_sse.then_some(events_tx);
            let p = Value::Object(p);
            let sent = exchange(&st, headers, "tools/call", &p, events, &lost);
            match tokio::time::timeout(timeout, sent).await {
                Ok(f) => f,
                Err(_) => Forwarded::Lost(format!("no answer within {}s", timeout.as_secs())),
            }
        }
    };
    let proxy = st.proxy.clone();
    let mut reply = Box::pin(async move { proxy.call_effect(params, scope, known, forward).await });
    // Until the first event, the answer may still be a plain one (a replay, a refusal, a
    // session the upstream lost).
    let first = tokio::select! {
        r = &mut reply => Err(r),
        Some(e) = events_rx.recv() => Ok(e),
    };
    let done = move |r: Result<Box<RawValue>, Box<RawValue>>| match r {
        Ok(result) => rpc::response(&id, result.get()),
        Err(error) => rpc::error_response(&id, error.get()),
    };
    match first {
        Err(r) => {
            if lost.load(Ordering::Relaxed) {
                return problem(
                    StatusCode::NOT_FOUND,
                    "the upstream MCP server no longer knows this session; start a new one",
                );
            }
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                done(r),
            )
                .into_response()
        }
        Ok(first) => {
            let (tx, rx) = mpsc::channel::<Vec<u8>>(64);
            tokio::spawn(async move {
                let _ = tx.send(first).await;
                let r = loop {
                    tokio::select! {
                        r = &mut reply => break r,
                        Some(e) = events_rx.recv() => { let _ = tx.send(e).await; }
                    }
                };
                while let Ok(e) = events_rx.try_recv() {
                    let _ = tx.send(e).await;
                }
                let _ = tx
                    .send([b"data: ".as_slice(), &done(r), b"\n\n"].concat())
                    .await;
            });
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/event-stream")
                .header(header::CACHE_CONTROL, "no-cache")
                .body(channel_body(rx))
                .unwrap_or_else(|_| problem(StatusCode::INTERNAL_SERVER_ERROR, "cannot answer"))
        }
    }
}
