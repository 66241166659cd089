//! The traffic of the gateway tests, wherever the gateway runs: a small upstream in the test
//! process that counts how often it really executes, the configuration the gateway runs
//! with, and a client.
//!
//! `cargo test -p idem-gateway` runs the gateway in process (`support/mod.rs` here); the
//! end-to-end tests of idem-cli run the real `idem serve` binary and include this same file
//! through `#[path]`, so both send the same requests to the same upstream.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The upstream's state: how often it executed a charge, and every request line it received
/// (`METHOD target`), as it arrived.
#[derive(Clone, Default)]
pub struct Upstream(pub Arc<AtomicU32>, pub Arc<Mutex<Vec<String>>>);

impl Upstream {
    /// The request lines received so far.
    pub fn seen(&self) -> Vec<String> {
        self.1.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

pub async fn charge(
    State(up): State<Upstream>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let n = up.0.fetch_add(1, Ordering::SeqCst) + 1;
    let num = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    if let Some(ms) = num("x-sleep-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let status = num("x-status")
        .and_then(|s| axum::http::StatusCode::from_u16(s as u16).ok())
        .unwrap_or(axum::http::StatusCode::CREATED);
    let echo: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let doc =
        serde_json::json!({ "charge_id": format!("ch_{n}"), "request": body, "headers": echo });
    let mut resp = (
        status,
        [
            ("content-type", "application/json"),
            ("x-charge", &format!("ch_{n}")),
        ],
        doc.to_string(),
    )
        .into_response();
    // A session the upstream hands its caller: `x-set-cookie` comes back as `set-cookie`.
    if let Some(cookie) = headers.get("x-set-cookie") {
        resp.headers_mut().append("set-cookie", cookie.clone());
    }
    resp
}

/// A body that sends a few bytes, then nothing, ever.
pub struct Stalls(bool);

impl http_body::Body for Stalls {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.0 {
            std::task::Poll::Pending
        } else {
            self.0 = true;
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
                b"{\"charge_id\"",
            )))))
        }
    }
}

pub async fn stall(State(up): State<Upstream>) -> axum::response::Response {
    up.0.fetch_add(1, Ordering::SeqCst);
    axum::response::Response::builder()
        .status(201)
        .header("content-length", "100")
        .body(axum::body::Body::new(Stalls(false)))
        .unwrap_or_else(|e| panic!("{e}"))
}

pub async fn start_upstream() -> (SocketAddr, Upstream) {
    let up = Upstream::default();
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/read", get(charge))
        .route("/v1/stall", post(stall))
        .with_state(up.clone())
        .layer(axum::middleware::from_fn_with_state(up.clone(), record));
    (serve_on_loopback(app).await, up)
}

/// Serves `app` on a free loopback port, in the background; answers the address.
pub async fn serve_on_loopback(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Notes each request line before routing, whatever its method and target.
async fn record(
    State(up): State<Upstream>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Ok(mut seen) = up.1.lock() {
        seen.push(format!("{} {}", req.method(), req.uri()));
    }
    next.run(req).await
}

/// The configuration every test gateway runs with: one route that requires keys, small
/// bounds and short timeouts. The admin token comes from `TEST_ADMIN_TOKEN`, set to
/// [`ADMIN_TOKEN`]. The test client sends no credentials unless a test adds them, so callers
/// without any are allowed, in the shared anonymous scope (the default refuses them; the
/// scope tests run with [`SCOPE_CONFIG`]).
pub const CONFIG: &str = r#"
anonymous = "allow"
[limits]
max_body_bytes = 4096
[timeouts]
upstream = "1500ms"
lease = "2s"
shutdown = "5s"
[admin]
token_env = "TEST_ADMIN_TOKEN"
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
"#;

/// The scope tests' configuration: the default scope headers and the default refusal of
/// callers without any; the route of [`CONFIG`].
pub const SCOPE_CONFIG: &str = r#"
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
"#;

/// The admin listener's bearer token.
pub const ADMIN_TOKEN: &str = "s3cret-admin-token";

/// A gateway under test, in this process or in a child: where its proxy listens.
pub trait Listens {
    fn addr(&self) -> SocketAddr;
}

pub struct Got {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Got {
    pub fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_default();
        v["type"].as_str().unwrap_or_default().to_owned()
    }
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Got {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap_or_else(|e| panic!("{e}"));
    let resp = client()
        .request(req)
        .await
        .unwrap_or_else(|e| panic!("request to {addr}: {e}"));
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Got {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The admin listener's view of the record of `key` (anonymous scope): 404 when there is none.
pub async fn record_of(admin: SocketAddr, key: &str) -> Got {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    send(
        admin,
        "GET",
        &format!("/keys/{key}"),
        &[("authorization", &auth)],
        "",
    )
    .await
}

pub async fn charge_with(g: &impl Listens, key: &str, extra: &[(&str, &str)], body: &str) -> Got {
    let mut headers = vec![("idempotency-key", key)];
    headers.extend_from_slice(extra);
    send(g.addr(), "POST", "/v1/charges", &headers, body).await
}

pub const BODY: &str = r#"{"customer_id":"cus_8g2k","amount_cents":4900}"#;

/// A charge the upstream takes `sleep_ms` to answer, sent in the background.
pub fn spawn_slow_charge(
    g: &impl Listens,
    key: &'static str,
    sleep_ms: u64,
) -> tokio::task::JoinHandle<Got> {
    let addr = g.addr();
    tokio::spawn(async move {
        let ms = sleep_ms.to_string();
        send(
            addr,
            "POST",
            "/v1/charges",
            &[("idempotency-key", key), ("x-sleep-ms", &ms)],
            BODY,
        )
        .await
    })
}

/// What a storm of one key came back as: the distinct 201 bodies, and how many of each status.
pub struct Storm {
    pub bodies: std::collections::HashSet<String>,
    pub by_status: HashMap<u16, u32>,
}

/// `n` concurrent charges with one key, sent to `addrs` in turn while the upstream takes
/// `sleep_ms` to answer. Every answer must be a 201 or a 409 `in-flight`.
pub async fn storm(
    addrs: &[SocketAddr],
    key: &'static str,
    n: usize,
    sleep_ms: &'static str,
) -> Storm {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let addr = addrs[i % addrs.len()];
            tokio::spawn(async move {
                send(
                    addr,
                    "POST",
                    "/v1/charges",
                    &[("idempotency-key", key), ("x-sleep-ms", sleep_ms)],
                    BODY,
                )
                .await
            })
        })
        .collect();
    let mut out = Storm {
        bodies: Default::default(),
        by_status: HashMap::new(),
    };
    for t in tasks {
        let r = t.await.unwrap_or_else(|e| panic!("{e}"));
        *out.by_status.entry(r.status).or_default() += 1;
        if r.status == 201 {
            out.bodies.insert(r.body);
        } else {
            assert_eq!(
                (r.status, r.problem_type().as_str()),
                (409, "urn:idem:problem:in-flight"),
                "{}",
                r.body
            );
        }
    }
    out
}

/// What came back on a raw connection: everything the server wrote until it closed the
/// connection (or 5 s passed), and the status line of the first response in it.
pub struct Raw {
    pub text: String,
}

impl Raw {
    /// The status code of the first response written.
    pub fn status(&self) -> u16 {
        self.text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
    /// The `type` of the problem document in the (last) response body.
    pub fn problem_type(&self) -> String {
        let body = self.text.rsplit("\r\n\r\n").next().unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        v["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// Writes `request` to `addr` byte for byte (a client library would normalise what these
/// tests need sent as is) and reads what comes back. Send `Connection: close`.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> Raw {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.write_all(request)
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out)).await;
    Raw {
        text: String::from_utf8_lossy(&out).into_owned(),
    }
}
