//! A payment service in idem's transactional mode ([design §5](docs/design.md#5-unknown-outcomes)).
//!
//! `POST /v1/charges` claims its Idempotency-Key, inserts the charge and stores the response
//! in one PostgreSQL transaction. A crash anywhere before the commit rolls back the charge
//! and the record together, so the retry simply executes; after the commit both exist and
//! the retry replays. There is no moment at which the charge exists and the record does not,
//! which is the one case (an unknown outcome) that a separate store cannot settle.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use idem_core::{AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, StoredResponse};
use idem_http::{DEFAULT_PROBLEM_BASE, Problem};
use idem_store_postgres::PgStore;
use serde::Deserialize;

/// The service's state: the store, whose pool also serves the service's own statements.
#[derive(Debug, Clone)]
pub struct App {
    /// The idempotency store, in the same database (and schema) as the charges.
    pub store: PgStore,
    /// For the crash test: after the effect and the stored result, say so on stdout and
    /// wait this long before committing, so a test can kill the process right there.
    pub hold_before_commit: Option<Duration>,
}

#[derive(Debug, Deserialize)]
struct NewCharge {
    customer_id: String,
    amount_cents: i64,
}

/// Creates the service's own table beside idem's.
pub async fn migrate(store: &PgStore) -> anyhow::Result<()> {
    let client = store.pool().get().await?;
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS \"{}\".charges (
                id           bigserial PRIMARY KEY,
                customer_id  text   NOT NULL,
                amount_cents bigint NOT NULL
            )",
            store.schema()
        ))
        .await?;
    Ok(())
}

/// The routes.
pub fn app(state: App) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge).get(list_charges))
        .with_state(state)
}

fn axum_response(r: axum::http::Response<Bytes>) -> Response {
    r.map(axum::body::Body::from)
}

fn problem(p: &Problem) -> Response {
    axum_response(p.to_response(DEFAULT_PROBLEM_BASE))
}

fn replay(stored: Option<&StoredResponse>) -> Response {
    match stored.and_then(idem_http::capture::from_stored) {
        Some(mut resp) => {
            resp.headers_mut()
                .insert(idem_http::REPLAYED, HeaderValue::from_static("true"));
            axum_response(resp)
        }
        None => problem(&Problem::OutcomeUnknown),
    }
}

async fn create_charge(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match headers.get("idempotency-key") {
        None => return problem(&Problem::KeyMissing),
        Some(v) => match Key::from_header(v.as_bytes()) {
            Ok(k) => k,
            Err(e) => return problem(&Problem::KeyInvalid(e.to_string())),
        },
    };
    let charge: NewCharge = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("invalid charge: {e}\n")).into_response();
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let req = ClaimRequest {
        scope: idem_core::Scope::from_headers(&headers, &[header::AUTHORIZATION]),
        key,
        fingerprint: Fingerprint::http("POST", "/v1/charges", content_type, &body),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(24 * 3600),
        on_abandoned: AbandonedPolicy::Reject,
    };
    match charge_once(&app, &req, &charge).await {
        Ok(resp) => resp,
        // Nothing committed: the retry executes, with the same key.
        Err(e) => {
            eprintln!("pg-charges: transaction failed, nothing committed: {e}");
            problem(&Problem::StoreUnavailable)
        }
    }
}

/// The whole request in one transaction. Any error before the commit rolls back both the
/// charge and the record.
async fn charge_once(
    app: &App,
    req: &ClaimRequest,
    charge: &NewCharge,
) -> anyhow::Result<Response> {
    let mut client = app.store.pool().get().await?;
    let tx = client.transaction().await?;
    let lease = match app.store.claim_in(&tx, req).await? {
        Claim::Acquired(lease) => lease,
        Claim::Completed(record) => return Ok(replay(record.response.as_ref())),
        Claim::Mismatch(_) => return Ok(problem(&Problem::KeyReused)),
        // Only requests outside the transactional mode leave records in flight.
        Claim::InFlight(_) => return Ok(problem(&Problem::InFlight(Duration::from_secs(1)))),
        Claim::Abandoned(_) => return Ok(problem(&Problem::OutcomeUnknown)),
    };
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO \"{}\".charges (customer_id, amount_cents) VALUES ($1, $2) RETURNING id",
                app.store.schema()
            ),
            &[&charge.customer_id, &charge.amount_cents],
        )
        .await?;
    let id: i64 = row.try_get(0)?;
    let doc = serde_json::json!({
        "charge_id": format!("ch_{id}"),
        "customer_id": charge.customer_id,
        "amount_cents": charge.amount_cents,
    });
    let mut stored = StoredResponse::new(201, doc.to_string().into_bytes());
    stored
        .headers
        .push(("content-type".into(), b"application/json".to_vec()));
    app.store
        .complete_in(&tx, &req.scope, &req.key, lease.token, &stored)
        .await?;
    if let Some(hold) = app.hold_before_commit {
        use tokio::io::AsyncWriteExt;
        let mut out = tokio::io::stdout();
        out.write_all(b"effect and record written; holding before commit\n")
            .await?;
        out.flush().await?;
        tokio::time::sleep(hold).await;
    }
    tx.commit().await?;
    Ok(idem_http::capture::from_stored(&stored)
        .map(axum_response)
        .unwrap_or_else(|| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

async fn list_charges(State(app): State<App>) -> Response {
    let listed = async {
        let client = app.store.pool().get().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT id, customer_id, amount_cents FROM \"{}\".charges ORDER BY id",
                    app.store.schema()
                ),
                &[],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(serde_json::json!({
                "charge_id": format!("ch_{}", r.try_get::<_, i64>(0)?),
                "customer_id": r.try_get::<_, String>(1)?,
                "amount_cents": r.try_get::<_, i64>(2)?,
            }));
        }
        anyhow::Ok(out)
    };
    match listed.await {
        Ok(list) => axum::Json(list).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}
