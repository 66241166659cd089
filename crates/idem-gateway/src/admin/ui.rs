//! The admin page: records by state (abandoned first), search by key and scope, one record's
//! timeline, and resolving an abandoned record with a confirmation step. Server-rendered
//! HTML with no script: every view is a GET, every change a POST form, so it works with
//! JavaScript disabled. Every handler here but login, logout and the stylesheet runs behind
//! the page's gate (`admin.rs`), which answers the login form instead when the request has
//! no credentials.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use idem_core::{
    FencingToken, Key, ListRecords, RecordFilter, RecordState, Resolution, Scope, Store,
    StoreError, StoredResponse, Timestamp, report,
};
use serde::Deserialize;

use super::AdminState;
use super::access::Access;
use super::counts::Counts;
use super::html::{esc, hidden, link, page, with_headers};
use super::timeline;

/// Records shown when the search does not say.
const DEFAULT_LIMIT: usize = 100;

/// What the page says about principals: the store keeps the scope, not who it names.
const PRINCIPAL_NOTE: &str = "A caller's principal is stored only as its scope: a label \
    the gateway derives from the credentials (a hash, design §1), never the principal's name. \
    Search by the scope the gateway logged or `idem inspect --principal` prints.";

fn nav(access: &Access) -> String {
    let logout = if access.required() {
        format!(
            r#" · <form class="inline" method="post" action="/ui/logout">{}<button>Log out</button></form>"#,
            hidden("form_token", access.form_token())
        )
    } else {
        String::new()
    };
    format!(r#"<nav><b>idem admin</b> · <a href="/ui">records</a>{logout}</nav>"#)
}

/// The login form, answered with 401 to any page request without credentials.
pub(crate) fn login_page(access: &Access, status: StatusCode, message: &str) -> Response {
    let warn = if message.is_empty() {
        String::new()
    } else {
        format!(r#"<p class="warn">{}</p>"#, esc(message))
    };
    let body = format!(
        r#"<h1>idem admin</h1>{warn}<p>This admin listener needs its token.</p>
<form method="post" action="/ui/login">{}<label>Admin token <input type="password" name="token" autocomplete="off" autofocus></label> <button>Log in</button></form>
<p class="note">The token is exchanged for an HttpOnly, SameSite=Strict session cookie; programs send <code>Authorization: Bearer</code> instead.</p>"#,
        hidden("form_token", access.form_token())
    );
    page(status, "Log in", &body)
}

fn forbidden(access: &Access) -> Response {
    let body = format!(
        r#"{}<h1>Refused</h1><p class="warn">This form did not come from this page (its form token or origin is wrong). Reload the page and try again.</p>"#,
        nav(access)
    );
    page(StatusCode::FORBIDDEN, "Refused", &body)
}

fn store_down(access: &Access, e: &StoreError) -> Response {
    let body = format!(
        r#"{}<h1>Store unavailable</h1><p class="warn">{}</p>"#,
        nav(access),
        esc(&e.to_string())
    );
    page(StatusCode::SERVICE_UNAVAILABLE, "Store unavailable", &body)
}

fn bad_request(access: &Access, what: &str) -> Response {
    let body = format!(
        r#"{}<h1>Bad request</h1><p class="warn">{}</p>"#,
        nav(access),
        esc(what)
    );
    page(StatusCode::BAD_REQUEST, "Bad request", &body)
}

fn time(t: Timestamp) -> String {
    format!("<time>{}</time>", esc(&t.to_string()))
}

#[derive(Deserialize, Default)]
pub(crate) struct ListQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    scope: String,
    limit: Option<usize>,
}

fn parse_state(s: &str) -> Result<Option<RecordState>, String> {
    match s {
        "" | "any" => Ok(None),
        "abandoned" => Ok(Some(RecordState::Abandoned)),
        "in_flight" => Ok(Some(RecordState::InFlight)),
        "completed" => Ok(Some(RecordState::Completed)),
        other => Err(format!(
            "state {other:?} is not abandoned, in_flight or completed"
        )),
    }
}

fn search_form(q: &ListQuery) -> String {
    let mut options = String::new();
    for (value, label) in [
        ("", "any state"),
        ("abandoned", "abandoned"),
        ("in_flight", "in flight"),
        ("completed", "completed"),
    ] {
        let selected = if q.state == value { " selected" } else { "" };
        let _ = write!(
            options,
            r#"<option value="{value}"{selected}>{label}</option>"#
        );
    }
    format!(
        r#"<form method="get" action="/ui" role="search">
<label>State <select name="state">{options}</select></label>
<label>Key starts with <input name="key" value="{}"></label>
<label>Scope starts with <input name="scope" value="{}"></label>
<label>At most <input name="limit" type="number" min="1" max="{}" value="{}"></label>
<button>Search</button></form>"#,
        esc(&q.key),
        esc(&q.scope),
        idem_core::store::list::MAX_LIST,
        q.limit.unwrap_or(DEFAULT_LIMIT)
    )
}

pub(crate) async fn list_page<St: Store + ListRecords>(
    State(state): State<Arc<AdminState<St>>>,
    Query(q): Query<ListQuery>,
) -> Response {
    let access = &state.access;
    let wanted = match parse_state(&q.state) {
        Ok(s) => s,
        Err(e) => return bad_request(access, &e),
    };
    let filter = RecordFilter {
        state: wanted,
        key_prefix: q.key.clone(),
        scope_prefix: q.scope.clone(),
        limit: q.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let listing = match state.store.list(&filter).await {
        Ok(l) => l,
        Err(e) => return store_down(access, &e),
    };
    let mut rows = String::new();
    for r in &listing.records {
        let st = r.state(listing.now).as_str();
        let href = link(
            "/ui/record",
            &[("scope", r.scope.as_str()), ("key", r.key.as_str())],
        );
        let _ = write!(
            rows,
            r#"<tr><td class="{st}">{st}</td><td><a href="{}"><code>{}</code></a></td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&href),
            esc(r.key.as_str()),
            esc(r.scope.as_str()),
            time(r.created_at),
            r.attempts,
            r.replays
        );
    }
    let table = if listing.records.is_empty() {
        r#"<p id="empty">No record matches.</p>"#.to_owned()
    } else {
        format!(
            r#"<table id="records"><thead><tr><th>State</th><th>Key</th><th>Scope</th><th>Claimed</th><th>Attempts</th><th>Replays</th></tr></thead><tbody>{rows}</tbody></table>"#
        )
    };
    let more = if listing.more {
        r#"<p class="note">More records match than are shown: narrow the search or raise the limit.</p>"#
    } else {
        ""
    };
    let body = format!(
        r#"{}<h1>Records</h1>
<iframe src="/ui/counts" title="Live counts"></iframe>
{}
<p class="note">{}</p>
<p>{} record{} shown, abandoned first, as of {}.</p>
{table}{more}"#,
        nav(access),
        search_form(&q),
        esc(PRINCIPAL_NOTE),
        listing.records.len(),
        if listing.records.len() == 1 { "" } else { "s" },
        time(listing.now),
    );
    page(StatusCode::OK, "Records", &body)
}

/// The counts, alone: framed by the records page and reloaded every five seconds by a meta
/// refresh, so they stay live without script and without reloading the search.
pub(crate) async fn counts_frame<St: Store>(State(state): State<Arc<AdminState<St>>>) -> Response {
    let c = Counts::parse(&state.metrics.render());
    let cell = |id: &str, label: &str, v: f64| format!(r#"<div id="{id}"><b>{v}</b>{label}</div>"#);
    let body = format!(
        r#"<div class="counts">{}{}{}{}{}</div>"#,
        cell("executions", "executions", c.executions()),
        cell("replays", "replays", c.replays()),
        cell(
            "averted",
            "duplicates averted (replayed + conflict + mismatch)",
            c.duplicates_averted()
        ),
        cell("abandoned", "records abandoned", c.abandoned),
        cell("store-errors", "store errors", c.store_errors),
    );
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
         <link rel=\"stylesheet\" href=\"/ui/style.css\"></head><body>{body}</body></html>"
    );
    with_headers(StatusCode::OK, "text/html; charset=utf-8", html)
}

#[derive(Deserialize)]
pub(crate) struct RecordQuery {
    #[serde(default)]
    scope: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    done: String,
}

fn parse_target(scope: &str, key: &str) -> Result<(Scope, Key), String> {
    let key = Key::new(key).map_err(|e| format!("invalid key: {e}"))?;
    let scope = if scope.is_empty() {
        Scope::anonymous()
    } else {
        Scope::new(scope).map_err(|e| format!("invalid scope: {e}"))?
    };
    Ok((scope, key))
}

/// The forms that settle an abandoned record. They name the execution they were shown (its
/// fencing token), so a form filled in for one abandoned execution cannot settle a later one
/// that took the key over meanwhile.
fn resolve_forms(access: &Access, scope: &Scope, key: &Key, execution: FencingToken) -> String {
    let target = format!(
        "{}{}{}{}",
        hidden("form_token", access.form_token()),
        hidden("scope", scope.as_str()),
        hidden("key", key.as_str()),
        hidden("execution", &execution.to_string())
    );
    format!(
        r#"<h2>Resolve</h2>
<p>This record's outcome is unknown: an execution started and no result came back. Settle it once you know what happened.</p>
<form method="post" action="/ui/resolve" id="release">{target}{}<button>Release…</button> <span class="note">the effect surely did not happen: forget the key, so a retry executes</span></form>
<form method="post" action="/ui/resolve" id="complete">{target}{}
<p><label>Status <input name="status" type="number" min="100" max="599" value="200" required></label>
<label>Content-Type <input name="content_type" value="application/json"></label></p>
<p><label>Body<br><textarea name="body" rows="4" cols="60"></textarea></label></p>
<button>Store this result…</button> <span class="note">the effect happened with this result: retries replay it</span></form>"#,
        hidden("action", "release"),
        hidden("action", "complete"),
    )
}

pub(crate) async fn record_page<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    Query(q): Query<RecordQuery>,
) -> Response {
    let access = &state.access;
    let (scope, key) = match parse_target(&q.scope, &q.key) {
        Ok(t) => t,
        Err(e) => return bad_request(access, &e),
    };
    let notice = match q.done.as_str() {
        "released" => {
            r#"<p class="notice" id="done">Released: the next request with this key executes.</p>"#
        }
        "completed" => r#"<p class="notice" id="done">Result stored: retries now replay it.</p>"#,
        _ => "",
    };
    let title = format!("Record {}", key.as_str());
    let head = format!(
        r#"{}<h1>Record <code>{}</code></h1>{notice}<p>Scope <code>{}</code></p>"#,
        nav(access),
        esc(key.as_str()),
        esc(scope.as_str())
    );
    let record = match state.store.get(&scope, &key).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            let body = format!(
                r#"{head}<p id="absent">No record: this key was never claimed in this scope, was released, or its retention ended.</p>"#
            );
            let status = if notice.is_empty() {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::OK
            };
            return page(status, &title, &body);
        }
        Err(e) => return store_down(access, &e),
    };
    let now = state.clock.now();
    let st = record.state(now);
    let mut events = String::new();
    for e in timeline::events(&record, now) {
        let when = e.at.map_or_else(|| "—".to_owned(), time);
        let _ = write!(events, "<tr><td>{when}</td><td>{}</td></tr>", esc(&e.what));
    }
    let response = record.response.as_ref().map_or_else(String::new, |resp| {
        let body = match &resp.body {
            idem_core::StoredBody::Full(b) => match report::printable(b) {
                Some(text) => format!("<pre><code>{}</code></pre>", esc(text)),
                None => format!("<p>{} bytes of binary data</p>", b.len()),
            },
            idem_core::StoredBody::Omitted { len, .. } => {
                format!("<p>{len} bytes, over the size bound: only the digest was kept</p>")
            }
        };
        let mut hdrs = String::new();
        for (n, v) in &resp.headers {
            let _ = write!(
                hdrs,
                "<li><code>{}: {}</code></li>",
                esc(n),
                esc(&report::header_value(v))
            );
        }
        format!(
            r#"<h2>Stored result</h2><p>Status <b id="status">{}</b></p><ul>{hdrs}</ul>{body}"#,
            resp.status
        )
    });
    let resolve = if st == RecordState::Abandoned {
        resolve_forms(access, &scope, &key, record.token)
    } else {
        String::new()
    };
    let body = format!(
        r#"{head}<p>State <b class="{s}" id="state">{s}</b> · attempts {} · replays {} · fingerprint <code>{}</code></p>
<h2>Timeline</h2><table id="timeline"><tbody>{events}</tbody></table>
<p class="note">Stores keep a record's state, not its history: heartbeats, earlier takeovers and each replay's time are not recorded individually.</p>
{response}{resolve}"#,
        record.attempts,
        record.replays,
        esc(&record.fingerprint.to_string()),
        s = st.as_str(),
    );
    page(StatusCode::OK, &title, &body)
}

#[derive(Deserialize)]
pub(crate) struct ResolveForm {
    #[serde(default)]
    form_token: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    action: String,
    status: Option<u16>,
    #[serde(default)]
    content_type: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    confirm: String,
    /// The fencing token of the execution the operator looked at.
    #[serde(default)]
    execution: String,
}

fn resolution(form: &ResolveForm) -> Result<Resolution, String> {
    match form.action.as_str() {
        "release" => Ok(Resolution::Release),
        "complete" => {
            let status = form
                .status
                .filter(|s| (100..=599).contains(s))
                .ok_or("a stored result needs a status from 100 to 599")?;
            let mut response = StoredResponse::new(status, form.body.clone().into_bytes());
            let ct = form.content_type.trim();
            if !ct.is_empty() {
                response
                    .headers
                    .push(("content-type".into(), ct.as_bytes().to_vec()));
            }
            Ok(Resolution::Complete(response))
        }
        other => Err(format!("action {other:?} is not release or complete")),
    }
}

/// The confirmation step: the same form again, with `confirm=yes`, and what it will do.
fn confirm_page(access: &Access, form: &ResolveForm, scope: &Scope, key: &Key) -> Response {
    let what = if form.action == "release" {
        "Release this record? The key is forgotten and the next request with it executes the effect again. Do this only if the effect surely did not happen.".to_owned()
    } else {
        format!(
            "Store this result? Every retry with this key replays status {} with the body below. Do this only if the effect happened with this result.",
            form.status.unwrap_or_default()
        )
    };
    let mut fields = String::new();
    for (n, v) in [
        ("form_token", access.form_token()),
        ("scope", scope.as_str()),
        ("key", key.as_str()),
        ("action", form.action.as_str()),
        ("content_type", form.content_type.as_str()),
        ("body", form.body.as_str()),
        ("execution", form.execution.as_str()),
        ("confirm", "yes"),
    ] {
        fields.push_str(&hidden(n, v));
    }
    if let Some(s) = form.status {
        fields.push_str(&hidden("status", &s.to_string()));
    }
    let preview = if form.action == "complete" {
        format!("<pre><code>{}</code></pre>", esc(&form.body))
    } else {
        String::new()
    };
    let back = link(
        "/ui/record",
        &[("scope", scope.as_str()), ("key", key.as_str())],
    );
    let body = format!(
        r#"{}<h1>Confirm</h1><p>Key <code>{}</code> in scope <code>{}</code></p>
<p class="warn" id="confirm-what">{}</p>{preview}
<form method="post" action="/ui/resolve" id="confirm">{fields}<button>Yes, {}</button> <a href="{}">Cancel</a></form>"#,
        nav(access),
        esc(key.as_str()),
        esc(scope.as_str()),
        esc(&what),
        if form.action == "release" {
            "release it"
        } else {
            "store this result"
        },
        esc(&back)
    );
    page(StatusCode::OK, "Confirm", &body)
}

pub(crate) async fn resolve<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    headers: HeaderMap,
    Form(form): Form<ResolveForm>,
) -> Response {
    let access = &state.access;
    if !access.post_ok(&headers, &form.form_token) {
        return forbidden(access);
    }
    let (scope, key) = match parse_target(&form.scope, &form.key) {
        Ok(t) => t,
        Err(e) => return bad_request(access, &e),
    };
    let how = match resolution(&form) {
        Ok(r) => r,
        Err(e) => return bad_request(access, &e),
    };
    // Both at the confirmation and at the final step: the record must still be the execution
    // the operator looked at. (A takeover between this read and the store's resolve is not
    // excluded; the store settles only abandoned records either way.)
    match state.store.get(&scope, &key).await {
        Ok(Some(now)) if now.token.to_string() == form.execution => {}
        Ok(Some(now)) => {
            let body = format!(
                r#"{}<h1>Not resolved</h1><p class="warn" id="changed">Key <code>{}</code> changed since you looked at it: another execution (attempt {}) holds it now. Look at the record again before settling it.</p><p><a href="{}">The record now</a></p>"#,
                nav(access),
                esc(key.as_str()),
                now.attempts,
                esc(&link(
                    "/ui/record",
                    &[("scope", scope.as_str()), ("key", key.as_str())]
                ))
            );
            return page(StatusCode::CONFLICT, "Not resolved", &body);
        }
        Ok(None) => {}
        Err(e) => return store_down(access, &e),
    }
    if form.confirm != "yes" {
        return confirm_page(access, &form, &scope, &key);
    }
    let done = match state.store.resolve(&scope, &key, how).await {
        Ok(None) => "released",
        Ok(Some(_)) => "completed",
        Err(StoreError::NotAbandoned { state: st }) => {
            let body = format!(
                r#"{}<h1>Not resolved</h1><p class="warn">Key <code>{}</code> is {st}: only an abandoned record can be resolved.</p>"#,
                nav(access),
                esc(key.as_str())
            );
            return page(StatusCode::CONFLICT, "Not resolved", &body);
        }
        Err(StoreError::NotFound) => {
            let body = format!(
                r#"{}<h1>Not resolved</h1><p class="warn">No record for key <code>{}</code> in scope <code>{}</code>.</p>"#,
                nav(access),
                esc(key.as_str()),
                esc(scope.as_str())
            );
            return page(StatusCode::NOT_FOUND, "Not resolved", &body);
        }
        Err(e) => return store_down(access, &e),
    };
    tracing::info!(
        key = key.as_str(),
        scope = scope.as_str(),
        done,
        "resolved from the admin page"
    );
    Redirect::to(&link(
        "/ui/record",
        &[
            ("scope", scope.as_str()),
            ("key", key.as_str()),
            ("done", done),
        ],
    ))
    .into_response()
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    form_token: String,
}

pub(crate) async fn login_form<St: Store>(State(state): State<Arc<AdminState<St>>>) -> Response {
    login_page(&state.access, StatusCode::OK, "")
}

pub(crate) async fn login<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let access = &state.access;
    if !access.post_ok(&headers, &form.form_token) {
        return forbidden(access);
    }
    if !access.required() {
        return Redirect::to("/ui").into_response();
    }
    if !access.token_is(&form.token) {
        tracing::warn!("admin page: wrong token at login");
        return login_page(access, StatusCode::UNAUTHORIZED, "Wrong token.");
    }
    let mut resp = Redirect::to("/ui").into_response();
    if let Ok(v) = HeaderValue::from_str(&access.session_cookie()) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

pub(crate) async fn logout<St: Store>(
    State(state): State<Arc<AdminState<St>>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if !state.access.post_ok(&headers, &form.form_token) {
        return forbidden(&state.access);
    }
    let mut resp = login_page(&state.access, StatusCode::OK, "Logged out.");
    if let Ok(v) = HeaderValue::from_str(&Access::logout_cookie()) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

pub(crate) async fn style() -> Response {
    with_headers(
        StatusCode::OK,
        "text/css; charset=utf-8",
        super::html::STYLE.to_owned(),
    )
}
