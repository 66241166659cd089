//! What the layer adds inside a Rust service: the same axum handler called through
//! `Router::oneshot`, without the layer, and with it over the memory store (new keys, replays).
//!
//! Run: `cargo bench -p idem-http --bench layer`

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
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

fn router(with_layer: bool) -> Router {
    let r = Router::new().route("/v1/charges", post(handler));
    if !with_layer {
        return r;
    }
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
            ..Config::default()
        },
    ))
}

static NEXT: AtomicU64 = AtomicU64::new(0);

async fn call(app: &Router, key: Option<String>) {
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

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("layer");
    group.throughput(Throughput::Elements(1));
    let plain = router(false);
    let layered = router(true);
    rt.block_on(call(&layered, Some("replay".into())));
    group.bench_function("handler_without_layer", |b| {
        b.to_async(&rt).iter(|| call(&plain, None));
    });
    group.bench_function("layer_memory_new_key", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("k{}", NEXT.fetch_add(1, Ordering::Relaxed));
            call(&layered, Some(key))
        });
    });
    group.bench_function("layer_memory_replay", |b| {
        b.to_async(&rt)
            .iter(|| call(&layered, Some("replay".into())));
    });
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
