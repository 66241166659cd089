//! The example does what its README promises: a retry is the same charge, not a second one.

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;

use example_axum_charges::{Ledger, app, plain_app};

async fn post(app: &axum::Router, key: &str) -> (u16, bool, serde_json::Value) {
    let req = Request::post("/v1/charges")
        .header("idempotency-key", key)
        // The caller: keys are scoped by it, and a keyed request naming none is refused.
        .header("authorization", "Bearer shop-1")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"customer_id":"cus_1","amount_cents":4900}"#))
        .expect("charge request");
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    let replayed = resp.headers().contains_key("idempotent-replayed");
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    (
        status,
        replayed,
        serde_json::from_slice(&bytes).unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_retried_charge_is_the_same_charge() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_store_sqlite::SqliteStore::open(dir.path().join("charges.db")).unwrap();
    let ledger = Ledger::default();
    let app = app(store, ledger.clone());
    let (s1, r1, b1) = post(&app, "order-17").await;
    let (s2, r2, b2) = post(&app, "order-17").await;
    assert_eq!((s1, r1), (201, false));
    assert_eq!((s2, r2), (201, true));
    assert_eq!(b1, b2);
    assert_eq!(b1["charge_id"], "ch_1");
    let (_, _, b3) = post(&app, "order-18").await;
    assert_eq!(b3["charge_id"], "ch_2");
    assert_eq!(ledger.0.lock().map(|l| l.len()).unwrap_or(0), 2);
}

#[tokio::test]
async fn without_the_layer_a_retry_charges_again() {
    let ledger = Ledger::default();
    let app = plain_app(ledger.clone());
    let (_, _, b1) = post(&app, "order-17").await;
    let (_, replayed, b2) = post(&app, "order-17").await;
    assert!(!replayed);
    assert_ne!(b1["charge_id"], b2["charge_id"]);
    assert_eq!(ledger.0.lock().map(|l| l.len()).unwrap_or(0), 2);
}
