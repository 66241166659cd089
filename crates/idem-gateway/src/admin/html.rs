//! HTML for the admin page, written by hand and escaped at every insertion: keys and scopes
//! are whatever a caller sent (any visible ASCII, `<script>` included), so nothing from a
//! record, a query or a form reaches the page unescaped. The page has no script at all, and
//! its Content-Security-Policy forbids any, so an escaping slip could not run one either.

use std::fmt::Write as _;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `s` safe inside element text and inside double-quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `path?name=value&...`, each value percent-encoded (and the whole escaped for an
/// attribute by the caller through [`esc`]).
pub(crate) fn link(path: &str, params: &[(&str, &str)]) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter().filter(|(_, v)| !v.is_empty()))
        .finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// A hidden form field.
pub(crate) fn hidden(name: &str, value: &str) -> String {
    format!(
        r#"<input type="hidden" name="{}" value="{}">"#,
        esc(name),
        esc(value)
    )
}

/// The stylesheet, served at `/ui/style.css` so the policy can forbid inline styles too.
pub(crate) const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:70em}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}\
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
code{font-family:ui-monospace,monospace;word-break:break-all}\
.abandoned{color:#a40000;font-weight:bold}.in_flight{color:#8a5a00}.completed{color:#1a6b1a}\
.note{color:#555;font-size:.9em}.notice{background:#eef6ee;border:1px solid #9c9;padding:.5em}\
.warn{background:#fbeaea;border:1px solid #d99;padding:.5em}\
.counts{display:flex;gap:1em;flex-wrap:wrap}.counts div{border:1px solid #ccc;padding:.4em .8em}\
.counts b{display:block;font-size:1.4em}iframe{border:0;width:100%;height:6.5em}\
form.inline{display:inline}nav{margin-bottom:1em}";

/// The policy every page is served with: nothing but this listener's own stylesheet,
/// frames and forms.
const CSP: &str = "default-src 'none'; style-src 'self'; frame-src 'self'; \
                   frame-ancestors 'self'; form-action 'self'; base-uri 'none'";

/// A whole page: `title` (escaped here) and `body` (already escaped by its writer).
pub(crate) fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let mut html = String::with_capacity(body.len() + 512);
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{} · idem admin</title><link rel=\"stylesheet\" href=\"/ui/style.css\"></head>\
         <body>{body}</body></html>",
        esc(title)
    );
    with_headers(status, "text/html; charset=utf-8", html)
}

/// `body` with the page's content type and security headers.
pub(crate) fn with_headers(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response {
    let mut resp = (status, body).into_response();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "SAMEORIGIN"),
        // Not `no-referrer`: under it a browser sends `Origin: null` with a form's POST, and
        // the origin check would refuse the page's own forms.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        resp.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_input_is_inert_text() {
        assert_eq!(
            esc(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
    }

    #[test]
    fn links_percent_encode_every_value() {
        assert_eq!(
            link(
                "/ui/record",
                &[("scope", "a b&c=d"), ("key", "<k>#?"), ("x", "")]
            ),
            "/ui/record?scope=a+b%26c%3Dd&key=%3Ck%3E%23%3F"
        );
        assert_eq!(link("/ui", &[("state", "")]), "/ui");
    }
}
