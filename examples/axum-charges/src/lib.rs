//! A payment service whose `POST /v1/charges` is made idempotent by one layer.
//!
//! The handler below is deliberately naive: every call creates a charge. The
//! [`idem_http::IdempotencyLayer`] in [`app`] is all it takes to make a retried request with
//! the same `Idempotency-Key` get the original charge back instead of a second one.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_core::Store;
use idem_http::{Config, IdempotencyLayer, PathPattern, RoutePolicy, Routes};
use serde::Deserialize;
use serde_json::{Value, json};

/// The charges made so far: (id, customer, amount).
#[derive(Debug, Clone, Default)]
pub struct Ledger(pub Arc<Mutex<Vec<(String, String, u64)>>>);

/// The request body of `POST /v1/charges`.
#[derive(Debug, Deserialize)]
pub struct NewCharge {
    customer_id: String,
    amount_cents: u64,
}

async fn create_charge(
    State(ledger): State<Ledger>,
    Json(req): Json<NewCharge>,
) -> (StatusCode, Json<Value>) {
    let mut charges = ledger.0.lock().unwrap_or_else(|p| p.into_inner());
    let id = format!("ch_{}", charges.len() + 1);
    charges.push((id.clone(), req.customer_id.clone(), req.amount_cents));
    let body = json!({ "charge_id": id, "customer_id": req.customer_id, "amount_cents": req.amount_cents });
    (StatusCode::CREATED, Json(body))
}

/// The service without idem: every request charges, retries included. What `idem serve` is
/// put in front of in docs/gateway.md.
pub fn plain_app(ledger: Ledger) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge))
        .with_state(ledger)
}

/// The service: `POST /v1/charges` requires an `Idempotency-Key`; keys are scoped by the
/// caller's credentials (`Authorization`, `Cookie`, `X-Api-Key`, ...: the default scope
/// headers), a keyed request without any is refused, and records are kept 24 hours in `store`.
pub fn app<St: Store>(store: St, ledger: Ledger) -> Router {
    let charges = PathPattern::new("/v1/charges").unwrap_or_else(|e| unreachable!("{e}"));
    let routes = Routes::default().route(
        Some(axum::http::Method::POST),
        charges,
        RoutePolicy::requiring_key(),
    );
    Router::new()
        .route("/v1/charges", post(create_charge))
        .with_state(ledger)
        .layer(IdempotencyLayer::new(
            store,
            Config {
                routes,
                ..Config::default()
            },
        ))
}
