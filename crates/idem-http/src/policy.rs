//! Per-route policy: which requests need a key, and how their keys behave.
//!
//! A route is a method (or any) and a path pattern; the first listed route that matches a
//! request decides. A request that matches none gets the default policy: a key, when present
//! on an unsafe method, is honoured; none is required (issue 3,
//! [design §3](docs/design.md#3-what-a-request-with-a-key-gets)).

use std::borrow::Cow;
use std::fmt;

use http::Method;
use idem_core::{AbandonedPolicy, Policy};

/// Default bound on a buffered request body: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// How requests on one route are treated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePolicy {
    /// Whether a request without `Idempotency-Key` is refused (400 `key-missing`).
    pub require_key: bool,
    /// Lease, retention, unknown-outcome policy, how long a duplicate of an in-flight request
    /// waits for the first one's result before 409 (`wait`), released statuses, stored-body
    /// bound.
    pub engine: Policy,
    /// Bound on the request body, which is buffered to fingerprint it (413 over it).
    pub max_body: usize,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        RoutePolicy {
            require_key: false,
            engine: Policy::default(),
            max_body: DEFAULT_MAX_BODY,
        }
    }
}

impl RoutePolicy {
    /// The policy for routes that require keys: [design §5](docs/design.md#5-unknown-outcomes)
    /// makes `reject` their default for unknown outcomes.
    pub fn requiring_key() -> Self {
        RoutePolicy {
            require_key: true,
            engine: Policy {
                on_abandoned: AbandonedPolicy::Reject,
                ..Policy::default()
            },
            ..RoutePolicy::default()
        }
    }
}

/// A path pattern: literal segments, `{name}` for any one segment, and a final `*` for any
/// rest (including none). `/v1/charges/{id}/capture`, `/v1/*`.
#[derive(Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

/// Why a path pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// Patterns are absolute.
    #[error("path pattern {0:?} must start with /")]
    NotAbsolute(String),
    /// `*` may only be the last segment.
    #[error("path pattern {0:?}: * may only be the last segment")]
    StarNotLast(String),
    /// A segment mixes `{`/`}` or `*` with other text.
    #[error("path pattern {0:?}: a parameter must be a whole segment, like /{{id}}")]
    BadParam(String),
}

impl PathPattern {
    /// Parses a pattern.
    pub fn new(pattern: &str) -> Result<Self, PatternError> {
        let Some(body) = pattern.strip_prefix('/') else {
            return Err(PatternError::NotAbsolute(pattern.to_owned()));
        };
        let parts: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        let mut segments = Vec::new();
        let mut rest = false;
        for (i, part) in parts.iter().enumerate() {
            if *part == "*" {
                if i + 1 != parts.len() {
                    return Err(PatternError::StarNotLast(pattern.to_owned()));
                }
                rest = true;
            } else if part.starts_with('{') && part.ends_with('}') && part.len() > 2 {
                segments.push(Segment::Any);
            } else if part.contains(['{', '}', '*']) {
                return Err(PatternError::BadParam(pattern.to_owned()));
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(PathPattern {
            text: pattern.to_owned(),
            segments,
            rest,
        })
    }

    /// Whether `path` (without the query) matches. Runs on every request, so it walks the
    /// segments in place instead of collecting them.
    pub fn matches(&self, path: &str) -> bool {
        let body = path.strip_prefix('/').unwrap_or(path);
        // A trailing slash is not a segment of its own: /v1/charges/ is /v1/charges. The root
        // has no segments; "//" has one, empty.
        let trimmed = body.strip_suffix('/').unwrap_or(body);
        let parts = match body {
            "" => 0,
            _ => trimmed.split('/').count(),
        };
        if parts < self.segments.len() || (!self.rest && parts != self.segments.len()) {
            return false;
        }
        let mut given = trimmed.split('/');
        self.segments.iter().enumerate().all(|(i, seg)| {
            let part = given.next().unwrap_or_default();
            match seg {
                Segment::Literal(l) => literal_matches(l, part, i + 1 == parts),
                Segment::Any => !part.is_empty(),
            }
        })
    }
}

/// Whether a path segment names the literal segment of a route, read as loosely as the
/// services behind idem read it, because a route that matches too little lets a request reach
/// the service without the key it requires, while one that matches too much only asks for a
/// key more often. So: in any case (Express and ASP.NET match paths case-insensitively), with
/// trailing spaces and dots ignored (IIS and Windows trim them; `%20` decoded), and, for the
/// last segment, with a format suffix (`charges.json`: Rails' `(.:format)`, Spring's suffix
/// matching).
fn literal_matches(literal: &str, part: &str, last: bool) -> bool {
    let decoded = if part.contains("%20") {
        Cow::Owned(part.replace("%20", " "))
    } else {
        Cow::Borrowed(part)
    };
    let part = decoded.trim_end_matches([' ', '.']);
    if part.eq_ignore_ascii_case(literal) {
        return true;
    }
    last && part
        .get(..literal.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(literal))
        && part[literal.len()..].starts_with('.')
}

impl fmt::Debug for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PathPattern({:?})", self.text)
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A path as routes see it: unreserved percent-escapes decoded (RFC 3986 §6.2.2.2), `;params`
/// dropped from each segment, empty and `.` segments removed, `..` applied. A path that is
/// normal already (every request a client library builds) comes back borrowed.
pub fn normalize(path: &str) -> Cow<'_, str> {
    if is_normal(path) {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(resolve_segments(path, Params::Dropped))
    }
}

/// What a reading of a path does with `;params`: servers differ (Tomcat, Spring and Jetty
/// strip them; Express, Rails and WSGI servers keep them as part of the segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Params {
    Dropped,
    Kept,
}

/// [`normalize`]'s general case, segment by segment. With `keep_params`, `;params` stay in
/// their segments, as servers that do not strip them read the path (Express reads
/// `/v1/charges/;ch_1/capture` as the id `;ch_1`).
fn resolve_segments(path: &str, keep_params: Params) -> String {
    let mut out: Vec<String> = Vec::new();
    for raw in path.split('/') {
        let seg = match keep_params {
            Params::Dropped => raw.split(';').next().unwrap_or(""),
            Params::Kept => raw,
        };
        let seg = decode_unreserved(seg);
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(seg),
        }
    }
    format!("/{}", out.join("/"))
}

/// How else than [`normalize`] a service may read a path with encoded slashes or backslashes
/// (`%2F`, `%5C`, either case): with `%2F` read as `/` and `%5C` kept in its segment (WSGI
/// servers decode `%5C` to a backslash, which stays in the segment), with `%5C` read as `/`
/// (servers that take a backslash for a slash), and with both. Each is read from the path as
/// sent, so that an escape inside `;params` counts too (`normalize` would drop it with the
/// parameters), and from the normalised path, whose decoded escapes can spell a new one
/// (`%2%66` is `%2f` once `%66` is decoded: a server that decodes twice, or a proxy that
/// normalises before a WSGI app, reads a slash there). Empty for nearly every request (one
/// scan for `%`).
///
/// A path with `;` is also read with its `;params` kept in their segments, as sent and at
/// each split: a segment of parameters alone (`/v1/charges/;ch_1/capture`) is nothing to a
/// server that strips them and an id to one that does not, so a `{param}` route must match
/// it. Empty for nearly every request (one scan for `%` and `;`).
fn other_readings(path: &str, normalised: &str) -> Vec<String> {
    let params = if path.contains(';') {
        &[Params::Dropped, Params::Kept][..]
    } else {
        &[Params::Dropped]
    };
    let mut readings = Vec::new();
    if params.contains(&Params::Kept) {
        readings.push(resolve_segments(path, Params::Kept));
    }
    if !path.contains('%') {
        return readings;
    }
    for source in [path, normalised] {
        let lowered = source.to_ascii_lowercase();
        let (slash, backslash) = (lowered.contains("%2f"), lowered.contains("%5c"));
        for &keep in params {
            if slash {
                readings.push(split_at(source, &["%2f"], keep));
            }
            if backslash {
                readings.push(split_at(source, &["%5c"], keep));
            }
            if slash && backslash {
                readings.push(split_at(source, &["%2f", "%5c"], keep));
            }
        }
    }
    readings
}

/// `path` with each of `escapes` (lower case) read as `/`, normalised.
fn split_at(path: &str, escapes: &[&str], params: Params) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let escape = rest.get(i..i + 3).map(str::to_ascii_lowercase);
        if escape.as_deref().is_some_and(|e| escapes.contains(&e)) {
            out.push('/');
            rest = &rest[i + 3..];
        } else {
            out.push('%');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    resolve_segments(&out, params)
}

/// Whether [`normalize`] would return `path` unchanged: it starts with `/`, and has no escape,
/// no `;`, and no empty, `.` or `..` segment after the first `/`.
fn is_normal(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    !rest.is_empty()
        && !path.contains(['%', ';'])
        && rest.split('/').all(|seg| !matches!(seg, "" | "." | ".."))
}

fn decode_unreserved(seg: &str) -> String {
    let b = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(h) = b.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(&String::from_utf8_lossy(h), 16)
            && (v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~'))
        {
            out.push(char::from(v));
            i += 3;
            continue;
        }
        out.push(char::from(b[i]));
        i += 1;
    }
    // Only ASCII bytes were pushed one by one when the input was ASCII; keep others intact.
    if seg.is_ascii() { out } else { seg.to_owned() }
}

/// Why a request is refused before its route is looked up: it is spelled so that the service
/// behind the layer could read it differently from the route table
/// ([design §3](docs/design.md#3-what-a-request-with-a-key-gets)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unmatched {
    /// The method has lower-case letters. Methods are case-sensitive (RFC 9110 §9.1) and
    /// every registered one is upper case, so routes never match `post`; but some servers
    /// (Werkzeug, for one) upper-case the method and run it as POST.
    #[error(
        "The method {0:?} has lower-case letters: methods are case-sensitive (RFC 9110 §9.1), so no route matches it, but some servers upper-case it and would run it unprotected; send it in upper case"
    )]
    MethodCase(String),
    /// The path has a `.` or `..` segment, in any spelling (`%2e`, `..;x`, between encoded
    /// slashes). Clients remove them before sending (RFC 3986 §5.2.4); one left in would be
    /// resolved by some servers and not by others, and could climb out of a path prefix.
    #[error(
        "The path has a dot segment (. or .., in any spelling). Clients remove them before sending (RFC 3986 §5.2.4); send the resolved path"
    )]
    DotSegment,
    /// The path has a raw backslash, which a URI cannot hold and some servers read as `/`.
    #[error(
        "The path has a backslash, which a URI cannot hold and some servers read as /; percent-encode it as %5C"
    )]
    Backslash,
    /// The path has an encoded control character (`%00`..`%1F`, `%7F`), which servers cut the
    /// path at or strip.
    #[error(
        "The path has an encoded control character (%00 to %1F or %7F), which servers cut paths at or strip; remove it"
    )]
    ControlCharacter,
    /// A method-override header: frameworks (Express's method-override, Symfony, Laravel,
    /// Spring) run the request as the method it names, which the routes never saw.
    #[error(
        "The request has a {0} header: the service would run it as another method than the one the routes judged; send that method itself"
    )]
    MethodOverride(String),
    /// The request target is neither a path (origin form) nor an absolute URL with an
    /// authority (absolute form, RFC 9112 §3.2): nothing says which route a server would
    /// run it as. Not echoed: an absolute form may carry a password in its userinfo.
    #[error(
        "The request target is neither a path (/v1/...) nor an absolute URL (http://host/v1/...), so no route can be chosen for it; send the path (RFC 9112 §3.2)"
    )]
    Target,
}

/// Headers that make frameworks run a request as another method.
/// `HeaderName`s, not strings: a lookup by `&str` parses the name again on every request.
const METHOD_OVERRIDES: [http::HeaderName; 3] = [
    http::HeaderName::from_static("x-http-method-override"),
    http::HeaderName::from_static("x-http-method"),
    http::HeaderName::from_static("x-method-override"),
];

/// Refuses a method or a path that the route table and the service behind it could read
/// differently: what is not refused here is forwarded as the routes judged it (its path up to
/// what [`normalize`] still evens out for them: escaped unreserved characters, `;params` and
/// empty segments, so that these cannot dodge a route either).
///
/// Checked: no lower-case letter in the method (so a server that upper-cases methods runs the
/// method the routes matched); no raw backslash in the path; no `.` or `..` segment, where a
/// segment is split at `/` and also at the encoded `%2F` and `%5C` (which are forwarded as
/// they are, never decoded), its `;params` dropped and its unreserved escapes decoded, as
/// [`normalize`] does.
pub fn screen(method: &Method, path: &str, headers: &http::HeaderMap) -> Result<(), Unmatched> {
    let m = method.as_str();
    if m.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(Unmatched::MethodCase(m.to_owned()));
    }
    if let Some(h) = METHOD_OVERRIDES.iter().find(|h| headers.contains_key(*h)) {
        return Err(Unmatched::MethodOverride(h.as_str().to_owned()));
    }
    screen_path(path)
}

/// The path half of [`screen`]: no backslash, no dot segment in any spelling. A path that
/// passes, appended to a prefix, stays under it.
pub fn screen_path(path: &str) -> Result<(), Unmatched> {
    if path.contains('\\') {
        return Err(Unmatched::Backslash);
    }
    if has_encoded_control(path) {
        return Err(Unmatched::ControlCharacter);
    }
    // Most paths have no dot in any spelling: nothing to split or decode.
    if !path.contains('.') && !path.contains("%2e") && !path.contains("%2E") {
        return Ok(());
    }
    let lowered = path.to_ascii_lowercase();
    let dotted = lowered
        .split('/')
        .flat_map(|s| s.split("%2f"))
        .flat_map(|s| s.split("%5c"))
        .map(|s| decode_unreserved(s.split(';').next().unwrap_or("")))
        .any(|s| s == "." || s == "..");
    if dotted {
        return Err(Unmatched::DotSegment);
    }
    Ok(())
}

/// Whether `path` holds `%00`..`%1F` or `%7F`.
fn has_encoded_control(path: &str) -> bool {
    // Most paths hold no escape at all: one scan for `%` decides.
    if !path.contains('%') {
        return false;
    }
    path.as_bytes().windows(3).any(|w| {
        w[0] == b'%'
            && std::str::from_utf8(&w[1..])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .is_some_and(|b| b < 0x20 || b == 0x7f)
    })
}

/// One route: a method (or any) and a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `None` matches every method.
    pub method: Option<Method>,
    /// The path pattern.
    pub path: PathPattern,
    /// The policy of requests that match.
    pub policy: RoutePolicy,
}

/// A route of a [`Routes`] table, by its place in it; the one past the last is the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteId(usize);

/// The routing table: first match wins, else the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    routes: Vec<Route>,
    default: RoutePolicy,
}

impl Routes {
    /// No routes: every request gets `default`.
    pub fn new(default: RoutePolicy) -> Self {
        Routes {
            routes: Vec::new(),
            default,
        }
    }

    /// Adds a route after the existing ones.
    pub fn route(mut self, method: Option<Method>, path: PathPattern, policy: RoutePolicy) -> Self {
        self.routes.push(Route {
            method,
            path,
            policy,
        });
        self
    }

    /// The policy for a request. The path is normalised first, so that spellings an
    /// upstream would treat as the same resource (`/v1//charges`, `/v1/./charges`,
    /// `/v1/%63harges`, `/v1/charges;x=1`) cannot dodge a route's policy.
    ///
    /// A path with an encoded slash or backslash (`%2F`, `%5C`) or a `;` is read every way a
    /// service may read it (`other_readings`): as sent (Express and Rails keep `a%2Fb` one
    /// segment), split at either escape or both (Flask and Django run `/v1%2Fcharges` as
    /// `/v1/charges`), and with `;params` dropped (Tomcat, Spring) or kept in their segment
    /// (Express reads `/v1/charges/;ch_1/capture` as the id `;ch_1`). Each reading finds its first route. Of those that require a key, the
    /// one listed first decides; if none does, the one listed first of all. So no reading can
    /// take a key away, and where several routes require one, the operator's order still
    /// picks its policy (its unknown-outcome rule, its body bound), as it did before encoded
    /// separators were read.
    pub fn policy_for(&self, method: &Method, path: &str) -> &RoutePolicy {
        self.policy(self.route_for(method, path))
    }

    /// The route whose policy applies to a request ([`Routes::policy_for`]).
    pub fn route_for(&self, method: &Method, path: &str) -> RouteId {
        let normalised = normalize(path);
        let others = other_readings(path, &normalised);
        let readings =
            std::iter::once(normalised.as_ref()).chain(others.iter().map(String::as_str));
        let (mut keyed, mut first) = (None, usize::MAX);
        for found in readings.map(|reading| self.first_match(method, reading)) {
            first = first.min(found);
            if self.policy(RouteId(found)).require_key {
                keyed = Some(keyed.map_or(found, |k: usize| k.min(found)));
            }
        }
        RouteId(keyed.unwrap_or(first))
    }

    /// The index of the first route matching `method` and the normalised `path`; the number
    /// of routes (the defaults) when none does, so that an earlier route is a smaller number.
    fn first_match(&self, method: &Method, path: &str) -> usize {
        self.routes
            .iter()
            .position(|r| r.method.as_ref().is_none_or(|m| m == method) && r.path.matches(path))
            .unwrap_or(self.routes.len())
    }

    /// The policy of a route, or the defaults for the route past the last.
    pub fn policy(&self, route: RouteId) -> &RoutePolicy {
        self.routes
            .get(route.0)
            .map_or(&self.default, |r| &r.policy)
    }

    /// The routes, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathPattern {
        PathPattern::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn patterns_match_segments() {
        assert!(p("/v1/charges").matches("/v1/charges"));
        assert!(p("/v1/charges").matches("/v1/charges/"));
        assert!(!p("/v1/charges").matches("/v1/charges/ch_1"));
        assert!(!p("/v1/charges").matches("/v1/chargesX"));
        assert!(p("/v1/charges/{id}/capture").matches("/v1/charges/ch_1/capture"));
        assert!(!p("/v1/charges/{id}/capture").matches("/v1/charges//capture"));
        assert!(p("/v1/*").matches("/v1"));
        assert!(p("/v1/*").matches("/v1/a/b/c"));
        assert!(!p("/v1/*").matches("/v2/a"));
        assert!(p("/*").matches("/anything/at/all"));
        assert!(p("/").matches("/"));
    }

    /// A segment that is only `;params` is dropped by servers that strip parameters and is
    /// the `{id}` to Express, so a keyed `{param}` route must match it (found by the
    /// hardening attack: these reached Express's capture handler with no key).
    #[test]
    fn a_segment_of_parameters_alone_fills_a_param_as_express_reads_it() {
        let routes = Routes::default().route(
            Some(Method::POST),
            p("/v1/charges/{id}/capture"),
            RoutePolicy::requiring_key(),
        );
        for path in [
            "/v1/charges/;ch_1/capture",
            "/v1/charges/;/capture",
            "/v1/charges/;x=1/capture",
            "/V1/Charges/;/Capture",
            "/v1/charges/ch_1;v=2/capture",
            "/v1/charges%2F;ch_1/capture",
            "/v1/charges/;ch_1%2Fcapture",
        ] {
            assert!(routes.policy_for(&Method::POST, path).require_key, "{path}");
        }
        // Parameters on a literal segment still read as that segment.
        let charges = Routes::default().route(
            Some(Method::POST),
            p("/v1/charges"),
            RoutePolicy::requiring_key(),
        );
        assert!(
            charges
                .policy_for(&Method::POST, "/v1;a/charges;b")
                .require_key
        );
        // And a trailing segment of parameters alone is nothing to Tomcat: /v1/charges.
        assert!(
            charges
                .policy_for(&Method::POST, "/v1/charges/;x")
                .require_key
        );
        assert!(
            !charges
                .policy_for(&Method::POST, "/v1/charges/x;y")
                .require_key
        );
    }

    #[test]
    fn equivalent_spellings_cannot_dodge_a_route() {
        let routes = Routes::default().route(
            Some(Method::POST),
            p("/v1/charges"),
            RoutePolicy::requiring_key(),
        );
        for path in [
            "/v1/%63harges",
            "/v1//charges",
            "//v1/charges",
            "/v1/./charges",
            "/v1/x/../charges",
            "/v1/charges//",
            "/v1/charges;x=1",
            "/v1/charges/.",
        ] {
            assert!(routes.policy_for(&Method::POST, path).require_key, "{path}");
        }
        assert!(
            !routes
                .policy_for(&Method::POST, "/v1/charges%2Fx")
                .require_key
        );
        // Encoded slashes and backslashes are read both ways: as one segment (Express,
        // Rails) and as separators (WSGI servers).
        for path in [
            "/v1%2Fcharges",
            "/v1%2fcharges",
            "/%2Fv1/charges",
            "/%2Fv1%2Fcharges%2F",
            "/v1%5Ccharges",
            "/v1%5c%2Fcharges",
            "/V1%2FCharges.json",
        ] {
            assert!(routes.policy_for(&Method::POST, path).require_key, "{path}");
        }
        let files = Routes::default().route(
            Some(Method::PUT),
            p("/files/{name}"),
            RoutePolicy::requiring_key(),
        );
        // An earlier route that matches only the split reading does not take the key away
        // from a keyed route that matches the path as sent (Express reads
        // /files/public%2Fx as /files/{name}).
        let public_first = Routes::default()
            .route(
                Some(Method::PUT),
                p("/files/public/{name}"),
                RoutePolicy::default(),
            )
            .route(
                Some(Method::PUT),
                p("/files/{name}"),
                RoutePolicy::requiring_key(),
            );
        assert!(
            public_first
                .policy_for(&Method::PUT, "/files/public%2Fx")
                .require_key
        );
        assert!(
            !public_first
                .policy_for(&Method::PUT, "/files/public/x")
                .require_key
        );
        // Where both readings require a key, the route listed first decides, as before
        // encoded separators were read: its body bound and its unknown-outcome rule.
        let bounded = |max_body| RoutePolicy {
            max_body,
            ..RoutePolicy::requiring_key()
        };
        let catch_all_second = Routes::default()
            .route(Some(Method::POST), p("/v1/charges"), bounded(10))
            .route(Some(Method::POST), p("/{any}"), bounded(20));
        assert_eq!(
            catch_all_second
                .policy_for(&Method::POST, "/v1%2Fcharges")
                .max_body,
            10
        );
        // WSGI decodes `%5C` to a backslash that stays in its segment, while `%2F` splits;
        // an escape inside `;params` splits too (Werkzeug matches /api/acme;x/charges).
        assert!(files.policy_for(&Method::PUT, "/files%2Fa%5Cb").require_key);
        let org = Routes::default().route(
            Some(Method::POST),
            p("/api/{org}/charges"),
            RoutePolicy::requiring_key(),
        );
        for path in ["/api/acme;x%2Fcharges", "/api/acme;%2Fcharges"] {
            assert!(org.policy_for(&Method::POST, path).require_key, "{path}");
        }
        // An escape that decoding an unreserved one spells (`%2%66` is `%2f` once `%66` is
        // `f`) is read as a separator too.
        for path in ["/v1%2%66charges", "/v1%%32Fcharges", "/v1%5%63charges"] {
            assert!(routes.policy_for(&Method::POST, path).require_key, "{path}");
        }
        // Kept as one segment, `a%2Fb` is the route's one parameter.
        assert!(files.policy_for(&Method::PUT, "/files/a%2Fb").require_key);
        assert!(!files.policy_for(&Method::PUT, "/files/a/b").require_key);
        assert_eq!(normalize("/a/%7Euser/../b"), "/a/b");
        assert_eq!(normalize(""), "/");
        // The fast path agrees with the general one.
        for path in [
            "/",
            "/v1",
            "/v1/charges",
            "/v1/charges/",
            "//v1",
            "/v1//x",
            "/./v1",
            "/v1/.",
            "/v1/..",
            "/v1/.../x",
            "/v1/.x",
            "/a;b/c",
            "/%61",
            "v1",
            "/é/ü",
        ] {
            assert_eq!(
                normalize(path),
                resolve_segments(path, Params::Dropped),
                "{path}"
            );
        }
    }

    /// `matches` as it was before it walked the segments in place: the oracle.
    fn matches_by_collecting(p: &PathPattern, path: &str) -> bool {
        let body = path.strip_prefix('/').unwrap_or(path);
        let mut parts = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect::<Vec<_>>()
        };
        if parts.last() == Some(&"") {
            parts.pop();
        }
        if parts.len() < p.segments.len() || (!p.rest && parts.len() != p.segments.len()) {
            return false;
        }
        p.segments
            .iter()
            .zip(&parts)
            .enumerate()
            .all(|(i, (seg, part))| match seg {
                Segment::Literal(l) => literal_matches(l, part, i + 1 == parts.len()),
                Segment::Any => !part.is_empty(),
            })
    }

    #[test]
    fn matching_in_place_agrees_with_collecting_the_segments() {
        let patterns = [
            "/",
            "/*",
            "/v1",
            "/v1/*",
            "/v1/charges",
            "/v1/{id}",
            "/v1/{id}/x",
            "/{a}/{b}/*",
        ]
        .map(p);
        // Every path of up to four segments over an alphabet of the pieces that matter.
        let pieces = [
            "", "v1", "V1.", "x", "charges", "v1.json", "v1%20", "%20", ".",
        ];
        let mut paths = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for base in &frontier {
                for piece in pieces {
                    next.push(format!("{base}/{piece}"));
                }
            }
            paths.extend(next.iter().cloned());
            frontier = next;
        }
        paths.extend(
            paths
                .clone()
                .iter()
                .map(|x| x.trim_start_matches('/').to_owned()),
        );
        assert!(paths.len() > 10_000, "{}", paths.len());
        for pattern in &patterns {
            for path in &paths {
                assert_eq!(
                    pattern.matches(path),
                    matches_by_collecting(pattern, path),
                    "{pattern} on {path:?}"
                );
            }
        }
    }

    #[test]
    fn spellings_a_service_could_read_another_way_are_screened_out() {
        let post = Method::POST;
        for path in [
            "/v1/charges",
            "/",
            "",
            "/v1/a%2Fb",
            "/v1/a%5Cb",
            "/v1/a..b/.well-known/x.",
            "/v1/...",
            "/v1/%2e%2e%2e",
            "/v1/charges;x=1",
        ] {
            assert_eq!(
                screen(&post, path, &http::HeaderMap::new()),
                Ok(()),
                "{path}"
            );
        }
        for path in [
            "/..",
            "/.",
            "/v1/./charges",
            "/v1/../admin",
            "/%2e%2e/admin",
            "/%2E%2E/admin",
            "/.%2E/admin",
            "/%2e/admin",
            "/v1/..;x/admin",
            "/v1/.;/admin",
            "/v1/..%2Fadmin",
            "/v1/a%2f..%2fadmin",
            "/v1/%5C..%5Cadmin",
            "/v1/charges/..",
        ] {
            assert_eq!(
                screen(&post, path, &http::HeaderMap::new()),
                Err(Unmatched::DotSegment),
                "{path}"
            );
        }
        assert_eq!(
            screen(&post, "/v1\\admin", &http::HeaderMap::new()),
            Err(Unmatched::Backslash)
        );
        for m in ["post", "Post", "get", "purge", "pATCH"] {
            let method = Method::from_bytes(m.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                matches!(screen(&method, "/", &http::HeaderMap::new()), Err(Unmatched::MethodCase(ref s)) if s == m),
                "{m}"
            );
        }
        for m in ["PURGE", "PROPFIND", "M-SEARCH", "PATCH"] {
            let method = Method::from_bytes(m.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(screen(&method, "/", &http::HeaderMap::new()), Ok(()), "{m}");
        }
    }

    #[test]
    fn routes_for_any_method_cover_extension_methods() {
        let routes = Routes::default().route(None, p("/v1/*"), RoutePolicy::requiring_key());
        let purge = Method::from_bytes(b"PURGE").unwrap_or_else(|e| panic!("{e}"));
        assert!(routes.policy_for(&purge, "/v1/cache").require_key);
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(matches!(
            PathPattern::new("v1"),
            Err(PatternError::NotAbsolute(_))
        ));
        assert!(matches!(
            PathPattern::new("/a/*/b"),
            Err(PatternError::StarNotLast(_))
        ));
        assert!(matches!(
            PathPattern::new("/a/x{id}"),
            Err(PatternError::BadParam(_))
        ));
    }

    #[test]
    fn first_match_wins_and_methods_filter() {
        let strict = RoutePolicy::requiring_key();
        let routes = Routes::new(RoutePolicy::default())
            .route(Some(Method::POST), p("/v1/charges"), strict.clone())
            .route(
                None,
                p("/v1/*"),
                RoutePolicy {
                    max_body: 5,
                    ..RoutePolicy::default()
                },
            );
        assert!(routes.policy_for(&Method::POST, "/v1/charges").require_key);
        assert!(!routes.policy_for(&Method::PUT, "/v1/charges").require_key);
        assert_eq!(routes.policy_for(&Method::PUT, "/v1/charges").max_body, 5);
        assert_eq!(
            routes.policy_for(&Method::POST, "/other"),
            &RoutePolicy::default()
        );
    }

    /// Routes read paths as loosely as the services behind them: a spelling that Express,
    /// ASP.NET, IIS or Rails would route to a keyed endpoint needs the key too.
    #[test]
    fn routes_match_as_loosely_as_services_route() {
        let routes = Routes::default()
            .route(
                Some(Method::POST),
                p("/v1/charges"),
                RoutePolicy::requiring_key(),
            )
            .route(
                Some(Method::POST),
                p("/v1/charges/{id}/capture"),
                RoutePolicy::requiring_key(),
            );
        for path in [
            "/V1/CHARGES",
            "/v1/Charges",
            "/v1/charges.",
            "/v1/charges.json",
            "/v1/charges%20",
            "/v1/charges%20.",
            "/v1/charges/ch_1/CAPTURE.xml",
        ] {
            assert!(routes.policy_for(&Method::POST, path).require_key, "{path}");
        }
        // A format suffix only on the last segment; another resource is another resource.
        for path in ["/v1/charges.json/x", "/v1/chargesx", "/v1/charge"] {
            assert!(
                !routes.policy_for(&Method::POST, path).require_key,
                "{path}"
            );
        }
    }

    #[test]
    fn encoded_controls_and_method_overrides_are_refused() {
        let post = Method::POST;
        let none = http::HeaderMap::new();
        for path in ["/v1/charges%00", "/v1/%0acharges", "/v1/charges%7F"] {
            assert_eq!(
                screen(&post, path, &none),
                Err(Unmatched::ControlCharacter),
                "{path}"
            );
        }
        assert_eq!(screen(&post, "/v1/charges%20", &none), Ok(()));
        for h in [
            "x-http-method-override",
            "X-HTTP-Method",
            "x-method-override",
        ] {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::HeaderName::from_bytes(h.as_bytes()).unwrap(),
                http::HeaderValue::from_static("DELETE"),
            );
            assert!(
                matches!(
                    screen(&post, "/v1/charges/ch_1", &headers),
                    Err(Unmatched::MethodOverride(_))
                ),
                "{h}"
            );
        }
    }
}
