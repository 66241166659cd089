//! The admin listener: `/healthz`, `/metrics` (Prometheus) and `/keys/{key}?scope=`, on its
//! own address (loopback by default), optionally behind a bearer token.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use idem_core::{Clock, Key, Scope, Store, SystemClock};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

struct AdminState<St> {
    store: St,
    metrics: PrometheusHandle,
    token: Option<String>,
}

/// The admin router.
pub fn router<St: Store + Clone>(
    store: St,
    metrics: PrometheusHandle,
    token: Option<String>,
) -> Router {
    let state = Arc::new(AdminState {
        store,
        metrics,
        token,
    });
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics_page::<St>))
        .route("/keys/{key}", get(key_page::<St>))
        .with_state(state)
}

fn problem(status: StatusCode, detail: String) -> Response {
    let body =
        json!({ "title": status.canonical_reason(), "status": status.as_u16(), "detail": detail });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// The credentials of `Authorization: Bearer <token>`; the scheme in any case (RFC 9110
/// §11.1), then one or more spaces (§11.4).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// `None` when allowed; the refusal otherwise. Compares in constant time.
fn refused<St>(state: &AdminState<St>, headers: &HeaderMap) -> Option<Response> {
    let want = state.token.as_ref()?;
    let got = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .unwrap_or("");
    let same = got.len() == want.len()
        && got
            .bytes()
            .zip(want.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        None
    } else {
        let mut resp = problem(
            StatusCode::UNAUTHORIZED,
            "this admin listener needs Authorization: Bearer <token>".into(),
        );
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        Some(resp)
    }
}

async fn metrics_page<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = refused(&state, &headers) {
        return r;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct KeyQuery {
    scope: Option<String>,
}

async fn key_page<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    Path(key): Path<String>,
    Query(q): Query<KeyQuery>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = refused(&state, &headers) {
        return r;
    }
    let key = match Key::new(key) {
        Ok(k) => k,
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("invalid key: {e}")),
    };
    let scope = match q.scope.map(Scope::new).transpose() {
        Ok(s) => s.unwrap_or_else(Scope::anonymous),
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("invalid scope: {e}")),
    };
    match state.store.get(&scope, &key).await {
        Ok(Some(record)) => {
            Json(idem_core::report::to_json(&record, SystemClock.now())).into_response()
        }
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            format!(
                "no record for key {:?} in scope {:?}",
                key.as_str(),
                scope.as_str()
            ),
        ),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}
