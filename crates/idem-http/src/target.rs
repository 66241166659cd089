//! The request target a framework routes, from the target a client wrote
//! ([design §3](docs/design.md#3-what-a-request-with-a-key-gets)).
//!
//! A server in front of a web framework reduces what the client wrote on the request line to
//! a path before the framework routes it: the absolute form (`POST http://host/v1/charges`,
//! RFC 9112 §3.2.2), which every HTTP/1.1 server must accept, loses its scheme and authority;
//! a fragment (`/v1/charges#x`), which a client should never send, is dropped. A middleware
//! that matched its routes on the bytes as written would find no route for either, apply the
//! defaults (no key required), and let the framework run the keyed route it did route to.
//! hyper does this reduction for `idem serve` and the tower layer (`Uri::path`); the
//! middleware in Python and Node hand the core the target as their server kept it
//! (`RAW_URI`, `req.originalUrl`), so the core reduces it here, once, for all of them.

use std::borrow::Cow;

use crate::policy::Unmatched;

/// `target` in origin form (`/path?query`): the absolute form reduced to its path and query
/// (an empty path is `/`), any fragment dropped. Refused ([`Unmatched::Target`]) when it is
/// neither form: the asterisk form (`*`), the authority form (`host:443`), a relative
/// reference, or a URI without an authority (`x:/v1/charges`), which servers read apart.
///
/// The query is kept as written; the path is not normalised here (the routes do that,
/// [`crate::policy::normalize`]). A target in origin form without a fragment (every request a
/// client library builds) comes back borrowed.
pub fn origin_form(target: &str) -> Result<Cow<'_, str>, Unmatched> {
    let target = target.split_once('#').map_or(target, |(before, _)| before);
    if target.starts_with('/') {
        return Ok(Cow::Borrowed(target));
    }
    let rest = absolute_form_rest(target).ok_or(Unmatched::Target)?;
    // The authority ends at the first `/` or `?` (a `#` is gone already).
    let path_at = rest.find(['/', '?']).unwrap_or(rest.len());
    let path_and_query = &rest[path_at..];
    Ok(if path_and_query.starts_with('/') {
        Cow::Borrowed(path_and_query)
    } else {
        Cow::Owned(format!("/{path_and_query}"))
    })
}

/// What follows `scheme://` in an absolute-form target, or `None` when it is not one: a
/// scheme is a letter followed by letters, digits, `+`, `-` or `.` (RFC 3986 §3.1), in any
/// case, and the hierarchical part must start with `//` (an authority).
fn absolute_form_rest(target: &str) -> Option<&str> {
    let (scheme, rest) = target.split_once(':')?;
    let mut chars = scheme.bytes();
    let first_is_letter = chars.next().is_some_and(|b| b.is_ascii_alphabetic());
    let scheme_ok = first_is_letter
        && chars.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return None;
    }
    rest.strip_prefix("//")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_form_is_borrowed_as_it_came() {
        for t in [
            "/",
            "/v1/charges",
            "/v1/charges?a=1&b=%20",
            "/v1//charges;x",
        ] {
            assert!(
                matches!(origin_form(t), Ok(Cow::Borrowed(s)) if s == t),
                "{t}"
            );
        }
    }

    #[test]
    fn a_fragment_is_dropped() {
        for (t, want) in [
            ("/v1/charges#x", "/v1/charges"),
            ("/v1/charges#", "/v1/charges"),
            ("/v1/charges#?a=1", "/v1/charges"),
            ("/v1/charges/#x", "/v1/charges/"),
            ("/v1/charges?a=1#x", "/v1/charges?a=1"),
            ("http://h/v1/charges#x", "/v1/charges"),
        ] {
            assert_eq!(origin_form(t).as_deref(), Ok(want), "{t}");
        }
    }

    #[test]
    fn the_absolute_form_is_reduced_to_its_path_and_query() {
        for (t, want) in [
            ("http://127.0.0.1/v1/charges", "/v1/charges"),
            ("http://127.0.0.1:8080/v1/charges?x=1", "/v1/charges?x=1"),
            ("HTTP://X/v1/charges", "/v1/charges"),
            ("https://x/v1/charges", "/v1/charges"),
            ("ftp://x/v1/charges", "/v1/charges"),
            ("x://y/v1/charges", "/v1/charges"),
            ("a+b.c-d://y/v1/charges", "/v1/charges"),
            ("http://u:p@x/v1/charges", "/v1/charges"),
            ("http://x//v1/charges", "//v1/charges"),
            ("http://x:80/V1/Charges", "/V1/Charges"),
            ("http://x", "/"),
            ("http://x?a=1", "/?a=1"),
            ("http://[::1]:80/v1/charges", "/v1/charges"),
        ] {
            assert_eq!(origin_form(t).as_deref(), Ok(want), "{t}");
        }
    }

    proptest::proptest! {
        /// One intent, one target: a path written in absolute form (any scheme, userinfo,
        /// port) or with a fragment reduces to the path itself; and different paths stay
        /// different (the reduction is the identity on origin form).
        #[test]
        fn every_spelling_of_a_target_reduces_to_its_path(
            path in "(/[a-zA-Z0-9._~%;=-]{0,8}){1,4}",
            query in proptest::option::of("[a-zA-Z0-9=&%]{0,12}"),
            scheme in "[a-zA-Z][a-zA-Z0-9+.-]{0,6}",
            authority in "([a-z]{1,4}(:[a-z]{0,4})?@)?[a-z0-9.-]{1,12}(:[0-9]{1,5})?",
            fragment in proptest::option::of("[a-zA-Z0-9/?#=]{0,8}"),
        ) {
            let origin = match &query {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            let tail = fragment.map(|f| format!("#{f}")).unwrap_or_default();
            let plain = origin_form(&origin).map(Cow::into_owned);
            proptest::prop_assert_eq!(plain, Ok(origin.clone()));
            let fragmented = origin_form(&format!("{origin}{tail}")).map(Cow::into_owned);
            proptest::prop_assert_eq!(fragmented, Ok(origin.clone()));
            let absolute = format!("{scheme}://{authority}{origin}{tail}");
            let reduced = origin_form(&absolute).map(Cow::into_owned);
            proptest::prop_assert_eq!(reduced, Ok(origin));
        }
    }

    #[test]
    fn what_is_no_path_is_refused() {
        for t in [
            "*",
            "127.0.0.1:443",
            "v1/charges",
            "x:/v1/charges",
            "1http://x/v1/charges",
            "ht tp://x/v1/charges",
            "://x/v1/charges",
            "",
            "#/v1/charges",
        ] {
            assert_eq!(origin_form(t), Err(Unmatched::Target), "{t:?}");
        }
    }
}
