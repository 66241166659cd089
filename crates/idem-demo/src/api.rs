//! The example payment API: `POST /v1/charges` makes a charge, every time. It is deliberately
//! not idempotent, like most APIs an agent calls, and keeps its charges in SQLite so that the
//! demo counts what really happened, not what it thinks happened.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

type Db = Arc<Mutex<Connection>>;

/// Opens (creating) the API's database.
pub fn open(path: &Path) -> Result<Db> {
    let conn = Connection::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE IF NOT EXISTS charges (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             customer_id TEXT NOT NULL,
             amount_cents INTEGER NOT NULL
         );",
    )?;
    Ok(Arc::new(Mutex::new(conn)))
}

#[derive(Deserialize)]
struct NewCharge {
    customer_id: String,
    amount_cents: i64,
}

async fn create(State(db): State<Db>, Json(req): Json<NewCharge>) -> (StatusCode, Json<Value>) {
    let conn = db.lock().unwrap_or_else(|p| p.into_inner());
    let inserted = conn
        .execute(
            "INSERT INTO charges (customer_id, amount_cents) VALUES (?1, ?2)",
            params![req.customer_id, req.amount_cents],
        )
        .map(|_| conn.last_insert_rowid());
    match inserted {
        Ok(id) => (
            StatusCode::OK,
            Json(
                json!({ "charge_id": format!("ch_{id}"), "customer_id": req.customer_id, "amount_cents": req.amount_cents }),
            ),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": e.to_string() })),
        ),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    customer: Option<String>,
}

async fn list(State(db): State<Db>, Query(q): Query<ListQuery>) -> (StatusCode, Json<Value>) {
    let conn = db.lock().unwrap_or_else(|p| p.into_inner());
    let rows: rusqlite::Result<Vec<Value>> = conn
        .prepare("SELECT id, customer_id, amount_cents FROM charges WHERE ?1 IS NULL OR customer_id = ?1 ORDER BY id")
        .and_then(|mut stmt| {
            stmt.query_map(params![q.customer], |r| {
                Ok(json!({ "charge_id": format!("ch_{}", r.get::<_, i64>(0)?), "customer_id": r.get::<_, String>(1)?, "amount_cents": r.get::<_, i64>(2)? }))
            })?
            .collect()
        });
    match rows {
        Ok(rows) => (StatusCode::OK, Json(json!({ "data": rows }))),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": e.to_string() })),
        ),
    }
}

/// The API's routes.
pub fn router(db: Db) -> Router {
    Router::new()
        .route("/v1/charges", post(create).get(list))
        .with_state(db)
}

/// What the database says happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Charges created.
    pub charges: u64,
    /// Charges beyond the first per customer.
    pub duplicate_charges: u64,
    /// Customers charged more than once.
    pub customers_double_charged: u64,
}

/// Counts the charges in the API's database.
pub fn count(path: &Path) -> Result<Counts> {
    let conn = Connection::open(path)?;
    let (charges, customers, doubled): (i64, i64, i64) = conn.query_row(
        "SELECT count(*), count(DISTINCT customer_id),
                (SELECT count(*) FROM (SELECT customer_id FROM charges GROUP BY customer_id HAVING count(*) > 1))
         FROM charges",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(Counts {
        charges: charges as u64,
        duplicate_charges: (charges - customers) as u64,
        customers_double_charged: doubled as u64,
    })
}
