//! The example payment service of the HTTP conformance suite (`conformance/http`) on axum,
//! made idempotent by the tower layer configured from the same TOML file as every other front
//! end:
//!
//! ```sh
//! PORT=3000 IDEM_CONFIG=conformance/http/idem.toml IDEM_STORE=sqlite:idem.db LEDGER=ledger.jsonl \
//!   cargo run -p example-axum-charges --bin conformance-service
//! ```
//!
//! It serves the contract of `examples/services/python/ledger.py`: `POST /v1/charges` and
//! `/v1/waits` charge (a line appended to `$LEDGER`), with `simulate` asking for a slow
//! answer, a handler error after the charge, a status, a large body or a cookie;
//! `GET /v1/charges` counts; `POST /v1/echo` echoes. `IDEM_CONFIG=off` runs it bare.

use std::io::Write as _;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_http::{FileConfig, IdempotencyLayer};
use serde_json::{Value, json};

fn ledger() -> String {
    std::env::var("LEDGER").unwrap_or_else(|_| "ledger.jsonl".into())
}

/// The request's fields: JSON, or a form.
fn fields(headers: &HeaderMap, body: &[u8]) -> serde_json::Map<String, Value> {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    if form {
        return form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
            .collect();
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

fn number(f: &serde_json::Map<String, Value>, name: &str) -> Option<u64> {
    f.get(name).and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    })
}

/// A handler error after the charge: the layer sees it as the service failing.
#[derive(Debug)]
struct Raised(String);

async fn create_charge(headers: HeaderMap, body: Bytes) -> Result<Response, Raised> {
    let f = fields(&headers, &body);
    let simulate = f.get("simulate").and_then(Value::as_str).unwrap_or("");
    let status = if simulate == "status" {
        number(&f, "status")
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(201)
    } else {
        201
    };
    let mut charge = json!({
        "id": format!("ch_{:012x}", rand::random::<u64>() >> 16),
        "object": "charge",
        "customer": f.get("customer").cloned().unwrap_or(Value::Null),
        "amount": number(&f, "amount_cents").or_else(|| number(&f, "amount")).unwrap_or(0),
    });
    if status != 429 && status != 503 {
        // One short O_APPEND write per charge: lines from many processes never interleave.
        let line = format!("{charge}\n");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(ledger())
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .map_err(|e| Raised(e.to_string()))?;
    }
    let mut extra = HeaderMap::new();
    match simulate {
        "slow" => {
            tokio::time::sleep(Duration::from_millis(
                number(&f, "delay_ms").unwrap_or(1500),
            ))
            .await;
        }
        "raise" => return Err(Raised(format!("failed after charging {}", charge["id"]))),
        "large" => {
            let size = number(&f, "size")
                .and_then(|s| usize::try_from(s).ok())
                .unwrap_or(2 << 20);
            charge["padding"] = Value::String("x".repeat(size));
        }
        "cookie" => {
            if let Ok(v) = format!(
                "session={}; Path=/; HttpOnly",
                charge["id"].as_str().unwrap_or("")
            )
            .parse()
            {
                extra.insert(header::SET_COOKIE, v);
            }
        }
        _ => {}
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::CREATED);
    Ok((status, extra, axum::Json(charge)).into_response())
}

impl IntoResponse for Raised {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0).into_response()
    }
}

async fn count() -> axum::Json<Value> {
    let n = std::fs::read_to_string(ledger()).map_or(0, |t| t.lines().count());
    axum::Json(json!({ "count": n }))
}

async fn echo(body: String) -> axum::Json<Value> {
    axum::Json(json!({ "echo": body }))
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("error: {what}: {e}");
    std::process::exit(1);
}

#[tokio::main]
async fn main() {
    let router = Router::new()
        .route("/v1/charges", post(create_charge).get(count))
        .route("/v1/waits", post(create_charge))
        .route("/v1/echo", post(echo));
    let config = std::env::var("IDEM_CONFIG").unwrap_or_else(|_| "idem.toml".into());
    let router = if config == "off" {
        router
    } else {
        let file = FileConfig::load(std::path::Path::new(&config))
            .unwrap_or_else(|e| fail(&config, format!("{e:#}")));
        let url: idem_stores::StoreUrl = std::env::var("IDEM_STORE")
            .ok()
            .or_else(|| file.store.clone())
            .unwrap_or_else(|| idem_stores::DEFAULT_STORE.to_owned())
            .parse()
            .unwrap_or_else(|e| fail("the store URL", e));
        let http = file
            .http()
            .unwrap_or_else(|e| fail(&config, format!("{e:#}")));
        let store = url.open().await.unwrap_or_else(|e| fail("the store", e));
        router.layer(IdempotencyLayer::new(store, http))
    };
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}"))
        .await
        .unwrap_or_else(|e| fail("listen", e));
    println!("listening {port}");
    if let Err(e) = axum::serve(listener, router).await {
        fail("serve", e);
    }
}
