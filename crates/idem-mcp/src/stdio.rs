//! `idem mcp -- COMMAND ARGS...`: newline-delimited JSON-RPC on this process's stdin and
//! stdout to the client, and on the spawned upstream's stdin and stdout (its stderr passes
//! through to ours).
//!
//! A relay of messages, not a second MCP implementation: each line goes through as the bytes
//! it came in, except the few the [`Proxy`] interprets. The client's request ids reach the
//! upstream unchanged; the proxy's own requests (effect calls it forwards, `tools/list` to
//! classify a tool) use ids of its own (`"idem-<nonce>-<n>"`), and their answers are taken off
//! the stream. Lines are read with a bound ([`MAX_MESSAGE`]): a larger one is hashed, not
//! buffered, and the request it answers gets `response-too-large` (an effect call) or a
//! JSON-RPC error (anything else) at once.

use std::collections::HashMap;
use std::future::Future;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use idem_core::{Scope, Store, ToolClass};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::call::Forwarded;
use crate::inbound::{self, BATCH_VERSION, Inbound, Interpreted};
use crate::policy::Policies;
use crate::proxy::Proxy;
use crate::rpc::{self, Envelope, Line, Lines, MAX_MESSAGE};

/// How long calls already forwarded may run on once the client has gone or SIGTERM came, so
/// their results are stored instead of left abandoned.
pub const DRAIN: Duration = Duration::from_secs(30);

/// Spawns `upstream` (its program, arguments and environment as the caller set them; its
/// stdin and stdout become the relay's), relays MCP between this process's stdin and stdout and
/// the child's until the client or the upstream goes away, or `shutdown` resolves. Then calls
/// still running get up to [`DRAIN`] to finish before the upstream's stdin is closed.
pub async fn serve<S: Store + Clone>(
    mut upstream: tokio::process::Command,
    store: S,
    policies: Policies,
    scope: Scope,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let name = upstream
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    let mut child = upstream
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start the upstream MCP server {name:?}"))?;
    let (Some(up_in), Some(up_out)) = (child.stdin.take(), child.stdout.take()) else {
        anyhow::bail!("the upstream MCP server {name:?} has no stdin or stdout");
    };
    let proxy = Proxy::new(store, policies);
    relay(
        proxy,
        scope,
        tokio::io::stdin(),
        tokio::io::stdout(),
        up_out,
        up_in,
        shutdown,
    )
    .await;
    // The upstream's stdin is closed: give it a moment to exit on its own.
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    Ok(())
}

/// An answer to a request the proxy sent itself.
#[derive(Debug)]
enum Answer {
    Result(Box<RawValue>),
    Error(Box<RawValue>),
    TooLarge { len: u64, sha256: [u8; 32] },
}

/// One client connection and its upstream.
#[derive(Debug)]
struct Link {
    to_client: mpsc::Sender<Vec<u8>>,
    to_upstream: mpsc::Sender<Vec<u8>>,
    /// The proxy's own requests waiting for an answer, by id.
    /// `None` once the upstream's output has ended: a request asked after that would wait
    /// its whole timeout for an answer nobody reads.
    pending: Mutex<Option<HashMap<String, oneshot::Sender<Answer>>>>,
    /// The client's requests whose results the proxy reads or rewrites, by id: their method.
    rewrite: Mutex<HashMap<String, String>>,
    /// The protocol version the upstream's answer to `initialize` chose.
    version: Mutex<Option<String>>,
    nonce: String,
    next: AtomicU64,
}

impl Link {
    /// Sends a request of the proxy's own and waits at most `timeout` for its answer.
    async fn ask(&self, method: &str, params: &Value, timeout: Duration) -> Forwarded {
        let id = format!(
            "\"idem-{}-{}\"",
            self.nonce,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, rx) = oneshot::channel();
        match &mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(pending) => pending.insert(id.clone(), tx),
            None => return Forwarded::NotSent("the upstream's output has ended".into()),
        };
        if self
            .to_upstream
            .send(rpc::request(&id, method, params))
            .await
            .is_err()
        {
            self.forget(&id);
            return Forwarded::NotSent("the connection to it is closed".into());
        }
        let answer = tokio::time::timeout(timeout, rx).await;
        self.forget(&id);
        match answer {
            Ok(Ok(Answer::Result(r))) => Forwarded::Result(r),
            Ok(Ok(Answer::Error(e))) => Forwarded::Error(e),
            Ok(Ok(Answer::TooLarge { len, sha256 })) => Forwarded::TooLarge { len, sha256 },
            Ok(Err(_)) => Forwarded::Lost("the upstream closed its output".into()),
            Err(_) => Forwarded::Lost(format!("no answer within {}s", timeout.as_secs())),
        }
    }

    fn forget(&self, id: &str) {
        self.waiting(id);
    }

    /// Takes the sender waiting for the answer to `id`, if any.
    fn waiting(&self, id: &str) -> Option<oneshot::Sender<Answer>> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()?
            .remove(id)
    }

    async fn client(&self, msg: Vec<u8>) {
        let _ = self.to_client.send(msg).await;
    }

    /// The negotiated protocol version, once the upstream has answered `initialize`.
    fn version(&self) -> Option<String> {
        self.version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Relays between a client (`client_in`, `client_out`) and an upstream (`up_out`, `up_in`)
/// until either side ends or `shutdown` resolves; then lets effect calls in flight finish.
pub async fn relay<S, CR, CW, UR, UW>(
    proxy: Proxy<S>,
    scope: Scope,
    client_in: CR,
    client_out: CW,
    up_out: UR,
    up_in: UW,
    shutdown: impl Future<Output = ()>,
) where
    S: Store + Clone,
    CR: AsyncRead + Unpin + Send + 'static,
    CW: AsyncWrite + Unpin + Send + 'static,
    UR: AsyncRead + Unpin + Send + 'static,
    UW: AsyncWrite + Unpin + Send + 'static,
{
    let (to_client, client_rx) = mpsc::channel(256);
    let (to_upstream, upstream_rx) = mpsc::channel(256);
    let link = Arc::new(Link {
        to_client,
        to_upstream,
        pending: Mutex::new(Some(HashMap::new())),
        rewrite: Mutex::default(),
        version: Mutex::default(),
        nonce: nonce(),
        next: AtomicU64::new(1),
    });
    let client_writer = tokio::spawn(write_lines(client_rx, client_out));
    let upstream_writer = tokio::spawn(write_lines(upstream_rx, up_in));
    let mut from_upstream = tokio::spawn(read_upstream(link.clone(), proxy.clone(), up_out));
    let from_client = read_client(link.clone(), proxy.clone(), scope, client_in);
    tokio::select! {
        () = from_client => tracing::debug!("the client went away"),
        _ = &mut from_upstream => tracing::warn!("the upstream MCP server went away"),
        () = shutdown => tracing::debug!("shutting down"),
    }
    proxy.drain(DRAIN).await;
    from_upstream.abort();
    // Dropping the last senders ends the writers: the upstream's stdin closes. A call the
    // drain gave up on still holds a sender; the writer is then stopped, which closes the
    // upstream's stdin all the same, rather than waiting out that call's timeout.
    drop(link);
    let mut upstream_writer = upstream_writer;
    if tokio::time::timeout(Duration::from_secs(1), &mut upstream_writer)
        .await
        .is_err()
    {
        upstream_writer.abort();
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), client_writer).await;
}

fn nonce() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{:x}{:x}", std::process::id(), t & 0xffff_ffff)
}

async fn write_lines<W: AsyncWrite + Unpin>(mut rx: mpsc::Receiver<Vec<u8>>, mut out: W) {
    while let Some(mut msg) = rx.recv().await {
        msg.push(b'\n');
        if out.write_all(&msg).await.is_err() || out.flush().await.is_err() {
            break;
        }
    }
    let _ = out.shutdown().await;
}

async fn read_upstream<S, R>(link: Arc<Link>, proxy: Proxy<S>, up_out: R)
where
    S: Store + Clone,
    R: AsyncRead + Unpin,
{
    let mut lines = Lines::new(BufReader::with_capacity(64 * 1024, up_out), MAX_MESSAGE);
    while let Ok(Some(line)) = lines.next().await {
        match line {
            Line::Oversized { id, len, sha256 } => {
                let Some(id) = id else {
                    tracing::warn!(
                        len,
                        "dropped a message from the upstream over the size bound"
                    );
                    continue;
                };
                match link.waiting(&id) {
                    Some(tx) => {
                        let _ = tx.send(Answer::TooLarge { len, sha256 });
                    }
                    None => {
                        link.rewrite
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&id);
                        link.client(too_large(&id, len)).await;
                    }
                }
            }
            Line::Whole(bytes) => {
                let msg = upstream_message(&link, &proxy, bytes);
                if let Some(msg) = msg {
                    link.client(msg).await;
                }
            }
        }
    }
    // The upstream is gone: calls waiting on it get no answer, and none is sent after.
    link.pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
}

/// What to pass to the client of one message from the upstream (`None`: it was an answer
/// to the proxy's own request).
fn upstream_message<S: Store + Clone>(
    link: &Link,
    proxy: &Proxy<S>,
    bytes: Vec<u8>,
) -> Option<Vec<u8>> {
    let Some(env) = Envelope::parse(&bytes) else {
        return Some(bytes);
    };
    if !env.is_response() {
        return Some(bytes);
    }
    let id = env.id_text()?;
    if let Some(tx) = link.waiting(&id) {
        let answer = match (env.result, env.error) {
            (Some(r), _) => Answer::Result(r.to_owned()),
            (None, Some(e)) => Answer::Error(e.to_owned()),
            (None, None) => return None,
        };
        let _ = tx.send(answer);
        return None;
    }
    let method = link
        .rewrite
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
    if let (Some("initialize"), Some(result)) = (method.as_deref(), env.result) {
        let chosen = serde_json::from_str::<Value>(result.get())
            .ok()
            .and_then(|v| v.get("protocolVersion")?.as_str().map(str::to_owned));
        *link.version.lock().unwrap_or_else(|p| p.into_inner()) = chosen;
    }
    if let (Some(method), Some(result)) = (method, env.result)
        && let Some(rewritten) = proxy.rewrite_result(&method, result)
    {
        return Some(rpc::response(&id, rewritten.get()));
    }
    Some(bytes)
}

fn too_large(id: &str, len: u64) -> Vec<u8> {
    rpc::error_response(
        id,
        &rpc::error_object(
            rpc::INTERNAL_ERROR,
            &format!(
                "the upstream's answer was {len} bytes, over the {} bytes the idempotency proxy relays",
                MAX_MESSAGE
            ),
        ),
    )
}

async fn read_client<S, R>(link: Arc<Link>, proxy: Proxy<S>, scope: Scope, client_in: R)
where
    S: Store + Clone,
    R: AsyncRead + Unpin,
{
    let mut lines = Lines::new(BufReader::with_capacity(64 * 1024, client_in), MAX_MESSAGE);
    while let Ok(Some(line)) = lines.next().await {
        let bytes = match line {
            Line::Whole(b) => b,
            Line::Oversized { id, len, .. } => {
                if let Some(id) = id {
                    let e = rpc::error_object(
                        -32600,
                        &format!(
                            "the request was {len} bytes, over the {MAX_MESSAGE} bytes the idempotency proxy relays"
                        ),
                    );
                    link.client(rpc::error_response(&id, &e)).await;
                }
                continue;
            }
        };
        match inbound::read(&bytes) {
            Inbound::Batch(members) => {
                let version = link.version();
                if version.as_deref() != Some(BATCH_VERSION) {
                    tracing::warn!("refused a JSON-RPC batch outside protocol {BATCH_VERSION}");
                    link.client(inbound::refuse_batch(&members, version.as_deref()))
                        .await;
                    continue;
                }
                // Member by member, each read as if it came alone; each answer goes back
                // on its own line.
                let members: Vec<Vec<u8>> = members
                    .iter()
                    .map(|m| m.get().as_bytes().to_vec())
                    .collect();
                for member in members {
                    single(&link, &proxy, &scope, member).await;
                }
            }
            _ => single(&link, &proxy, &scope, bytes).await,
        }
    }
}

/// One client message that is not a batch (a batch's member included): relayed, refused,
/// or interpreted ([`inbound::read`]).
async fn single<S: Store + Clone>(
    link: &Arc<Link>,
    proxy: &Proxy<S>,
    scope: &Scope,
    bytes: Vec<u8>,
) {
    let (id, method, params) = match inbound::read(&bytes) {
        Inbound::Relay => {
            let _ = link.to_upstream.send(bytes).await;
            return;
        }
        Inbound::Refused(refusal) => {
            tracing::warn!(reason = %refusal.message, "refused a client message");
            link.client(refusal.answer()).await;
            return;
        }
        Inbound::Batch(_) => {
            let refusal = inbound::nested_batch();
            link.client(refusal.answer()).await;
            return;
        }
        Inbound::Call { id, params } => {
            // Tracked from here: a shutdown that comes before the call is claimed still
            // waits for it, with the upstream's answers still read.
            proxy.track(tools_call(
                link.clone(),
                proxy.clone(),
                scope.clone(),
                id,
                params,
                bytes,
            ));
            return;
        }
        Inbound::Request { id, method, params } => (id, method, params),
    };
    link.rewrite
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), method.method().to_owned());
    if method == Interpreted::Initialize
        && let Some(params) = params.and_then(|p| proxy.clamp_initialize(p))
    {
        let _ = link
            .to_upstream
            .send(rpc::request(&id, "initialize", &params))
            .await;
        return;
    }
    let _ = link.to_upstream.send(bytes).await;
}

/// A `tools/call`: an effect tool's goes through the proxy, any other is relayed as it came.
async fn tools_call<S: Store + Clone>(
    link: Arc<Link>,
    proxy: Proxy<S>,
    scope: Scope,
    id: String,
    params: Map<String, Value>,
    bytes: Vec<u8>,
) {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let envelope = protocol_meta(&params);
    let list = |cursor: Option<String>| {
        let (link, envelope) = (link.clone(), envelope.clone());
        async move {
            match link
                .ask(
                    "tools/list",
                    &list_params(cursor, envelope),
                    Duration::from_secs(30),
                )
                .await
            {
                Forwarded::Result(r) => serde_json::from_str(r.get()).map_err(|e| e.to_string()),
                other => Err(format!("{other:?}")),
            }
        }
    };
    let known = proxy.known(&name, list).await;
    if known.class != ToolClass::Effect {
        let _ = link.to_upstream.send(bytes).await;
        return;
    }
    let forward = {
        let link = link.clone();
        move |p: Map<String, Value>, timeout: Duration| async move {
            link.ask("tools/call", &Value::Object(p), timeout).await
        }
    };
    let reply = proxy.call_effect(params, scope, known, forward).await;
    let msg = match reply {
        Ok(result) => rpc::response(&id, result.get()),
        Err(error) => rpc::error_response(&id, error.get()),
    };
    link.client(msg).await;
}

/// The protocol's own members of a request's `_meta` (`io.modelcontextprotocol/...`: the
/// per-request envelope of protocol 2026-07-28), for a request the proxy makes on its behalf.
pub fn protocol_meta(params: &Map<String, Value>) -> Map<String, Value> {
    params
        .get("_meta")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.starts_with("io.modelcontextprotocol/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The params of a `tools/list` the proxy sends on a client's behalf: the page's cursor, and
/// the protocol envelope of the client's request ([`protocol_meta`]).
pub fn list_params(cursor: Option<String>, envelope: Map<String, Value>) -> Value {
    let mut p = Map::new();
    if let Some(c) = cursor {
        p.insert("cursor".into(), Value::String(c));
    }
    if !envelope.is_empty() {
        p.insert("_meta".into(), Value::Object(envelope));
    }
    Value::Object(p)
}
