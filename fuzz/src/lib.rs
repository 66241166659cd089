//! What each fuzz target checks, one function per parser that faces input. The targets in
//! `fuzz_targets/` hand libFuzzer's bytes to these; `crates/idem-cli/tests/fuzz_corpus.rs`
//! includes this file and runs every input of `corpus/` through them, so the committed corpus
//! is a regression test in every `cargo test --workspace` (no nightly, no cargo-fuzz).
//!
//! Each function must not panic on any input, and checks a property the parser promises
//! beyond that: what it accepts reads back the same way, and nothing secret leaks into text.
// Included by a test crate through `#[path]`, where not every item is public API.
#![allow(unreachable_pub, missing_docs)]

use std::str::FromStr;
use std::task::{Context, Poll, Waker};

use idem_core::fingerprint::{Fingerprint, canonical_json_bytes};
use idem_core::{Key, KeyError};
use idem_mcp::rpc::{Envelope, IdScan, Line, Lines};

/// What a target checks of one input: returns if the input holds, panics if not.
pub type Check = fn(&[u8]);

/// Every target, by the name of its `fuzz_targets/` file and `corpus/` folder.
pub const TARGETS: &[(&str, Check)] = &[
    ("key_header", key_header),
    ("fingerprint_jcs", fingerprint_jcs),
    ("key_derivation", key_derivation),
    ("gateway_config", gateway_config),
    ("mcp_policy", mcp_policy),
    ("store_url", store_url),
    ("mcp_jsonrpc", mcp_jsonrpc),
];

/// The `Idempotency-Key` header: an accepted key is 1..=255 visible ASCII bytes, and written
/// back as an sf-string it parses to itself.
pub fn key_header(data: &[u8]) {
    let Ok(key) = Key::from_header(data) else {
        return;
    };
    let text = key.as_str();
    assert!((1..=255).contains(&text.len()), "{text:?}");
    assert!(text.bytes().all(|b| (0x20..0x7f).contains(&b)), "{text:?}");
    let again = Key::from_header(key.to_header_value().as_bytes());
    assert_eq!(again.as_ref().map(Key::as_str), Ok(text));
    assert_eq!(Key::new(text).as_ref().map(Key::as_str), Ok(text));
    let _: Result<Key, KeyError> = Key::from_str(text);
}

/// RFC 8785 canonical JSON of arbitrary bytes, and the request fingerprint over it: the
/// canonical form is a fixed point, is what a general JCS serializer writes for the same value
/// (serde_json_canonicalizer), and fingerprints like the text it came from (reordered members
/// are one request).
pub fn fingerprint_jcs(data: &[u8]) {
    let json = Some("application/json");
    let fp = Fingerprint::http("POST", "/v1/charges", json, data);
    let _ = Fingerprint::http("POST", "/v1/charges", Some("text/plain"), data);
    let Some(canonical) = canonical_json_bytes(data) else {
        return;
    };
    assert_eq!(
        canonical_json_bytes(&canonical).as_deref(),
        Some(canonical.as_slice()),
        "canonical form of {:?} is not canonical",
        String::from_utf8_lossy(data)
    );
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let reference = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&canonical),
            String::from_utf8_lossy(&reference),
            "{:?}",
            String::from_utf8_lossy(data)
        );
    }
    assert_eq!(
        Fingerprint::http("POST", "/v1/charges", json, &canonical),
        fp,
        "{:?}",
        String::from_utf8_lossy(data)
    );
}

/// The arguments `idem key` and the runtimes derive keys from: accepted JSON derives a valid
/// key, the same one from its re-serialisation.
pub fn key_derivation(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(args) = idem_keys::parse_args(text) else {
        return;
    };
    let Ok(key) = idem_keys::derive("run-1", "charge_card", &args, 0, None) else {
        return;
    };
    assert!(Key::new(key.as_str()).is_ok(), "{key}");
    let written = serde_json::to_string(&args).unwrap_or_default();
    let reread = idem_keys::parse_args(&written).map_err(|e| e.to_string());
    let rederived = reread.and_then(|a| {
        idem_keys::derive("run-1", "charge_card", &a, 0, None).map_err(|e| e.to_string())
    });
    assert_eq!(
        rederived.as_ref().map(Key::as_str),
        Ok(key.as_str()),
        "{text}"
    );
}

/// `idem serve`'s TOML: parsed, then validated as the binary does with a command line that
/// names an upstream and a store. Errors are fine; panics are not.
pub fn gateway_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = idem_gateway::FileConfig::parse(text) else {
        return;
    };
    let _ = file.scope();
    let over = idem_gateway::Overrides {
        upstream: Some("http://127.0.0.1:9".into()),
        store: Some("memory:".into()),
        ..Default::default()
    };
    let _ = idem_gateway::Settings::resolve(file, over);
}

/// `idem mcp`'s policy TOML: parsed and validated; a valid policy answers for any tool.
pub fn mcp_policy(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policies) = idem_mcp::Policies::parse(text) else {
        return;
    };
    let tool = serde_json::json!({"name": "charge_card", "annotations": {"readOnlyHint": false}});
    let _ = policies.classify(&tool);
    let _ = policies.for_tool("charge_card");
}

/// A password no store URL the fuzzer writes would otherwise contain.
const SECRET: &str = "Pw7Secret";

/// Store URLs: arbitrary text parses or is refused; and a PostgreSQL or Redis URL whose user
/// part holds a password never shows it, parsed (`Display`) or refused (the error).
pub fn store_url(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(url) = idem_stores::StoreUrl::from_str(text) {
        let _ = url.to_string();
    }
    let _ = idem_stores::redact(text);
    let Some((&first, rest)) = text.as_bytes().split_first() else {
        return;
    };
    let scheme = ["postgres", "postgresql", "redis", "rediss"][usize::from(first) % 4];
    let rest = String::from_utf8_lossy(rest);
    if rest.contains(SECRET) {
        // Elsewhere than the password (a host, a path) it may show.
        return;
    }
    let with_password = format!("{scheme}://user:{SECRET}@{rest}");
    let shown = match idem_stores::StoreUrl::from_str(&with_password) {
        Ok(url) => url.to_string(),
        Err(e) => e.to_string(),
    };
    assert!(
        !shown.contains(SECRET),
        "{with_password:?} shows as {shown:?}"
    );
    let redacted = idem_stores::redact(&with_password);
    assert!(
        !redacted.contains(SECRET),
        "{with_password:?} redacts to {redacted:?}"
    );
}

/// The JSON-RPC messages `idem mcp` reads: split into lines under a size bound, each read
/// as an envelope; the streaming scanner that finds an oversized message's `id` finds the
/// same one whichever way the bytes are cut, and the one the envelope reads. And the client
/// messages' reading fails closed ([`inbound_holds`]): whatever is relayed as it came is one
/// JSON object every parser reads alike, and not a `tools/call`.
pub fn mcp_jsonrpc(data: &[u8]) {
    const MAX: usize = 256;
    let mut lines = Lines::new(data, MAX);
    let mut waker_cx = Context::from_waker(Waker::noop());
    loop {
        // Reading from a byte slice never waits: the first poll answers.
        let next = std::pin::pin!(lines.next());
        let line = match next.poll(&mut waker_cx) {
            Poll::Ready(Ok(Some(line))) => line,
            Poll::Ready(Ok(None) | Err(_)) => break,
            Poll::Pending => unreachable!("a byte slice never waits"),
        };
        match line {
            Line::Whole(bytes) => {
                assert!(bytes.len() <= MAX);
                envelope(&bytes);
                inbound_holds(&bytes);
            }
            Line::Oversized { len, .. } => assert!(len > MAX as u64),
        }
    }
    envelope(data);
    inbound_holds(data);
}

/// What `idem mcp` does with one client message, checked against readings of its own: a
/// message relayed as the bytes it came in parses as a JSON object, has as many members as
/// its text has `:` outside strings (so no name appears twice, which a first-wins and a
/// last-wins parser would read two ways), holds no carriage return, and is no `tools/call`;
/// a call has an id and a name; a batch's members each hold the same.
fn inbound_holds(bytes: &[u8]) {
    use idem_mcp::inbound::{self, Inbound};
    match inbound::read(bytes) {
        Inbound::Relay => {
            let value: serde_json::Value = serde_json::from_slice(bytes)
                .unwrap_or_else(|e| panic!("relayed but unreadable ({e}): {bytes:?}"));
            assert!(value.is_object(), "relayed a non-object: {bytes:?}");
            assert_eq!(
                members(&value),
                colons_outside_strings(bytes),
                "a name twice: {bytes:?}"
            );
            assert!(!bytes.contains(&b'\r'), "relayed a carriage return");
            assert_ne!(
                value.get("method").and_then(|m| m.as_str()),
                Some("tools/call")
            );
        }
        Inbound::Call { id, params } => {
            assert!(!id.is_empty());
            assert!(params.get("name").is_some_and(serde_json::Value::is_string));
        }
        Inbound::Batch(items) => {
            for item in items {
                inbound_holds(item.get().as_bytes());
            }
        }
        Inbound::Request { .. } | Inbound::Refused(_) => {}
    }
}

fn members(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Object(m) => m.len() + m.values().map(members).sum::<usize>(),
        serde_json::Value::Array(a) => a.iter().map(members).sum(),
        _ => 0,
    }
}

fn colons_outside_strings(bytes: &[u8]) -> usize {
    let (mut n, mut in_string, mut escaped) = (0, false, false);
    for &b in bytes {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') | (false, _, b'"') => in_string = !in_string,
            (false, _, b':') => n += 1,
            _ => {}
        }
    }
    n
}

fn envelope(bytes: &[u8]) {
    let whole = scan(&[bytes]);
    let cut = bytes.len() / 2;
    assert_eq!(scan(&[&bytes[..cut], &bytes[cut..]]), whole, "cut at {cut}");
    let Some(env) = Envelope::parse(bytes) else {
        return;
    };
    let _ = (env.is_request(), env.is_response(), env.params_value());
    if let (Some(id), Some(found)) = (env.id_text(), &whole)
        && id.len() < 256
    {
        assert_eq!(found.trim(), id, "{:?}", String::from_utf8_lossy(bytes));
    }
}

fn scan(pieces: &[&[u8]]) -> Option<String> {
    let mut s = IdScan::default();
    for p in pieces {
        s.feed(p);
    }
    s.found
}
