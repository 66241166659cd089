//! The admin listener: `/healthz`, `/metrics` (Prometheus), `/keys/{key}?scope=` and the
//! admin page under `/ui`, on its own address (loopback by default), optionally behind a
//! token.
//!
//! - `access`: the bearer token, the page's login cookie and its forms' protection.
//! - `ui`: the page (records abandoned first, search, a record's timeline, resolve).
//! - `timeline`, `counts`, `html`: what the page shows, and how it is escaped.

mod access;
mod counts;
mod html;
mod timeline;
mod ui;

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_core::{Clock, Key, ListRecords, Scope, Store, SystemClock};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use access::Access;

struct AdminState<St> {
    store: St,
    metrics: PrometheusHandle,
    access: Access,
    /// The time records' states are read at: the store's clock.
    clock: Arc<dyn Clock>,
}

/// The admin router, reading records' states on the system clock.
pub fn router<St: Store + ListRecords + Clone>(
    store: St,
    metrics: PrometheusHandle,
    token: Option<String>,
) -> Router {
    router_on_clock(store, metrics, token, Arc::new(SystemClock))
}

/// The admin router, reading records' states on `clock` (the one the store was opened with,
/// so the page and the store agree on which leases have ended).
pub fn router_on_clock<St: Store + ListRecords + Clone>(
    store: St,
    metrics: PrometheusHandle,
    token: Option<String>,
    clock: Arc<dyn Clock>,
) -> Router {
    let state = Arc::new(AdminState {
        store,
        metrics,
        access: Access::new(token),
        clock,
    });
    let page = Router::new()
        .route("/ui", get(ui::list_page::<St>))
        .route("/ui/counts", get(ui::counts_frame::<St>))
        .route("/ui/record", get(ui::record_page::<St>))
        .route("/ui/resolve", post(ui::resolve::<St>))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            page_gate::<St>,
        ));
    Router::new()
        .route("/metrics", get(metrics_page::<St>))
        .route("/keys/{key}", get(key_page::<St>))
        .route("/", get(|| async { Redirect::to("/ui") }))
        .merge(page)
        .route("/ui/login", get(ui::login_form::<St>).post(ui::login::<St>))
        .route("/ui/logout", post(ui::logout::<St>))
        .route("/ui/style.css", get(ui::style))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            listener_gate::<St>,
        ))
        // Outside the gate: it says nothing, and probes reach it by whatever name they have.
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

/// The rule every admin route but `/healthz` follows first: a listener without a token
/// answers only a `Host` that DNS rebinding cannot forge (an IP literal or `localhost`), so
/// no web page whose name resolves to this machine can read records, metrics or forms. A
/// listener with a token answers any `Host`; each route then asks for the token (or, on the
/// page, its session cookie).
async fn listener_gate<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    req: Request,
    next: Next,
) -> Response {
    if state.access.host_ok(req.headers()) {
        next.run(req).await
    } else {
        problem(
            StatusCode::FORBIDDEN,
            "this admin listener has no token, so it answers only requests addressed to an IP \
             address or localhost (DNS rebinding protection); set a token to reach it by name"
                .into(),
        )
    }
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

/// The page's gate: without the token or the session cookie, the login form (401) instead.
async fn page_gate<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    req: Request,
    next: Next,
) -> Response {
    if state.access.page_ok(req.headers()) {
        next.run(req).await
    } else {
        ui::login_page(&state.access, StatusCode::UNAUTHORIZED, "")
    }
}

/// `None` when allowed; the refusal otherwise. Compares in constant time.
fn refused<St>(state: &AdminState<St>, headers: &HeaderMap) -> Option<Response> {
    let same = state.access.bearer_ok(headers);
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
            Json(idem_core::report::to_json(&record, state.clock.now())).into_response()
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
