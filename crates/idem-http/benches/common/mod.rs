//! What both layer benchmarks send through: one axum handler, with or without the layer over
//! the memory store, and one keyed call (`layer.rs` times it, `layer_instructions.rs` counts
//! its instructions).

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use http_body_util::BodyExt;
use idem_core::MemoryStore;
use idem_http::{Config, IdempotencyLayer, PathPattern, RoutePolicy, Routes};
use tower::ServiceExt;

const BODY: &str = r#"{"customer_id":"cus_8g2k","amount_cents":4900}"#;

async fn handler(body: String) -> (http::StatusCode, [(&'static str, &'static str); 1], String) {
    (
        http::StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"charge_id":"ch_1","len":{}}}"#, body.len()),
    )
}

/// The handler alone (`None`), or behind the layer with a completed-record cache of that many
/// bytes (0: none).
pub(crate) fn router(cache_bytes: Option<u64>) -> Router {
    let r = Router::new().route("/v1/charges", post(handler));
    let Some(cache_bytes) = cache_bytes else {
        return r;
    };
    let routes = Routes::default().route(
        Some(http::Method::POST),
        PathPattern::new("/v1/charges").unwrap_or_else(|e| panic!("{e}")),
        RoutePolicy::requiring_key(),
    );
    r.layer(IdempotencyLayer::new(
        MemoryStore::new(),
        Config {
            routes,
            // The benchmark's requests carry no credentials.
            anonymous: idem_http::Anonymous::Allow,
            cache_bytes,
            ..Config::default()
        },
    ))
}

/// One POST of the charge body, with `key` as its Idempotency-Key if given; the answer must
/// be a success, and its body is read.
pub(crate) async fn call(app: &Router, key: Option<String>) {
    let mut req = Request::post("/v1/charges").header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let req = req.body(Body::from(BODY)).unwrap_or_else(|e| panic!("{e}"));
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    assert!(resp.status().is_success());
    let _ = resp.into_body().collect().await;
}
