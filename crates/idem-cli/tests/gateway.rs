//! `idem serve` end to end: the real binary on loopback, a real SQLite file, and a small
//! upstream in this process that counts how often it really executes.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
struct Upstream(Arc<AtomicU32>);

async fn charge(
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
struct Stalls(bool);

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

async fn stall(State(up): State<Upstream>) -> axum::response::Response {
    up.0.fetch_add(1, Ordering::SeqCst);
    axum::response::Response::builder()
        .status(201)
        .header("content-length", "100")
        .body(axum::body::Body::new(Stalls(false)))
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn start_upstream() -> (SocketAddr, Upstream) {
    let up = Upstream::default();
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/other", post(charge))
        .route("/v1/read", get(charge))
        .route("/v1/stall", post(stall))
        .with_state(up.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, up)
}

struct Gateway {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const CONFIG: &str = r#"
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

fn start_gateway(upstream: &str, extra_config: &str) -> Gateway {
    start_gateway_limited(upstream, extra_config, None)
}

/// With `file_size_kib`, the gateway runs under `ulimit -f`: writes past that size fail with
/// EFBIG, as on a full disk (SIGXFSZ is ignored so the write fails instead of killing it).
fn start_gateway_limited(
    upstream: &str,
    extra_config: &str,
    file_size_kib: Option<u32>,
) -> Gateway {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let db = dir.path().join("idem.db");
    let config = dir.path().join("idem.toml");
    std::fs::write(&config, format!("{CONFIG}\n{extra_config}")).unwrap_or_else(|e| panic!("{e}"));
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
        .arg(format!("sqlite:{}", db.display()))
        .arg("--config")
        .arg(&config)
        .env("TEST_ADMIN_TOKEN", "s3cret")
        .env_remove("IDEM_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn idem serve: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("{e}"));
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

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: String,
}

impl Got {
    fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_default();
        v["type"].as_str().unwrap_or_default().to_owned()
    }
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

async fn send(
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

async fn charge_with(g: &Gateway, key: &str, extra: &[(&str, &str)], body: &str) -> Got {
    let mut headers = vec![("idempotency-key", key)];
    headers.extend_from_slice(extra);
    send(g.addr, "POST", "/v1/charges", &headers, body).await
}

const BODY: &str = r#"{"customer_id":"cus_8g2k","amount_cents":4900}"#;

/// A charge the upstream takes `sleep_ms` to answer, sent in the background.
fn spawn_slow_charge(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_table_through_the_real_gateway() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");

    // Nothing stored: execute once; the key passes through to the upstream.
    let first = charge_with(&g, "k1", &[], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.json()["headers"]["idempotency-key"], "k1");
    // Completed, same request: the stored status, body and kept headers, byte for byte.
    let again = charge_with(
        &g,
        "k1",
        &[],
        r#"{ "amount_cents": 4900, "customer_id": "cus_8g2k" }"#,
    )
    .await;
    assert!(again.replayed());
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(again.headers.get("x-charge"), first.headers.get("x-charge"));
    assert_eq!(
        again.headers.get("content-type"),
        first.headers.get("content-type")
    );
    // Other request, same key: 422.
    let other = charge_with(
        &g,
        "k1",
        &[],
        r#"{"customer_id":"cus_8g2k","amount_cents":1}"#,
    )
    .await;
    assert_eq!(
        (other.status, other.problem_type().as_str()),
        (422, "urn:idem:problem:key-reused")
    );
    // In flight: 409 with Retry-After.
    let slow = spawn_slow_charge(&g, "k2", 500);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let dup = charge_with(&g, "k2", &[], BODY).await;
    assert_eq!(
        (dup.status, dup.problem_type().as_str()),
        (409, "urn:idem:problem:in-flight")
    );
    assert!(dup.headers.contains_key("retry-after"));
    assert_eq!(slow.await.map(|r| r.status).ok(), Some(201));
    // Missing, malformed, too long, non-ASCII keys; oversized bodies.
    let missing = send(g.addr, "POST", "/v1/charges", &[], BODY).await;
    assert_eq!(
        (missing.status, missing.problem_type().as_str()),
        (400, "urn:idem:problem:key-missing")
    );
    let long = "k".repeat(256);
    for bad in ["", "a b", long.as_str()] {
        let r = charge_with(&g, bad, &[], BODY).await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (400, "urn:idem:problem:key-invalid"),
            "{bad:?}"
        );
    }
    let r = send(
        g.addr,
        "POST",
        "/v1/charges",
        &[("idempotency-key", "caf\u{e9}")],
        BODY,
    )
    .await;
    assert_eq!(r.status, 400);
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(5000));
    let r = charge_with(&g, "k3", &[], &big).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (413, "urn:idem:problem:body-too-large")
    );
    // Reads pass through untouched.
    assert_eq!(
        send(g.addr, "GET", "/v1/read", &[("idempotency-key", "k1")], "")
            .await
            .status,
        201
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 3, "upstream executions");

    // Hop-by-hop headers are dropped; X-Forwarded-* are added.
    let r = charge_with(
        &g,
        "k4",
        &[
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("host", "shop.example"),
        ],
        BODY,
    )
    .await;
    let seen = &r.json()["headers"];
    assert!(seen.get("x-hop").is_none(), "{seen}");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "shop.example");

    // The admin listener: token required; the record as `idem inspect --json` shows it.
    let unauthorised = send(g.admin, "GET", "/keys/k1", &[], "").await;
    assert_eq!(unauthorised.status, 401);
    let rec = send(
        g.admin,
        "GET",
        "/keys/k1",
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    assert_eq!(rec.status, 200, "{}", rec.body);
    assert_eq!(rec.json()["state"], "completed");
    assert_eq!(rec.json()["response"]["status"], 201);
    let metrics = send(
        g.admin,
        "GET",
        "/metrics",
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    for want in [
        r#"idem_requests_total{outcome="executed"} 3"#,
        r#"idem_requests_total{outcome="replayed"} 1"#,
        r#"idem_requests_total{outcome="mismatch"} 1"#,
        r#"idem_requests_total{outcome="conflict"} 1"#,
        r#"idem_requests_total{outcome="missing"} 1"#,
        r#"idem_requests_total{outcome="invalid"} 5"#,
        "idem_store_call_seconds_bucket",
    ] {
        assert!(
            metrics.body.contains(want),
            "metrics lack {want}:\n{}",
            metrics.body
        );
    }
    assert_eq!(send(g.admin, "GET", "/healthz", &[], "").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_requests_with_one_key_execute_once() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let addr = g.addr;
            tokio::spawn(async move {
                send(
                    addr,
                    "POST",
                    "/v1/charges",
                    &[("idempotency-key", "storm"), ("x-sleep-ms", "100")],
                    BODY,
                )
                .await
            })
        })
        .collect();
    let mut bodies = std::collections::HashSet::new();
    let mut by_status: HashMap<u16, u32> = HashMap::new();
    for t in tasks {
        let r = t.await.unwrap_or_else(|e| panic!("{e}"));
        *by_status.entry(r.status).or_default() += 1;
        if r.status == 201 {
            bodies.insert(r.body);
        } else {
            assert_eq!(
                (r.status, r.problem_type().as_str()),
                (409, "urn:idem:problem:in-flight")
            );
        }
    }
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        1,
        "upstream executions; answers: {by_status:?}"
    );
    assert_eq!(bodies.len(), 1);
    // Different principals with the same key are different records.
    for who in ["alice", "bob"] {
        let auth = format!("Bearer {who}");
        let r = charge_with(&g, "shared", &[("authorization", &auth)], BODY).await;
        assert!(!r.replayed());
    }
    assert_eq!(up.0.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_processed_statuses_and_refused_connections_release_the_key() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");
    for status in ["429", "503"] {
        let key = format!("r{status}");
        assert_eq!(
            charge_with(&g, &key, &[("x-status", status)], BODY)
                .await
                .status
                .to_string(),
            status
        );
        let retry = charge_with(&g, &key, &[], BODY).await;
        assert_eq!(retry.status, 201, "{status} did not release the key");
    }
    assert_eq!(up.0.load(Ordering::SeqCst), 4);

    // An upstream that refuses connections: 502, and nothing is recorded.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let dead_addr = dead.local_addr().unwrap_or_else(|e| panic!("{e}"));
    drop(dead);
    let g = start_gateway(&format!("http://{dead_addr}"), "");
    let r = charge_with(&g, "refused", &[], BODY).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (502, "urn:idem:problem:upstream-unreachable")
    );
    let rec = send(
        g.admin,
        "GET",
        "/keys/refused",
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    assert_eq!(rec.status, 404, "the key was not released: {}", rec.body);
}

fn idem(args: &[&str], db: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .arg("--store")
        .arg(format!("sqlite:{}", db.display()))
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_is_an_unknown_outcome_until_an_operator_resolves_it() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");
    let auth = ("authorization", "Bearer agent-7");
    let r = charge_with(&g, "slowpoke", &[("x-sleep-ms", "2500"), auth], BODY).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (504, "urn:idem:problem:upstream-timeout")
    );
    let retry = charge_with(&g, "slowpoke", &[auth], BODY).await;
    assert_eq!(
        (retry.status, retry.problem_type().as_str()),
        (409, "urn:idem:problem:outcome-unknown")
    );
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        1,
        "the unknown outcome was retried"
    );

    // The record is the caller's, not the anonymous scope's; the operator names the caller.
    let anonymous = idem(&["inspect", "slowpoke"], &g.db);
    assert!(!anonymous.status.success());
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("--principal"),
        "{anonymous:?}"
    );
    let principal = "authorization: Bearer agent-7";
    let inspect = idem(&["inspect", "slowpoke", "--principal", principal], &g.db);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("abandoned"), "{inspect:?}");
    assert!(
        text.contains("never"),
        "an abandoned record does not expire: {text}"
    );
    let body = g.db.with_file_name("resolved.json");
    std::fs::write(&body, r#"{"charge_id":"ch_1","resolved":true}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    let body_arg = body.display().to_string();
    let resolved = idem(
        &[
            "resolve",
            "slowpoke",
            "--principal",
            principal,
            "--status",
            "201",
            "--body",
            &body_arg,
            "--header",
            "content-type: application/json",
        ],
        &g.db,
    );
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    let replay = charge_with(&g, "slowpoke", &[auth], BODY).await;
    assert!(replay.replayed());
    assert_eq!(
        (replay.status, replay.body.as_str()),
        (201, r#"{"charge_id":"ch_1","resolved":true}"#)
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests() {
    let (up_addr, up) = start_upstream().await;
    let mut g = start_gateway(&format!("http://{up_addr}"), "");
    let in_flight = spawn_slow_charge(&g, "drain", 700);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = g.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(killed.success());
    let r = in_flight.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 201, "the in-flight request was cut: {}", r.body);
    let status = g.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
    // The result was stored before the gateway exited.
    let inspect = idem(&["inspect", "drain"], &g.db);
    assert!(
        String::from_utf8_lossy(&inspect.stdout).contains("completed"),
        "{inspect:?}"
    );
}

/// The store's disk fills up under the gateway: requests it cannot record get 503
/// `store-unavailable`, and the upstream never executes a request that got one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_write_fails_closed() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway_limited(&format!("http://{up_addr}"), "", Some(64));
    let (mut created, mut unavailable) = (0, 0);
    // Small requests, many keys: the claims themselves must grow the file.
    for i in 0..400 {
        let r = charge_with(&g, &format!("full-{i}"), &[], BODY).await;
        match r.status {
            201 => created += 1,
            503 => {
                assert_eq!(r.problem_type(), "urn:idem:problem:store-unavailable");
                unavailable += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    assert!(
        unavailable > 0,
        "the disk never filled up ({created} created); raise the request count"
    );
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        created,
        "the upstream executed a request the store could not record ({created} created, {unavailable} refused)"
    );
}

/// An upstream that sends its headers and then stalls mid-body is an unknown outcome at the
/// upstream deadline, like one that never answers: the key is not held forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_an_unknown_outcome_at_the_deadline() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");
    let r = send(
        g.addr,
        "POST",
        "/v1/stall",
        &[("idempotency-key", "stall")],
        BODY,
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.body);
    let retry = send(
        g.addr,
        "POST",
        "/v1/stall",
        &[("idempotency-key", "stall")],
        BODY,
    )
    .await;
    assert_eq!(
        (retry.status, retry.problem_type().as_str()),
        (409, "urn:idem:problem:outcome-unknown")
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// A client that hangs up mid-request does not cancel the execution: the answer is stored,
/// and the retry with the same key replays it instead of finding an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_does_not_abandon_the_execution() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");
    let hung_up = tokio::time::timeout(
        Duration::from_millis(200),
        charge_with(&g, "hangup", &[("x-sleep-ms", "700")], BODY),
    )
    .await;
    assert!(hung_up.is_err(), "the client was meant to give up first");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let retry = charge_with(&g, "hangup", &[], BODY).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert!(retry.replayed());
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}
