//! The layer inside an axum service, request by request: every row of
//! [design §3](docs/design.md#3-what-a-request-with-a-key-gets), the caching rules of §4,
//! fail-closed on store errors (§6), scopes, limits and waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, MemoryStore, Policy, Record, Resolution, Scope, Store,
    StoreError, StoredResponse, Timestamp,
};
use idem_http::{Anonymous, Config, IdempotencyLayer, PathPattern, RoutePolicy, Routes};
use tower::ServiceExt;

#[derive(Clone, Default)]
struct Counter(Arc<AtomicU32>);

impl Counter {
    fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A charge endpoint that is not idempotent itself: each call makes a new charge id. The
/// `x-status` header picks its status, `x-sleep-ms` makes it slow, `x-size` pads the body,
/// `x-set-cookie` sets a cookie.
async fn charge(State(count): State<Counter>, headers: HeaderMap, body: String) -> Response {
    let n = count.0.fetch_add(1, Ordering::SeqCst) + 1;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    if let Some(ms) = header("x-sleep-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if headers.contains_key("x-panic") {
        panic!("the handler panicked");
    }
    let status = header("x-status")
        .and_then(|s| StatusCode::from_u16(s as u16).ok())
        .unwrap_or(StatusCode::CREATED);
    let pad = "x".repeat(header("x-size").unwrap_or(0) as usize);
    let body = format!(r#"{{"charge_id":"ch_{n}","request":{body:?},"pad":"{pad}"}}"#);
    let mut resp = (
        status,
        [
            ("content-type", "application/json"),
            ("x-charge", &format!("ch_{n}")),
        ],
        body,
    )
        .into_response();
    // A session for the caller: `x-set-cookie` comes back as `set-cookie`.
    if let Some(cookie) = headers.get("x-set-cookie") {
        resp.headers_mut().append("set-cookie", cookie.clone());
    }
    resp
}

fn pattern(p: &str) -> PathPattern {
    PathPattern::new(p).expect("path pattern")
}

/// The routes of these tests; callers without credentials allowed, since most tests send none
/// (the scope tests use [`Config::default`]'s refusal).
fn config(policy: RoutePolicy) -> Config {
    let routes = Routes::default()
        .route(Some(http::Method::POST), pattern("/v1/charges"), policy)
        .route(
            None,
            pattern("/v1/small"),
            RoutePolicy {
                max_body: 16,
                ..RoutePolicy::default()
            },
        );
    Config {
        routes,
        anonymous: Anonymous::Allow,
        ..Config::default()
    }
}

fn app<St: Store + Clone>(store: St, policy: RoutePolicy) -> (Router, Counter) {
    app_with(store, config(policy))
}

fn app_with<St: Store + Clone>(store: St, config: Config) -> (Router, Counter) {
    let count = Counter::default();
    let router = Router::new()
        .route("/v1/charges", post(charge).get(charge))
        .route("/v1/other", post(charge))
        .route("/v1/small", post(charge))
        .with_state(count.clone())
        .layer(IdempotencyLayer::new(store, config));
    (router, count)
}

fn post_req(path: &str, key: Option<&str>, body: &str) -> http::request::Builder {
    let mut b = Request::post(path).header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    let _ = body;
    b
}

struct Got {
    status: StatusCode,
    headers: HeaderMap,
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
}

async fn send(app: &Router, req: http::request::Builder, body: &str) -> Got {
    let req = req.body(Body::from(body.to_owned())).expect("request");
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

const BODY: &str = r#"{"customer_id":"cus_8g2k","amount_cents":4900}"#;

#[tokio::test]
async fn executes_once_and_replays_byte_for_byte() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    let first = send(&app, post_req("/v1/charges", Some("k1"), BODY), BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let again = send(&app, post_req("/v1/charges", Some("k1"), BODY), BODY).await;
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers.get("x-charge"), first.headers.get("x-charge"));
    assert_eq!(
        again.headers.get("content-type"),
        first.headers.get("content-type")
    );
    assert!(again.replayed());
    assert_eq!(count.get(), 1);
}

#[tokio::test]
async fn reordered_json_replays_and_a_changed_value_is_refused() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    send(&app, post_req("/v1/charges", Some("k1"), BODY), BODY).await;
    let reordered = r#"{ "amount_cents": 4900,
                         "customer_id": "cus_8g2k" }"#;
    let r = send(
        &app,
        post_req("/v1/charges", Some("k1"), reordered),
        reordered,
    )
    .await;
    assert!(r.replayed(), "{}", r.body);
    let changed = r#"{"customer_id":"cus_8g2k","amount_cents":4901}"#;
    let r = send(&app, post_req("/v1/charges", Some("k1"), changed), changed).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        r.headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/problem+json"[..])
    );
    assert_eq!(r.problem_type(), "urn:idem:problem:key-reused");
    // Another path with the same key is another request too.
    let r = send(&app, post_req("/v1/other", Some("k1"), BODY), BODY).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(count.get(), 1);
}

/// The same bytes under another media type are another request: 422, never the first one's
/// replay ([design §1](docs/design.md#1-words)).
#[tokio::test]
async fn another_media_type_with_the_same_bytes_is_refused() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    let patch = r#"[{"op":"replace","path":"/amount_cents","value":100}]"#;
    let as_type = |ct: &str| {
        Request::post("/v1/charges")
            .header("content-type", ct)
            .header("idempotency-key", "k-media")
    };
    let first = send(&app, as_type("application/json-patch+json"), patch).await;
    assert!(!first.replayed());
    let r = send(&app, as_type("application/merge-patch+json"), patch).await;
    assert_eq!(
        r.problem_type(),
        "urn:idem:problem:key-reused",
        "{}",
        r.body
    );
    let r = send(
        &app,
        as_type("Application/JSON-Patch+JSON; charset=utf-8"),
        patch,
    )
    .await;
    assert!(
        r.replayed(),
        "the same media type in another spelling: {}",
        r.body
    );
    let form = |ct: &str| {
        Request::post("/v1/charges")
            .header("content-type", ct)
            .header("idempotency-key", "k-form")
    };
    send(
        &app,
        form("application/x-www-form-urlencoded"),
        "amount_cents=100",
    )
    .await;
    let r = send(&app, form("text/plain"), "amount_cents=100").await;
    assert_eq!(
        r.problem_type(),
        "urn:idem:problem:key-reused",
        "{}",
        r.body
    );
    assert_eq!(count.get(), 2);
}

#[tokio::test]
async fn keys_are_required_where_configured_and_honoured_elsewhere() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    let r = send(&app, post_req("/v1/charges", None, BODY), BODY).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.problem_type(), "urn:idem:problem:key-missing");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    assert_eq!(v["status"], 400);
    assert!(v["title"].is_string() && v["detail"].is_string());
    assert_eq!(count.get(), 0);
    // Unlisted route: no key, no protection, executes each time; a key is honoured.
    send(&app, post_req("/v1/other", None, BODY), BODY).await;
    send(&app, post_req("/v1/other", None, BODY), BODY).await;
    assert_eq!(count.get(), 2);
    send(&app, post_req("/v1/other", Some("o1"), BODY), BODY).await;
    let r = send(&app, post_req("/v1/other", Some("o1"), BODY), BODY).await;
    assert!(r.replayed());
    assert_eq!(count.get(), 3);
    // Safe methods pass through, key or not.
    send(
        &app,
        Request::get("/v1/charges").header("idempotency-key", "g"),
        "",
    )
    .await;
    send(
        &app,
        Request::get("/v1/charges").header("idempotency-key", "g"),
        "",
    )
    .await;
    assert_eq!(count.get(), 5);
}

#[tokio::test]
async fn malformed_keys_get_400_key_invalid_and_execute_nothing() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    let long = "k".repeat(256);
    for bad in ["", "   ", "a b", "\"unterminated", long.as_str()] {
        let r = send(&app, post_req("/v1/charges", Some(bad), BODY), BODY).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(r.problem_type(), "urn:idem:problem:key-invalid", "{bad:?}");
    }
    let non_ascii = Request::post("/v1/charges").header(
        "idempotency-key",
        http::HeaderValue::from_bytes("café".as_bytes()).unwrap(),
    );
    let r = send(&app, non_ascii, BODY).await;
    assert_eq!(r.problem_type(), "urn:idem:problem:key-invalid");
    assert!(r.body.contains("0xc3"), "{}", r.body);
    let twice = post_req("/v1/charges", Some("a"), BODY).header("idempotency-key", "b");
    let r = send(&app, twice, BODY).await;
    assert!(r.body.contains("more than once"), "{}", r.body);
    assert_eq!(count.get(), 0);
}

#[tokio::test]
async fn bodies_over_the_route_bound_get_413() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    let r = send(
        &app,
        post_req("/v1/small", Some("s"), "0123456789abcdefg"),
        "0123456789abcdefg",
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.problem_type(), "urn:idem:problem:body-too-large");
    let r = send(
        &app,
        post_req("/v1/small", Some("s"), "0123456789abcdef"),
        "0123456789abcdef",
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(count.get(), 1);
}

#[tokio::test]
async fn scopes_keep_principals_apart() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    let as_user = |who: &str| {
        post_req("/v1/charges", Some("same"), BODY).header("authorization", format!("Bearer {who}"))
    };
    let a = send(&app, as_user("alice"), BODY).await;
    let b = send(&app, as_user("bob"), BODY).await;
    assert_ne!(a.body, b.body, "bob got alice's charge");
    assert!(!b.replayed());
    assert!(send(&app, as_user("alice"), BODY).await.replayed());
    let anon = send(&app, post_req("/v1/charges", Some("same"), BODY), BODY).await;
    assert!(!anon.replayed());
    assert_eq!(count.get(), 3);
}

/// Issue 13: `Config::default()` named callers by `Authorization` only, so callers named by a
/// cookie or an API key shared the anonymous scope, and one got another's response and
/// `Set-Cookie`. Now they are scopes of their own, and a keyed request naming no caller is
/// refused before anything runs.
#[tokio::test]
async fn by_default_cookies_and_api_keys_name_callers_and_anonymous_keys_are_refused() {
    let (app, count) = app_with(MemoryStore::new(), Config::default());
    let as_ =
        |name: &str, value: &str| post_req("/v1/charges", Some("same"), BODY).header(name, value);
    let alice = send(
        &app,
        as_("cookie", "s=alice").header("x-set-cookie", "s=alice-2"),
        BODY,
    )
    .await;
    assert_eq!(alice.status, StatusCode::CREATED, "{}", alice.body);
    assert_eq!(
        alice.headers.get("set-cookie").map(|v| v.as_bytes()),
        Some(&b"s=alice-2"[..])
    );
    let bob = send(&app, as_("cookie", "s=bob"), BODY).await;
    assert!(!bob.replayed(), "bob got alice's response: {}", bob.body);
    assert!(
        bob.headers.get("set-cookie").is_none(),
        "bob got alice's session"
    );
    let again = send(&app, as_("cookie", "s=alice"), BODY).await;
    assert!(again.replayed());
    assert_eq!(
        again.headers.get("set-cookie"),
        alice.headers.get("set-cookie")
    );
    let key1 = send(&app, as_("x-api-key", "k1"), BODY).await;
    let key2 = send(&app, as_("x-api-key", "k2"), BODY).await;
    assert!(!key1.replayed() && !key2.replayed());
    assert_eq!(count.get(), 4);
    let anon = send(&app, post_req("/v1/charges", Some("same"), BODY), BODY).await;
    assert_eq!(anon.status, StatusCode::BAD_REQUEST);
    assert_eq!(anon.problem_type(), "urn:idem:problem:principal-missing");
    assert_eq!(count.get(), 4);
}

/// Where anonymous callers are allowed, per-caller headers are not stored in their shared
/// scope (the first caller still gets them), and are dropped from a replay there even if a
/// record holds them (stored by an earlier version, or by an operator).
#[tokio::test]
async fn the_anonymous_scope_never_replays_set_cookie() {
    let store = MemoryStore::new();
    let (app, count) = app(store.clone(), RoutePolicy::requiring_key());
    let first = send(
        &app,
        post_req("/v1/charges", Some("anon"), BODY)
            .header("x-set-cookie", "s=first")
            .header("content-type", "application/json"),
        BODY,
    )
    .await;
    assert_eq!(
        first.headers.get("set-cookie").map(|v| v.as_bytes()),
        Some(&b"s=first"[..])
    );
    let key = Key::new("anon").expect("key");
    let record = store
        .get(&Scope::anonymous(), &key)
        .await
        .expect("get")
        .expect("record");
    let stored = record.response.expect("response");
    assert!(
        stored.headers.iter().all(|(n, _)| n != "set-cookie"),
        "{:?}",
        stored.headers
    );
    assert!(stored.headers.iter().any(|(n, _)| n == "x-charge"));
    let replay = send(&app, post_req("/v1/charges", Some("anon"), BODY), BODY).await;
    assert!(replay.replayed());
    assert!(replay.headers.get("set-cookie").is_none());
    assert_eq!(count.get(), 1);

    // A record that holds one anyway.
    let old = Key::new("old").expect("key");
    let claim = store
        .claim(ClaimRequest {
            scope: Scope::anonymous(),
            key: old.clone(),
            fingerprint: idem_core::Fingerprint::http(
                "POST",
                "/v1/charges",
                Some("application/json"),
                BODY.as_bytes(),
            ),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            on_abandoned: idem_core::AbandonedPolicy::Reject,
        })
        .await
        .expect("claim");
    let Claim::Acquired(lease) = claim else {
        panic!("{claim:?}")
    };
    let headers = vec![
        ("set-cookie".to_owned(), b"s=old".to_vec()),
        (
            "authentication-info".to_owned(),
            b"nextnonce=\"x\"".to_vec(),
        ),
        ("x-charge".to_owned(), b"ch_old".to_vec()),
    ];
    store
        .complete(
            &Scope::anonymous(),
            &old,
            lease.token,
            StoredResponse {
                status: 201,
                headers,
                body: idem_core::StoredBody::Full(b"{}".to_vec().into()),
            },
        )
        .await
        .expect("complete");
    let replay = send(&app, post_req("/v1/charges", Some("old"), BODY), BODY).await;
    assert!(replay.replayed(), "{}", replay.body);
    assert_eq!(
        replay.headers.get("x-charge").map(|v| v.as_bytes()),
        Some(&b"ch_old"[..])
    );
    assert!(replay.headers.get("set-cookie").is_none());
    assert!(replay.headers.get("authentication-info").is_none());
    assert_eq!(count.get(), 1);
}

#[tokio::test]
async fn not_processed_statuses_release_and_errors_are_kept() {
    let (app, count) = app(MemoryStore::new(), RoutePolicy::requiring_key());
    for (key, status) in [("r429", 429), ("r503", 503)] {
        let r = send(
            &app,
            post_req("/v1/charges", Some(key), BODY).header("x-status", status),
            BODY,
        )
        .await;
        assert_eq!(r.status.as_u16(), status);
        let r = send(&app, post_req("/v1/charges", Some(key), BODY), BODY).await;
        assert_eq!(r.status, StatusCode::CREATED, "{key} was not released");
        assert!(!r.replayed());
    }
    let r = send(
        &app,
        post_req("/v1/charges", Some("r500"), BODY).header("x-status", 500),
        BODY,
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let again = send(&app, post_req("/v1/charges", Some("r500"), BODY), BODY).await;
    assert_eq!(again.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(again.replayed());
    assert_eq!(count.get(), 5);
}

#[tokio::test]
async fn a_duplicate_in_flight_gets_409_or_waits_for_the_result() {
    for wait in [None, Some(Duration::from_secs(5))] {
        let mut policy = RoutePolicy::requiring_key();
        policy.engine.wait = wait;
        let (app, count) = app(MemoryStore::new(), policy);
        let slow = {
            let app = app.clone();
            tokio::spawn(async move {
                send(
                    &app,
                    post_req("/v1/charges", Some("k"), BODY).header("x-sleep-ms", 300),
                    BODY,
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let dup = send(&app, post_req("/v1/charges", Some("k"), BODY), BODY).await;
        let first = slow.await.unwrap();
        if wait.is_none() {
            assert_eq!(dup.status, StatusCode::CONFLICT);
            assert_eq!(dup.problem_type(), "urn:idem:problem:in-flight");
            assert_eq!(
                dup.headers.get("retry-after").map(|v| v.as_bytes()),
                Some(&b"1"[..])
            );
        } else {
            assert!(dup.replayed(), "{} {}", dup.status, dup.body);
            assert_eq!(dup.body, first.body);
        }
        assert_eq!(count.get(), 1);
    }
}

#[tokio::test]
async fn oversized_responses_are_returned_once_then_replayed_as_a_problem() {
    let policy = RoutePolicy {
        engine: Policy {
            max_stored_body: 100,
            ..Policy::default()
        },
        ..RoutePolicy::requiring_key()
    };
    let (app, count) = app(MemoryStore::new(), policy);
    let r = send(
        &app,
        post_req("/v1/charges", Some("big"), BODY).header("x-size", 500),
        BODY,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(r.body.len() > 500);
    let again = send(&app, post_req("/v1/charges", Some("big"), BODY), BODY).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.problem_type(), "urn:idem:problem:response-too-large");
    assert!(again.replayed());
    let v: serde_json::Value = serde_json::from_str(&again.body).unwrap_or_default();
    assert_eq!(v["original_status"], 201);
    assert_eq!(v["body_length"].as_u64(), Some(r.body.len() as u64));
    assert_eq!(count.get(), 1);
}

#[tokio::test]
async fn a_panicking_handler_leaves_the_key_abandoned_not_released() {
    let policy = RoutePolicy {
        engine: Policy {
            lease: Duration::from_millis(100),
            ..Policy::default()
        },
        ..RoutePolicy::requiring_key()
    };
    let (app, count) = app(MemoryStore::new(), policy);
    let crashed = {
        let app = app.clone();
        tokio::spawn(async move {
            send(
                &app,
                post_req("/v1/charges", Some("p"), BODY).header("x-panic", "1"),
                BODY,
            )
            .await
        })
    };
    assert!(crashed.await.is_err_and(|e| e.is_panic()));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = send(&app, post_req("/v1/charges", Some("p"), BODY), BODY).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.problem_type(), "urn:idem:problem:outcome-unknown");
    assert_eq!(count.get(), 1);
}

/// A store whose every call fails, as a disk or a network would.
#[derive(Clone)]
struct Broken;

fn down() -> StoreError {
    StoreError::unavailable("disk on fire")
}

impl Store for Broken {
    async fn claim(&self, _: ClaimRequest) -> Result<Claim, StoreError> {
        Err(down())
    }
    async fn complete(
        &self,
        _: &Scope,
        _: &Key,
        _: FencingToken,
        _: StoredResponse,
    ) -> Result<Record, StoreError> {
        Err(down())
    }
    async fn release(&self, _: &Scope, _: &Key, _: FencingToken) -> Result<(), StoreError> {
        Err(down())
    }
    async fn extend(
        &self,
        _: &Scope,
        _: &Key,
        _: FencingToken,
        _: Duration,
    ) -> Result<Timestamp, StoreError> {
        Err(down())
    }
    async fn get(&self, _: &Scope, _: &Key) -> Result<Option<Record>, StoreError> {
        Err(down())
    }
    async fn purge_expired(&self, _: usize) -> Result<usize, StoreError> {
        Err(down())
    }
    async fn resolve(
        &self,
        _: &Scope,
        _: &Key,
        _: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        Err(down())
    }
}

#[tokio::test]
async fn a_store_failure_fails_closed_with_503() {
    let (app, count) = app(Broken, RoutePolicy::requiring_key());
    let r = send(&app, post_req("/v1/charges", Some("k"), BODY), BODY).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem_type(), "urn:idem:problem:store-unavailable");
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(count.get(), 0, "executed without a record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_duplicates_execute_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_store_sqlite::SqliteStore::open(dir.path().join("idem.db")).unwrap();
    let (app, count) = app(store, RoutePolicy::requiring_key());
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                send(
                    &app,
                    post_req("/v1/charges", Some("storm"), BODY).header("x-sleep-ms", 50),
                    BODY,
                )
                .await
            })
        })
        .collect();
    let mut bodies = std::collections::HashSet::new();
    let (mut executed, mut replayed, mut conflict) = (0, 0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            StatusCode::CREATED if r.replayed() => replayed += 1,
            StatusCode::CREATED => executed += 1,
            StatusCode::CONFLICT => conflict += 1,
            other => panic!("unexpected {other}: {}", r.body),
        }
        if r.status == StatusCode::CREATED {
            bodies.insert(r.body);
        }
    }
    assert_eq!(count.get(), 1);
    assert_eq!(executed, 1);
    assert_eq!(bodies.len(), 1, "replays differ from the original");
    assert_eq!(executed + replayed + conflict, 100);
}

/// A duplicate that waited while the first attempt ran, and then finds the key released (the
/// first got 503), executes itself: it still has its request.
#[tokio::test]
async fn a_waiting_duplicate_executes_when_the_first_attempt_released_the_key() {
    let mut policy = RoutePolicy::requiring_key();
    policy.engine.wait = Some(Duration::from_secs(5));
    let (app, count) = app(MemoryStore::new(), policy);
    let first = {
        let app = app.clone();
        tokio::spawn(async move {
            send(
                &app,
                post_req("/v1/charges", Some("k"), BODY)
                    .header("x-sleep-ms", 300)
                    .header("x-status", 503),
                BODY,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dup = send(&app, post_req("/v1/charges", Some("k"), BODY), BODY).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(dup.status, StatusCode::CREATED, "{}", dup.body);
    assert!(!dup.replayed());
    assert_eq!(count.get(), 2);
}
