//! Who may use the admin listener, and how a browser proves it without JavaScript.
//!
//! With a token configured, programs send `Authorization: Bearer <token>`. A browser cannot
//! set that header from a plain HTML form, so the page has a login form: the token posted
//! once is exchanged for a session cookie that is `HttpOnly` (no script reads it) and
//! `SameSite=Strict` (no other site's page sends it, so a cross-site form cannot act with
//! it). The cookie holds an HMAC of a fixed label under the token, not the token: it opens
//! only the page, is not a bearer token for anything else, and is void once the token
//! changes.
//!
//! Without a token (the loopback default), the listener answers only a `Host` that DNS
//! rebinding cannot forge: an IP literal or `localhost` ([`Access::host_ok`], applied to every
//! route but `/healthz`). So a page whose name resolves to 127.0.0.1 reads nothing.
//!
//! Every form that changes something also carries a per-process random value
//! ([`Access::form_token`]), and a POST must show it came from this listener's own page: an
//! `Origin` naming the `Host` it was sent to, or, where a client sends no `Origin`, the
//! bearer token or the session cookie (which `SameSite=Strict` keeps from other sites).

use axum::http::{HeaderMap, header};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "idem_admin";

/// How long a browser keeps the session cookie.
const SESSION_SECONDS: u32 = 8 * 60 * 60;

/// The admin listener's credentials.
pub(crate) struct Access {
    token: Option<String>,
    /// `HMAC(token, label)`, hex: the session cookie's value.
    session: Option<String>,
    /// Random per process: the hidden field of every form that changes something.
    form_token: String,
}

/// Compares in constant time (for equal lengths; lengths are not secret).
pub(crate) fn same(got: &str, want: &str) -> bool {
    got.len() == want.len()
        && got
            .bytes()
            .zip(want.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The credentials of `Authorization: Bearer <token>`; the scheme in any case (RFC 9110
/// §11.1), then one or more spaces (§11.4).
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

impl Access {
    pub(crate) fn new(token: Option<String>) -> Self {
        let session = token.as_deref().map(|t| {
            // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
            let mac = <Hmac<Sha256> as Mac>::new_from_slice(t.as_bytes())
                .map(|m| m.chain_update(b"idem admin page session v1").finalize());
            mac.map_or_else(|_| String::new(), |m| hex::encode(m.into_bytes()))
        });
        Access {
            token,
            session,
            form_token: hex::encode(rand::random::<[u8; 16]>()),
        }
    }

    /// Whether a token is required at all.
    pub(crate) fn required(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `headers` carry the bearer token.
    pub(crate) fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        let Some(want) = &self.token else {
            return true;
        };
        let got = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        // No credentials never match, whatever the token (the configuration refuses an empty
        // one; this holds even if that check is bypassed).
        got.is_some_and(|got| !want.is_empty() && same(got, want))
    }

    /// Whether the listener answers this request at all: with a token, any `Host` (each route
    /// asks for the token); without one, only a `Host` DNS rebinding cannot forge.
    pub(crate) fn host_ok(&self, headers: &HeaderMap) -> bool {
        self.required() || unforgeable_host(headers)
    }

    /// Whether the page may be shown: no token configured (the listener's gate has checked
    /// the `Host`, [`Access::host_ok`]), the bearer token, or the session cookie.
    pub(crate) fn page_ok(&self, headers: &HeaderMap) -> bool {
        !self.required() || self.bearer_ok(headers) || self.cookie_ok(headers)
    }

    /// Whether the request carries the session cookie.
    fn cookie_ok(&self, headers: &HeaderMap) -> bool {
        self.session
            .as_deref()
            .is_some_and(|want| cookie(headers, COOKIE).is_some_and(|c| same(c, want)))
    }

    /// Whether `token` (typed into the login form) is the admin token.
    pub(crate) fn token_is(&self, token: &str) -> bool {
        self.token.as_deref().is_some_and(|want| same(token, want))
    }

    /// The `Set-Cookie` value that opens the page.
    pub(crate) fn session_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECONDS}",
            self.session.as_deref().unwrap_or("")
        )
    }

    /// The `Set-Cookie` value that closes it.
    pub(crate) fn logout_cookie() -> String {
        format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    /// The hidden field every changing form carries.
    pub(crate) fn form_token(&self) -> &str {
        &self.form_token
    }

    /// Whether a POST may change something: it carries this process's form token, and it
    /// came from this listener's own page: its `Origin` is this listener's host, or, sent
    /// without an `Origin` (browsers send one on every form POST; some programs do not), it
    /// carries the bearer token or the session cookie, which no other site's page can send.
    pub(crate) fn post_ok(&self, headers: &HeaderMap, form_token: &str) -> bool {
        let from_here = match headers.get(header::ORIGIN) {
            Some(_) => same_origin(headers),
            None => self.required() && (self.bearer_ok(headers) || self.cookie_ok(headers)),
        };
        same(form_token, &self.form_token) && from_here
    }
}

/// Whether the request's `Host` names this machine in a way a web page cannot arrange: an IP
/// literal or `localhost`, with or without a port. A listener without a token is otherwise
/// open to DNS rebinding: a site whose name resolves to 127.0.0.1 is, to the browser, the
/// same origin as the page, and could read it and post its forms.
fn unforgeable_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [v6]:port or [v6]
        Some(rest) => {
            return rest
                .split_once(']')
                .is_some_and(|(v6, _)| v6.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// `Origin` naming the `Host` the request was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest.trim_end_matches('/'));
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(n.clone(), HeaderValue::from_str(v).expect("test header"));
        }
        h
    }

    #[test]
    fn the_cookie_opens_the_page_but_is_not_the_token() {
        let a = Access::new(Some("s3cret".into()));
        let set = a.session_cookie();
        let value = set
            .split(';')
            .next()
            .and_then(|p| p.split_once('='))
            .map(|(_, v)| v.to_owned())
            .expect("cookie value");
        assert!(!value.contains("s3cret"));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        let with_cookie = headers(&[(header::COOKIE, &format!("other=1; {COOKIE}={value}"))]);
        assert!(a.page_ok(&with_cookie));
        assert!(
            !a.bearer_ok(&with_cookie),
            "the cookie is not a bearer token"
        );
        assert!(!a.page_ok(&headers(&[(header::COOKIE, &format!("{COOKIE}=00"))])));
        assert!(!a.page_ok(&HeaderMap::new()));
        assert!(a.page_ok(&headers(&[(header::AUTHORIZATION, "Bearer s3cret")])));
        // Another token makes another cookie.
        assert_ne!(Access::new(Some("other".into())).session_cookie(), set);
    }

    #[test]
    fn no_credentials_never_match_even_an_empty_token() {
        let empty = Access::new(Some(String::new()));
        assert!(!empty.bearer_ok(&HeaderMap::new()));
        assert!(!empty.bearer_ok(&headers(&[(header::AUTHORIZATION, "Bearer ")])));
        assert!(!empty.page_ok(&headers(&[(header::HOST, "127.0.0.1:9090")])));
        let a = Access::new(Some("s3cret-admin-token".into()));
        assert!(!a.bearer_ok(&HeaderMap::new()));
    }

    #[test]
    fn without_a_token_the_listener_answers_only_hosts_dns_rebinding_cannot_name() {
        let open = Access::new(None);
        for host in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "localhost:9090",
            "LOCALHOST",
            "[::1]:9090",
            "[::1]",
            "10.1.2.3:9090",
        ] {
            assert!(open.host_ok(&headers(&[(header::HOST, host)])), "{host}");
        }
        for host in [
            "evil.example:9090",
            "evil.example",
            "localhost.evil.example:9090",
            "127.0.0.1.nip.io:9090",
            "[evil]:9090",
        ] {
            assert!(!open.host_ok(&headers(&[(header::HOST, host)])), "{host}");
        }
        assert!(!open.host_ok(&HeaderMap::new()), "no Host at all");
        let guarded = Access::new(Some("s3cret-admin-token".into()));
        assert!(guarded.host_ok(&headers(&[(header::HOST, "idem-admin.internal:9191")])));
    }

    #[test]
    fn a_post_needs_the_form_token_and_its_own_origin() {
        let a = Access::new(None);
        let t = a.form_token().to_owned();
        let local = headers(&[
            (header::HOST, "127.0.0.1:9091"),
            (header::ORIGIN, "http://127.0.0.1:9091"),
        ]);
        assert!(a.post_ok(&local, &t));
        assert!(!a.post_ok(&local, "guess"));
        let foreign = headers(&[
            (header::HOST, "127.0.0.1:9091"),
            (header::ORIGIN, "https://evil.example"),
        ]);
        assert!(!a.post_ok(&foreign, &t));
        // No Origin: only with credentials no other site's page can send.
        let bare = headers(&[(header::HOST, "127.0.0.1:9091")]);
        assert!(!a.post_ok(&bare, &t), "no token, no Origin");
        assert!(!Access::new(None).post_ok(&local, &t), "per process");
        let guarded = Access::new(Some("s3cret-admin-token".into()));
        let g = guarded.form_token().to_owned();
        assert!(!guarded.post_ok(&bare, &g));
        let cookie_value = guarded
            .session_cookie()
            .split(';')
            .next()
            .map(str::to_owned)
            .unwrap_or_default();
        let with_cookie = headers(&[
            (header::HOST, "127.0.0.1:9091"),
            (header::COOKIE, &cookie_value),
        ]);
        assert!(guarded.post_ok(&with_cookie, &g));
        let with_bearer = headers(&[
            (header::HOST, "127.0.0.1:9091"),
            (header::AUTHORIZATION, "Bearer s3cret-admin-token"),
        ]);
        assert!(guarded.post_ok(&with_bearer, &g));
    }
}
