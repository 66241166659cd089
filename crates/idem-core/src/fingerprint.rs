//! The fingerprint: what makes a repeated key the *same* request.
//!
//! [design §1](docs/design.md#1-words): SHA-256 over method, path with query, and body, with a JSON
//! body canonicalised by RFC 8785 (JCS) first, so a client that re-serialises its retry with other
//! member order or whitespace still gets its replay, while any changed value is a mismatch (422
//! `key-reused`). Each part is length-prefixed and the whole is domain-separated, so no two
//! different requests can be made to hash the same bytes by shifting text between parts.

use std::borrow::Cow;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::jcs::EXACT_LIMIT;

/// A SHA-256 fingerprint of a request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// How a body was hashed; recorded in the hash so a raw body and a canonical one never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyForm {
    /// JSON, canonicalised with RFC 8785.
    CanonicalJson,
    /// Bytes as received.
    Raw,
}

impl Fingerprint {
    /// From the 32 bytes of a stored fingerprint.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Fingerprints an HTTP request. A body whose content type is JSON (`application/json` or
    /// any `+json`) and that is I-JSON (RFC 7493: no duplicate member names, no number JCS
    /// would round) is canonicalised; anything else is hashed raw. Raw is the safe side: two
    /// bodies that differ only in a way canonical JSON would erase (`{"id":2^60+1}` and
    /// `{"id":2^60+2}`, or a duplicate member one parser reads first and another last) must
    /// not fingerprint alike, or one would be replayed the other's result.
    ///
    /// The media type is part of the request: the same bytes as
    /// `application/json-patch+json` and as `application/merge-patch+json` ask for different
    /// things, as do a form and `text/plain`. Its essence (`type/subtype` in lower case,
    /// parameters dropped) is a part of its own, except for `application/json` and a request
    /// without a content type, which add none: their fingerprints are the ones earlier
    /// versions stored, so a retry across an upgrade still replays
    /// ([design §1](docs/design.md#1-words)).
    pub fn http(
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Self {
        let essence = content_type.map(media_essence);
        let canonical = essence
            .as_deref()
            .filter(|e| is_json_essence(e))
            .and_then(|_| canonical_json_bytes(body));
        let essence = essence.filter(|e| e != "application/json");
        let (form, body) = match &canonical {
            Some(c) => (BodyForm::CanonicalJson, c.as_slice()),
            None => (BodyForm::Raw, body),
        };
        let head = [method.as_bytes(), path_and_query.as_bytes(), body];
        match &essence {
            Some(e) => Self::of_parts(form, &[head[0], head[1], head[2], e.as_bytes()]),
            None => Self::of_parts(form, &head),
        }
    }

    /// Fingerprints a call that is not HTTP (an MCP tool call): a name and JSON arguments.
    /// Integers beyond 2^53, which JCS would round, are added exactly, so they still count.
    pub fn json_call(name: &str, args: &serde_json::Value) -> Self {
        let mut exact = Vec::new();
        unsafe_numbers(args, &mut exact);
        Self::of_parts(
            BodyForm::CanonicalJson,
            &[
                name.as_bytes(),
                &canonical_json(args),
                exact.join(",").as_bytes(),
            ],
        )
    }

    fn of_parts(form: BodyForm, parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        h.update(b"idem-fingerprint/v1");
        h.update([match form {
            BodyForm::CanonicalJson => 1u8,
            BodyForm::Raw => 0u8,
        }]);
        for part in parts {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        Fingerprint(h.finalize().into())
    }
}

/// RFC 8785 canonical form of a JSON value.
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    crate::jcs::to_vec(value)
}

/// RFC 8785 canonical form of JSON text, or `None` when it does not parse or is not I-JSON
/// (a duplicate member name, or a number of magnitude 2^53 or more).
pub fn canonical_json_bytes(text: &[u8]) -> Option<Vec<u8>> {
    let canonical = crate::jcs::canonical_i_json(text)?;
    numbers_survive_doubles(text).then_some(canonical)
}

/// Whether every number literal in `text` is the shortest form of its double, up to layout:
/// `0.1`, `1.50`, `2e-3` are; `1.00000000000000001` (which is the double 1) is not. JCS writes
/// doubles, so a body whose decimals carry more precision than a double would fingerprint
/// like another body with another amount; such a body is hashed raw instead.
fn numbers_survive_doubles(text: &[u8]) -> bool {
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < text.len()
                    && matches!(text[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                if is_short_integer(&text[start..i]) {
                    continue;
                }
                let literal = String::from_utf8_lossy(&text[start..i]);
                let Ok(v) = literal.parse::<f64>() else {
                    return false;
                };
                if decimal_form(&literal) != decimal_form(&format!("{:e}", v)) {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

/// An integer literal of at most 15 digits: below 2^53, so a double holds it exactly and its
/// shortest form is its own digits (the common case, checked without allocating).
fn is_short_integer(literal: &[u8]) -> bool {
    let digits = literal.strip_prefix(b"-").unwrap_or(literal);
    !digits.is_empty() && digits.len() <= 15 && digits.iter().all(u8::is_ascii_digit)
}

/// A decimal literal as (significant digits, point) with value 0.DIGITS x 10^point; zero is
/// ("", 0). Sign is ignored (it survives doubles).
fn decimal_form(literal: &str) -> (String, i64) {
    let s = literal.trim_start_matches(['-', '+']);
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_start_matches('0').trim_end_matches('0').to_owned();
    if digits.is_empty() {
        return (String::new(), 0);
    }
    (digits, int.len() as i64 - lead as i64 + exp)
}

/// Collects, in a fixed order, the numbers that JCS cannot carry exactly.
fn unsafe_numbers(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Number(n) if n.as_f64().is_none_or(|f| f.abs() >= EXACT_LIMIT) => {
            out.push(n.to_string());
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| unsafe_numbers(i, out)),
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for k in keys {
                if let Some(v) = map.get(k) {
                    unsafe_numbers(v, out);
                }
            }
        }
        _ => {}
    }
}

/// `application/json`, `application/x+json`, with or without parameters, in any case.
pub fn is_json_media_type(content_type: &str) -> bool {
    is_json_essence(&media_essence(content_type))
}

/// Whether a media type's essence ([`media_essence`]) is JSON's.
fn is_json_essence(essence: &str) -> bool {
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A media type's essence: `type/subtype` in lower case, without parameters or spaces
/// (`Application/JSON; charset=utf-8` is `application/json`). Borrowed when already in lower
/// case, as nearly every one is: two fewer allocations per keyed request.
pub fn media_essence(content_type: &str) -> Cow<'_, str> {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if essence.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(essence.to_ascii_lowercase())
    } else {
        Cow::Borrowed(essence)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &hex::encode(self.0)[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    #[test]
    fn member_order_and_whitespace_do_not_matter() {
        let a = Fingerprint::http(
            "POST",
            "/v1/charges",
            JSON,
            br#"{"amount":4900,"customer":"cus_8g2k"}"#,
        );
        let b = Fingerprint::http(
            "POST",
            "/v1/charges",
            JSON,
            b"{ \"customer\" : \"cus_8g2k\",\n  \"amount\": 4900 }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn every_part_matters() {
        let base = Fingerprint::http("POST", "/v1/charges?x=1", JSON, br#"{"amount":4900}"#);
        assert_ne!(
            base,
            Fingerprint::http("PUT", "/v1/charges?x=1", JSON, br#"{"amount":4900}"#)
        );
        assert_ne!(
            base,
            Fingerprint::http("POST", "/v1/charges?x=2", JSON, br#"{"amount":4900}"#)
        );
        assert_ne!(
            base,
            Fingerprint::http("POST", "/v1/charges?x=1", JSON, br#"{"amount":4901}"#)
        );
        // Moving bytes between parts must not collide.
        assert_ne!(
            Fingerprint::http("POST", "/ab", None, b"c"),
            Fingerprint::http("POST", "/a", None, b"bc")
        );
    }

    #[test]
    fn non_json_bodies_are_hashed_raw() {
        let a = Fingerprint::http("POST", "/", Some("text/plain"), b"{\"a\":1, \"b\":2}");
        let b = Fingerprint::http("POST", "/", Some("text/plain"), b"{\"b\":2, \"a\":1}");
        assert_ne!(a, b);
        // Declared JSON that does not parse still fingerprints, raw.
        let bad = Fingerprint::http("POST", "/", JSON, b"{not json");
        assert_eq!(bad, Fingerprint::http("POST", "/", JSON, b"{not json"));
        assert_ne!(bad, Fingerprint::http("POST", "/", JSON, b"{not  json"));
    }

    #[test]
    fn json_media_types() {
        for ct in [
            "application/json",
            "Application/JSON",
            "application/problem+json; charset=x",
        ] {
            assert!(is_json_media_type(ct), "{ct}");
        }
        for ct in ["text/json-ish", "application/jsonx", "text/plain", ""] {
            assert!(!is_json_media_type(ct), "{ct}");
        }
    }

    /// RFC 8785 §3.2.3's sorting example and §3.2.2's number examples, cross-checked against a
    /// second, independent implementation (serde_jcs).
    #[test]
    fn canonical_form_matches_rfc8785_and_serde_jcs() {
        let cases = [
            json!({"\u{20ac}": "Euro Sign", "\r": "Carriage Return", "\u{fb33}": "Hebrew Letter Dalet With Dagesh",
                   "1": "One", "\u{1f600}": "Emoji: Grinning Face", "\u{80}": "Control", "\u{f6}": "Latin Small Letter O With Diaeresis"}),
            // RFC 8785 §3.2.2's input, as text: its numbers are the point of the example.
            serde_json::from_str(
                r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                    "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                    "literals": [null, true, false]}"#,
            )
            .unwrap_or_default(),
            json!([1.0, -0.0, 1e21, 5e-324, {"b": [], "a": {}}]),
        ];
        for v in &cases {
            let ours = canonical_json(v);
            let theirs = serde_jcs::to_vec(v).expect("serde_jcs");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs)
            );
        }
        assert_eq!(
            String::from_utf8_lossy(&canonical_json(&cases[1])),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        // RFC 8785 §3.2.3: members sort by their UTF-16 code units.
        assert_eq!(
            String::from_utf8_lossy(&canonical_json(&cases[0])),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    #[test]
    fn what_canonical_json_would_erase_is_hashed_raw() {
        let big = |n: &str| {
            Fingerprint::http(
                "POST",
                "/orders",
                JSON,
                format!(r#"{{"order_id":{n}}}"#).as_bytes(),
            )
        };
        assert_ne!(big("1850026147163422721"), big("1850026147163422722"));
        assert_ne!(
            big("1e300"),
            big("1.0e300"),
            "large numbers are compared as written"
        );
        assert_eq!(
            big("9007199254740991"),
            big("9007199254740991.0"),
            "below 2^53 JCS is exact"
        );
        let dup = Fingerprint::http("POST", "/c", JSON, br#"{"amount":1,"amount":1000}"#);
        assert_ne!(
            dup,
            Fingerprint::http("POST", "/c", JSON, br#"{"amount":1000}"#)
        );
        assert_ne!(
            dup,
            Fingerprint::http("POST", "/c", JSON, br#"{"amount":1}"#)
        );
        let nested = |t: &[u8]| Fingerprint::http("POST", "/c", JSON, t);
        assert_ne!(
            nested(br#"{"a":[{"b":1,"b":2}]}"#),
            nested(br#"{"a":[{"b":2}]}"#)
        );
        // JSON calls keep big integers exact too.
        let call = |n: u64| Fingerprint::json_call("t", &json!({"id": n}));
        assert_ne!(
            call(1_850_026_147_163_422_721),
            call(1_850_026_147_163_422_722)
        );
        assert_eq!(call(42), call(42));
    }

    #[test]
    fn decimals_a_double_cannot_hold_are_hashed_raw() {
        let amount = |a: &str| {
            Fingerprint::http(
                "POST",
                "/c",
                JSON,
                format!(r#"{{"amount":{a}}}"#).as_bytes(),
            )
        };
        assert_ne!(amount("1"), amount("1.00000000000000001"));
        assert_ne!(amount("0.1"), amount("0.1000000000000000000000001"));
        // Same number, other layout: still the same request.
        assert_eq!(amount("10.1"), amount("10.10"));
        assert_eq!(amount("0.002"), amount("2e-3"));
        assert_eq!(amount("1"), amount("1.0"));
        assert_eq!(amount("-0.5"), amount("-5E-1"));
        assert_eq!(decimal_form("0"), (String::new(), 0));
        assert_eq!(decimal_form("123.4500"), ("12345".into(), 3));
        assert_eq!(decimal_form("0.00120"), ("12".into(), -2));
        assert_eq!(decimal_form("1.5e-7"), ("15".into(), -6));
    }

    /// Records outlive releases: a retry after an upgrade must fingerprint as the first
    /// attempt did, or it would be refused as `key-reused`. These digests were computed by
    /// the release before canonical JSON got its own writer (`ca83d8a`).
    #[test]
    fn fingerprints_are_stable_across_versions() {
        let bodies: [&[u8]; 10] = [
            br#"{"customer_id":"cus_8g2k","amount_cents":4900}"#,
            br#"{ "amount_cents" : 4900, "customer_id":"cus_8g2k" }"#,
            br#"{"a":[1,2.5,-0,1e3,"\u00e9\n",null,true,false],"b":{"\ud83d\ude00":1,"\ufb33":2},"c":0.1}"#,
            br#"{"amount":10.10,"x":2e-3}"#,
            br#"{"amount":1.00000000000000001}"#,
            br#"{"id":9007199254740993}"#,
            br#"{"a":1,"a":2}"#,
            br#"[]"#,
            br#""just a string""#,
            b"not json",
        ];
        let expected = [
            "35180435b64729b32b5266dbc55752e2fc51a73e8fd61d4802b512fe3cc39658",
            "35180435b64729b32b5266dbc55752e2fc51a73e8fd61d4802b512fe3cc39658",
            "ce7689db2b1250d7dd7e510ba1b4e296905ceddab7a4ec438f07467947b48762",
            "ddc66f93bb4923286d93e607216fd3619f981315e060a9d02e8039d7962b3989",
            "0dd6ac2b6c9241688ff3e225581c648636cc3b86504d5d46d631a7b25832f728",
            "dd50dc49c6f2d95af502cfdb3c42f612fb2735306efb929dfb2b3defe4560f81",
            "5ee4ff0e42c9e652d26bc62b1d5ae6ea22407c4056cfc4176d4ebd9802ae689e",
            "29aa562eebf5b3a8e84bcee1db2888977c0c1eba48311e3fe5e955b84a26454f",
            "95965d3af2101f32a496c09ad6a6052261509865721a4dbafdfe15ced96164d1",
            "50b0a4f833f575d36a1700df75673e021244ab27e5a9614ff1913e894c23bcbc",
        ];
        for (body, want) in bodies.iter().zip(expected) {
            let got = Fingerprint::http("POST", "/v1/charges?x=1", Some("application/json"), body);
            assert_eq!(got.to_string(), want, "{}", String::from_utf8_lossy(body));
        }
        let call = Fingerprint::json_call(
            "charge_card",
            &json!({"b": [1, 2.5], "a": {"z": null, "y": "\u{1f600}"}, "n": 1_850_026_147_163_422_721_u64}),
        );
        assert_eq!(
            call.to_string(),
            "403f35adce3e26c9e109eec5787762af5ad7307118756454f26feb21212f8491"
        );
    }

    /// The same bytes under another media type are another request; `application/json` and no
    /// content type keep the fingerprints earlier versions stored.
    #[test]
    fn the_media_type_is_part_of_the_request() {
        let body = br#"[{"op":"replace","path":"/amount","value":1}]"#;
        let fp = |ct: Option<&str>, body: &[u8]| {
            Fingerprint::http("PATCH", "/v1/charges/ch_1", ct, body)
        };
        let patch = fp(Some("application/json-patch+json"), body);
        assert_ne!(patch, fp(Some("application/merge-patch+json"), body));
        assert_ne!(patch, fp(Some("application/json"), body));
        assert_eq!(
            patch,
            fp(Some("Application/JSON-Patch+JSON; charset=utf-8"), body)
        );
        assert!(matches!(
            media_essence(" application/json-patch+json ; q=1"),
            Cow::Borrowed("application/json-patch+json")
        ));
        assert_eq!(media_essence("Text/Plain;charset=UTF-8"), "text/plain");
        let form = fp(Some("application/x-www-form-urlencoded"), b"amount=1");
        assert_ne!(form, fp(Some("text/plain"), b"amount=1"));
        assert_ne!(form, fp(None, b"amount=1"));
        assert_eq!(
            fp(Some("application/json; charset=utf-8"), body),
            fp(Some("application/json"), body)
        );
        // Without a content type, a body hashes as it did before the media type counted.
        assert_eq!(
            Fingerprint::http("POST", "/v1/charges?x=1", None, b"not json").to_string(),
            "50b0a4f833f575d36a1700df75673e021244ab27e5a9614ff1913e894c23bcbc"
        );
    }

    #[test]
    fn json_calls_fingerprint_name_and_canonical_args() {
        let a = Fingerprint::json_call("charge_card", &json!({"b": 1, "a": [1, 2]}));
        let b = Fingerprint::json_call("charge_card", &json!({"a": [1, 2], "b": 1}));
        assert_eq!(a, b);
        assert_ne!(
            a,
            Fingerprint::json_call("refund", &json!({"a": [1, 2], "b": 1}))
        );
    }
}
