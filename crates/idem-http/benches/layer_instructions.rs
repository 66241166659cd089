//! Instructions per keyed request through the layer, for `valgrind --tool=callgrind`, whose
//! counts are the same run after run on a busy machine (wall-clock benchmarks are not; see
//! `layer.rs` for those). One thread, the memory store, the same handler as `layer.rs`.
//!
//! ```sh
//! cargo bench -p idem-http --bench layer_instructions --no-run
//! for mode in plain new replay replay-uncached; do
//!   for n in 0 10000; do
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/layer_instructions-* $mode $n 2>&1 | grep refs
//!   done
//! done
//! ```
//! (instructions of `n` = 10000, less those of `n` = 0, over 10000: one request's.)

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

fn router(layer: Option<u64>) -> Router {
    let r = Router::new().route("/v1/charges", post(handler));
    let Some(cache_bytes) = layer else {
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
            anonymous: idem_http::Anonymous::Allow,
            cache_bytes,
            ..Config::default()
        },
    ))
}

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

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mode = args.next().unwrap_or_else(|| "replay".to_owned());
    let n: u64 = args
        .next()
        .map_or(10_000, |s| s.parse().unwrap_or_else(|e| panic!("{e}")));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let app = match mode.as_str() {
        "plain" => router(None),
        "replay-uncached" => router(Some(0)),
        "new" | "replay" => router(Some(idem_http::DEFAULT_CACHE_BYTES)),
        other => panic!("mode is plain, new, replay or replay-uncached, not {other}"),
    };
    rt.block_on(async {
        // The stored record the replays repeat, and every lazy initialisation, before
        // the counted calls.
        call(&app, (mode != "plain").then(|| "replay".to_owned())).await;
        for i in 0..n {
            let key = match mode.as_str() {
                "plain" => None,
                "new" => Some(format!("k{i}")),
                _ => Some("replay".to_owned()),
            };
            call(&app, key).await;
        }
    });
}
