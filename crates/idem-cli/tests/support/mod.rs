//! What the end-to-end tests of `idem serve` share: a small upstream in the test process that
//! counts how often it really executes, the real binary started on loopback, and a client.
// Each test binary uses part of this.
#![allow(dead_code, unreachable_pub)]
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
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

#[derive(Clone, Default)]
pub struct Upstream(pub Arc<AtomicU32>);

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
    (
        status,
        [
            ("content-type", "application/json"),
            ("x-charge", &format!("ch_{n}")),
        ],
        doc.to_string(),
    )
        .into_response()
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
        .expect("stalling response")
}

pub async fn start_upstream() -> (SocketAddr, Upstream) {
    let up = Upstream::default();
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/other", post(charge))
        .route("/v1/read", get(charge))
        .route("/v1/stall", post(stall))
        .with_state(up.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the upstream");
    let addr = listener.local_addr().expect("upstream address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, up)
}

pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub db: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const CONFIG: &str = r#"
scope_headers = ["authorization"]
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

pub fn start_gateway(upstream: &str, extra_config: &str) -> Gateway {
    start_gateway_limited(upstream, extra_config, None)
}

/// With `file_size_kib`, the gateway runs under `ulimit -f`: writes past that size fail with
/// EFBIG, as on a full disk (SIGXFSZ is ignored so the write fails instead of killing it).
pub fn start_gateway_limited(
    upstream: &str,
    extra_config: &str,
    file_size_kib: Option<u32>,
) -> Gateway {
    spawn_gateway(upstream, extra_config, file_size_kib, None)
}

/// A gateway on a shared store (postgres://..., redis://...).
pub fn start_gateway_on(upstream: &str, extra_config: &str, store: &str) -> Gateway {
    spawn_gateway(upstream, extra_config, None, Some(store))
}

fn spawn_gateway(
    upstream: &str,
    extra_config: &str,
    file_size_kib: Option<u32>,
    store: Option<&str>,
) -> Gateway {
    let dir = tempfile::tempdir().expect("temporary directory");
    let db = dir.path().join("idem.db");
    let store = store.map_or_else(|| format!("sqlite:{}", db.display()), str::to_owned);
    let config = dir.path().join("idem.toml");
    std::fs::write(&config, format!("{CONFIG}\n{extra_config}")).expect("write the gateway config");
    let mut command = match file_size_kib {
        None => Command::new(env!("CARGO_BIN_EXE_idem")),
        Some(kib) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_idem"))
                // Every refused request logs an error; hundreds of them are noise here.
                .env("IDEM_LOG", "off");
            c
        }
    };
    let mut child = command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
        ])
        .arg("--store")
        .arg(&store)
        .arg("--config")
        .arg(&config)
        .env("TEST_ADMIN_TOKEN", "s3cret")
        .env_remove("IDEM_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn idem serve");
    let stdout = child.stdout.take().expect("no stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the gateway's first line");
    // "idem serve: listening on A; admin on B; ..."
    let addr_after = |marker: &str| -> SocketAddr {
        let rest = line
            .split(marker)
            .nth(1)
            .unwrap_or_else(|| panic!("no {marker:?} in {line:?}"));
        let text = rest.split(';').next().unwrap_or("").trim();
        text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"))
    };
    let (addr, admin) = (addr_after("listening on "), addr_after("admin on "));
    Gateway {
        child,
        addr,
        admin,
        db,
        _dir: dir,
    }
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
        .expect("request");
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

pub async fn charge_with(g: &Gateway, key: &str, extra: &[(&str, &str)], body: &str) -> Got {
    let mut headers = vec![("idempotency-key", key)];
    headers.extend_from_slice(extra);
    send(g.addr, "POST", "/v1/charges", &headers, body).await
}

pub const BODY: &str = r#"{"customer_id":"cus_8g2k","amount_cents":4900}"#;

/// A charge the upstream takes `sleep_ms` to answer, sent in the background.
pub fn spawn_slow_charge(
    g: &Gateway,
    key: &'static str,
    sleep_ms: u64,
) -> tokio::task::JoinHandle<Got> {
    let addr = g.addr;
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
        let r = t.await.expect("request task");
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
