//! The scope: whose keys these are.
//!
//! [design §1](docs/design.md#1-words): keys of two scopes never meet. The HTTP side derives the
//! scope from the caller's principal (for example the `Authorization` header) by hashing it, so the
//! store never holds the secret; the MCP proxy over stdio uses a configured name. Either way the
//! store sees one short, printable label.
//!
//! [`ScopeHeaders`] says which parts of an HTTP request name its caller, and [`Anonymous`] what
//! a keyed request that carries none of them gets ([design §1](docs/design.md#1-words),
//! [§4](docs/design.md#4-which-results-are-kept)).

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, header};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Longest scope label accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 128;

/// The label of the anonymous scope: requests that carry no principal.
pub const ANONYMOUS: &str = "anonymous";

/// A validated scope label, shared rather than copied (as [`crate::Key`] is).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Arc<str>);

/// Why a scope label was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// Empty labels would make every caller look alike by accident.
    #[error("the scope is empty")]
    Empty,
    /// Longer than [`MAX_SCOPE_LEN`].
    #[error("the scope is {len} bytes long; at most {MAX_SCOPE_LEN} are allowed")]
    TooLong {
        /// Length in bytes.
        len: usize,
    },
    /// Only visible ASCII keeps labels printable in logs and CLI output.
    #[error(
        "the scope has byte 0x{byte:02x} at position {position}; only visible ASCII is allowed"
    )]
    InvalidByte {
        /// Offset of the byte.
        position: usize,
        /// The byte.
        byte: u8,
    },
}

impl Scope {
    /// Accepts a label as it is stored (as `idem inspect` prints it).
    pub fn new(label: impl Into<String>) -> Result<Self, ScopeError> {
        let label = label.into();
        if label.is_empty() {
            return Err(ScopeError::Empty);
        }
        if label.len() > MAX_SCOPE_LEN {
            return Err(ScopeError::TooLong { len: label.len() });
        }
        if let Some((position, &byte)) = label
            .as_bytes()
            .iter()
            .enumerate()
            .find(|(_, b)| !(0x21..=0x7e).contains(*b))
        {
            return Err(ScopeError::InvalidByte { position, byte });
        }
        Ok(Scope(label.into()))
    }

    /// The scope of callers without a principal: one shared label, so asking for it on every
    /// anonymous request allocates nothing.
    pub fn anonymous() -> Self {
        static SHARED: std::sync::LazyLock<Scope> =
            std::sync::LazyLock::new(|| Scope(ANONYMOUS.into()));
        SHARED.clone()
    }

    /// The scope of a principal: `p:` and the hex SHA-256 of its parts, each length-prefixed so
    /// that `("ab", "c")` and `("a", "bc")` differ. Only the hash is kept, never the secret.
    pub fn from_principal<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"idem-scope/v1");
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Scope(format!("p:{}", hex::encode(hasher.finalize())).into())
    }

    /// The scope of a request named by its headers: the hash of the values of `names` (each
    /// value with its header's name, in the order of `names`), or the anonymous scope when
    /// none is present. The HTTP layer, the gateway, the MCP proxy over HTTP and `idem inspect
    /// --principal` all compute it here, so an operator finds a caller's records.
    pub fn from_headers(headers: &http::HeaderMap, names: &[http::HeaderName]) -> Self {
        let parts: Vec<&[u8]> = names
            .iter()
            .flat_map(|name| header_parts(headers, name))
            .collect();
        principal_of(parts).unwrap_or_else(Scope::anonymous)
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Each value of header `name` that names someone ([`names_no_one`]) as two parts: the name
/// and the value.
fn header_parts<'a>(
    headers: &'a HeaderMap,
    name: &'a HeaderName,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter(move |v| !names_no_one(name, v.as_bytes()))
        .flat_map(move |v| [name.as_str().as_bytes(), v.as_bytes()])
}

/// Whether a credential header's value names no caller: empty (or white space), or, in
/// `Authorization` and `Proxy-Authorization`, an authentication scheme with no credentials
/// after it (`Bearer`). Every visitor can send these alike, so counting them as a caller
/// would put strangers in one scope, where one's replay (with its `Set-Cookie`) reaches the
/// other; they count as not sent, so `anonymous = "refuse"` refuses them and `"allow"` keeps
/// them in the anonymous scope, which withholds per-caller headers.
fn names_no_one(name: &HeaderName, value: &[u8]) -> bool {
    let value = value.trim_ascii();
    if value.is_empty() {
        return true;
    }
    let credentials = *name == header::AUTHORIZATION || *name == header::PROXY_AUTHORIZATION;
    credentials
        && AUTH_SCHEMES
            .iter()
            .any(|s| value.eq_ignore_ascii_case(s.as_bytes()))
}

/// Authentication schemes (IANA's registry, and the unregistered ones APIs use), which
/// alone, with no token, name no one. A lone value that is no scheme (`sk_live_...`, as some
/// APIs take their key) is a credential.
const AUTH_SCHEMES: [&str; 20] = [
    "basic",
    "bearer",
    "concealed",
    "digest",
    "dpop",
    "gnap",
    "hoba",
    "mutual",
    "negotiate",
    "oauth",
    "privatetoken",
    "scram-sha-1",
    "scram-sha-256",
    "vapid",
    "token",
    "apikey",
    "api-key",
    "key",
    "ntlm",
    "aws4-hmac-sha256",
];

/// The scope of these parts, or `None` when there are none (no principal).
fn principal_of(parts: Vec<&[u8]>) -> Option<Scope> {
    (!parts.is_empty()).then(|| Scope::from_principal(parts))
}

/// The headers that name a caller unless configured otherwise, in the order they are hashed:
/// credentials (`authorization`, `proxy-authorization`), the session (`cookie`), and the
/// common API-key headers. None of them changes between two retries of one request by one
/// caller; a header that does (a CSRF token, a request id) must never be one, since a retry
/// that lands in another scope executes again. `authorization` comes first, so a caller that
/// sends only it keeps the label it had when it was the only default.
pub const DEFAULT_SCOPE_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
];

/// Which parts of an HTTP request name its caller: the scope is the hash of their values
/// ([design §1](docs/design.md#1-words)). The HTTP layer, the gateway and `idem inspect
/// --principal` all compute scopes here, so an operator finds a caller's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeHeaders {
    headers: Vec<HeaderName>,
    cookies: Vec<String>,
}

/// Why a scope header configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeHeadersError {
    /// A cookie name that no `Cookie` header can carry.
    #[error("{0:?} is not a cookie name (visible ASCII, no separators such as = ; , or space)")]
    CookieName(String),
    /// Cookies are named but `cookie` is not one of the scope headers: they would be ignored.
    #[error("scope cookies are named, but `cookie` is not one of the scope headers")]
    CookiesWithoutCookieHeader,
    /// No header at all: no request could name its caller.
    #[error(
        "the list of scope headers is empty: no request could name its caller; list the headers that carry callers' credentials"
    )]
    Empty,
    /// A header that every caller sends alike, or that describes the request rather than its
    /// sender: it would put callers who are not the same in one scope, where replays (and the
    /// cookies they set) would pass from one to another.
    #[error(
        "{0:?} does not name a caller (every client sends it, or it describes the request, not its sender); use the headers that carry credentials"
    )]
    NotACaller(String),
}

/// Headers that never name a caller: [`ScopeHeaders::checked`] refuses them.
const NOT_CALLERS: [&str; 20] = [
    "host",
    "user-agent",
    "accept",
    "accept-encoding",
    "accept-language",
    "content-type",
    "content-length",
    "content-encoding",
    "idempotency-key",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "origin",
    "referer",
    "x-forwarded-for",
    "x-request-id",
];

impl Default for ScopeHeaders {
    fn default() -> Self {
        ScopeHeaders {
            headers: DEFAULT_SCOPE_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            cookies: Vec::new(),
        }
    }
}

impl ScopeHeaders {
    /// These headers, each value of each hashed whole, in this order.
    pub fn new(headers: Vec<HeaderName>) -> Self {
        ScopeHeaders {
            headers,
            cookies: Vec::new(),
        }
    }

    /// As [`ScopeHeaders::new`], for headers an operator configured: refuses an empty list,
    /// and headers that do not name a caller (`host`, `user-agent`, `content-type`, ...).
    pub fn checked(headers: Vec<HeaderName>) -> Result<Self, ScopeHeadersError> {
        if headers.is_empty() {
            return Err(ScopeHeadersError::Empty);
        }
        if let Some(h) = headers.iter().find(|h| NOT_CALLERS.contains(&h.as_str())) {
            return Err(ScopeHeadersError::NotACaller(h.as_str().to_owned()));
        }
        Ok(Self::new(headers))
    }

    /// Of the `Cookie` header, only the named cookies count (in this order, each as
    /// `name=value`); a request whose `Cookie` carries none of them counts as not sending it.
    /// Empty: the whole `Cookie` header counts. Name the session cookie(s) when clients also
    /// carry cookies that change between retries (analytics ids, load balancer stickiness):
    /// otherwise such a retry is another caller and executes again.
    pub fn with_cookies(mut self, cookies: Vec<String>) -> Result<Self, ScopeHeadersError> {
        if let Some(bad) = cookies.iter().find(|c| !is_cookie_name(c)) {
            return Err(ScopeHeadersError::CookieName(bad.clone()));
        }
        if !cookies.is_empty() && !self.headers.contains(&header::COOKIE) {
            return Err(ScopeHeadersError::CookiesWithoutCookieHeader);
        }
        self.cookies = cookies;
        Ok(self)
    }

    /// The headers, in hashing order.
    pub fn headers(&self) -> &[HeaderName] {
        &self.headers
    }

    /// The named session cookies; empty when the whole `Cookie` header counts.
    pub fn cookies(&self) -> &[String] {
        &self.cookies
    }

    /// The scope of the caller these headers name, or `None` when they name none: the request
    /// carries none of the headers (and, with named cookies, none of those cookies).
    pub fn principal(&self, headers: &HeaderMap) -> Option<Scope> {
        let mut parts: Vec<&[u8]> = Vec::new();
        for name in &self.headers {
            if *name == header::COOKIE {
                // The cookies as pairs, not the header's text: the same cookies in another
                // order, spacing or number of `Cookie` lines (proxies join HTTP/2 cookie
                // fields differently) name the same caller, or a retry would execute again.
                let mut pairs: Vec<&[u8]> = cookie_pairs(headers)
                    .filter(|pair| {
                        self.cookies.is_empty()
                            || self
                                .cookies
                                .iter()
                                .any(|w| cookie_name(pair) == w.as_bytes())
                    })
                    .collect();
                pairs.sort_unstable();
                for pair in pairs {
                    parts.extend([name.as_str().as_bytes(), pair]);
                }
            } else {
                parts.extend(header_parts(headers, name));
            }
        }
        principal_of(parts)
    }

    /// A list of the headers (and cookies) for people: `authorization, cookie (session), ...`.
    pub fn describe(&self) -> String {
        self.headers
            .iter()
            .map(|h| {
                if *h == header::COOKIE && !self.cookies.is_empty() {
                    format!("cookie ({})", self.cookies.join(", "))
                } else {
                    h.as_str().to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `name=value` pairs of every `Cookie` header, trimmed (RFC 6265 §4.2.1: pairs separated
/// by `;` and a space; the space is optional here).
fn cookie_pairs(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers.get_all(header::COOKIE).iter().flat_map(|v| {
        v.as_bytes()
            .split(|&b| b == b';')
            .map(<[u8]>::trim_ascii)
            .filter(|p| !p.is_empty())
    })
}

/// A cookie pair's name, as parsers read it: up to `=`, surrounding spaces trimmed.
fn cookie_name(pair: &[u8]) -> &[u8] {
    pair.split(|&b| b == b'=')
        .next()
        .unwrap_or(pair)
        .trim_ascii()
}

/// An RFC 6265 cookie-name: an RFC 9110 token.
fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// What a keyed request that names no caller gets ([design §1](docs/design.md#1-words)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Anonymous {
    /// Refused (400 `principal-missing`): nothing is claimed or executed. The default, since
    /// a scope shared by every anonymous caller would replay one caller's response to another.
    #[default]
    Refuse,
    /// Accepted, in the one shared scope `anonymous`. Headers that carry one caller's state
    /// (`Set-Cookie`) are never stored there, so never replayed.
    Allow,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", self.0)
    }
}

impl std::str::FromStr for Scope {
    type Err = ScopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scope::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_hash_without_ambiguity() {
        let a = Scope::from_principal([b"ab".as_slice(), b"c"]);
        let b = Scope::from_principal([b"a".as_slice(), b"bc"]);
        assert_ne!(a, b);
        assert_eq!(a, Scope::from_principal([b"ab".as_slice(), b"c"]));
        assert!(a.as_str().starts_with("p:"));
        assert_eq!(a.as_str().len(), 66);
        assert!(!a.as_str().contains("ab"));
        assert!(Scope::new(a.as_str()).is_ok());
    }

    #[test]
    fn labels_are_validated() {
        assert_eq!(Scope::new(""), Err(ScopeError::Empty));
        assert_eq!(
            Scope::new("a b"),
            Err(ScopeError::InvalidByte {
                position: 1,
                byte: b' '
            })
        );
        assert_eq!(
            Scope::new("x".repeat(129)),
            Err(ScopeError::TooLong { len: 129 })
        );
        assert_eq!(Scope::new("tenant:42").map(|s| s.0), Ok("tenant:42".into()));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_default_headers_name_callers_by_credentials_cookies_and_api_keys() {
        let s = ScopeHeaders::default();
        assert_eq!(s.principal(&headers(&[("content-type", "x/y")])), None);
        let alice = s.principal(&headers(&[("cookie", "s=alice")]));
        let bob = s.principal(&headers(&[("cookie", "s=bob")]));
        assert!(alice.is_some() && bob.is_some() && alice != bob);
        let k1 = s.principal(&headers(&[("x-api-key", "k1")]));
        assert!(k1.is_some() && k1 != s.principal(&headers(&[("x-api-key", "k2")])));
        // A caller that sends only Authorization keeps the label of the old default.
        let bearer = headers(&[("authorization", "Bearer t")]);
        assert_eq!(
            s.principal(&bearer),
            Some(Scope::from_headers(&bearer, &[header::AUTHORIZATION]))
        );
    }

    #[test]
    fn an_empty_credential_or_a_bare_scheme_names_no_one() {
        let s = ScopeHeaders::default();
        for nobody in [
            &[("authorization", "")][..],
            &[("authorization", "   ")],
            &[("authorization", "Bearer")],
            &[("authorization", "bearer ")],
            &[("authorization", "Basic")],
            &[("proxy-authorization", "Negotiate")],
            &[("x-api-key", "")],
            &[("api-key", " ")],
            &[("cookie", ";")],
            &[("authorization", "Bearer"), ("x-api-key", "")],
        ] {
            assert_eq!(s.principal(&headers(nobody)), None, "{nobody:?}");
        }
        // A lone value that is no scheme is a key (some APIs take it so), and a credential
        // beside an empty one names its caller as it does alone.
        let key = s.principal(&headers(&[("authorization", "sk_live_1")]));
        assert!(key.is_some());
        assert_ne!(
            key,
            s.principal(&headers(&[("authorization", "sk_live_2")]))
        );
        assert_eq!(
            s.principal(&headers(&[
                ("authorization", "Bearer a"),
                ("x-api-key", "")
            ])),
            s.principal(&headers(&[("authorization", "Bearer a")])),
        );
        assert_eq!(
            Scope::from_headers(&headers(&[("authorization", "Bearer")]), s.headers()),
            Scope::anonymous()
        );
    }

    #[test]
    fn configured_headers_must_name_callers() {
        assert_eq!(ScopeHeaders::checked(vec![]), Err(ScopeHeadersError::Empty));
        let host = ScopeHeaders::checked(vec![header::HOST]);
        assert_eq!(host, Err(ScopeHeadersError::NotACaller("host".into())));
        assert!(
            host.err()
                .is_some_and(|e| e.to_string().contains("does not name a caller"))
        );
        assert!(ScopeHeaders::checked(vec![HeaderName::from_static("x-tenant")]).is_ok());
    }

    #[test]
    fn the_same_cookies_written_another_way_name_the_same_caller() {
        let s = ScopeHeaders::default();
        let a = s.principal(&headers(&[("cookie", "a=1; b=2")]));
        for same in [
            &[("cookie", "b=2; a=1")][..],
            &[("cookie", "a=1;b=2")],
            &[("cookie", "  a=1 ;  b=2 ")],
            &[("cookie", "a=1"), ("cookie", "b=2")],
        ] {
            assert_eq!(a, s.principal(&headers(same)), "{same:?}");
        }
        assert_ne!(a, s.principal(&headers(&[("cookie", "a=1; b=3")])));
        // A named cookie is found however its name is spaced (parsers trim it), so its
        // caller is named, not refused or put in the anonymous scope.
        let named = ScopeHeaders::default()
            .with_cookies(vec!["session".into()])
            .unwrap();
        assert!(
            named
                .principal(&headers(&[("cookie", "session =A")]))
                .is_some()
        );
    }

    #[test]
    fn named_cookies_are_the_only_part_of_the_cookie_header_that_counts() {
        let s = ScopeHeaders::default()
            .with_cookies(vec!["session".into()])
            .unwrap();
        let a = s.principal(&headers(&[("cookie", "_ga=1; session=a")]));
        assert!(a.is_some());
        assert_eq!(
            a,
            s.principal(&headers(&[("cookie", "session=a;_ga=2; lb=x")]))
        );
        assert_ne!(a, s.principal(&headers(&[("cookie", "_ga=1; session=b")])));
        assert_ne!(a, s.principal(&headers(&[("cookie", "sessionx=a")])));
        assert_eq!(s.principal(&headers(&[("cookie", "_ga=1")])), None);
        // The other headers still count beside the cookie.
        assert_ne!(
            a,
            s.principal(&headers(&[("cookie", "session=a"), ("x-api-key", "k")]))
        );
        assert_eq!(
            s.describe(),
            "authorization, proxy-authorization, cookie (session), x-api-key, api-key, x-auth-token"
        );
        assert_eq!(
            ScopeHeaders::new(vec![header::AUTHORIZATION]).with_cookies(vec!["s".into()]),
            Err(ScopeHeadersError::CookiesWithoutCookieHeader)
        );
        assert_eq!(
            ScopeHeaders::default().with_cookies(vec!["a=b".into()]),
            Err(ScopeHeadersError::CookieName("a=b".into()))
        );
    }
}
