//! The example payment API charges on every call, by design, and lists what it charged.

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

async fn call(app: &axum::Router, req: Request<Body>) -> Value {
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    assert!(resp.status().is_success(), "{}", resp.status());
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or_default()
}

fn charge(customer: &str) -> Request<Body> {
    Request::post("/v1/charges")
        .header("content-type", "application/json")
        .body(Body::from(format!(
            r#"{{"customer_id":"{customer}","amount_cents":4900}}"#
        )))
        .expect("charge request")
}

#[tokio::test]
async fn every_post_is_a_new_charge_and_the_list_shows_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("charges.db");
    let app = idem_demo::api::router(idem_demo::api::open(&db).unwrap());
    let a = call(&app, charge("cus_1")).await;
    let b = call(&app, charge("cus_1")).await;
    call(&app, charge("cus_2")).await;
    assert_eq!(
        (a["charge_id"].as_str(), b["charge_id"].as_str()),
        (Some("ch_1"), Some("ch_2"))
    );
    let list = call(
        &app,
        Request::get("/v1/charges?customer=cus_1")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let ids: Vec<&str> = list["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["charge_id"].as_str())
        .collect();
    assert_eq!(ids, vec!["ch_1", "ch_2"]);
    let counts = idem_demo::api::count(&db).unwrap();
    assert_eq!(
        (
            counts.charges,
            counts.duplicate_charges,
            counts.customers_double_charged
        ),
        (3, 1, 1)
    );
}
