//! Keys at the point of intent ([design §7](docs/design.md#7-the-runtime-side)), version `idem/v1`.
//!
//! An agent runtime derives the key of a tool call once, when it decides to make the call, and
//! sends that same key on every retry: the model re-asking, a timeout, a supervisor handing the
//! task to another worker. The key is a function of what the intent *is*:
//!
//! ```text
//! canonical = RFC 8785 JCS of ["idem/v1", scope, tool, ordinal, args without "idempotency_key"]
//! digest    = SHA-256(canonical), or HMAC-SHA256(secret, canonical)
//! key       = label(scope) "-" label(tool) "-" base32(first 20 bytes of digest)
//! ```
//!
//! `docs/key-derivation.md` specifies it for other languages; `docs/key-vectors.json` holds the
//! vectors this crate, `clients/python` and `clients/js` all reproduce byte for byte.
//!
//! ```
//! use serde_json::json;
//! let key = idem_keys::derive("turn_9f3a", "charge_card", &json!({"customer": "cus_8g2k",
//! "amount_cents": 4900}), 0, None)?; assert_eq!(key.as_str(),
//! "turn_9f3a-charge_card-dmg4hof5wdajf4ppiwf4n53dsjb5peby");
//! # Ok::<(), idem_keys::DeriveError>(())
//! ```

use hmac::{Hmac, Mac};
use idem_core::{Key, jcs};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The version tag, the first element of what is hashed.
pub const VERSION: &str = "idem/v1";
/// The largest integer magnitude JCS carries exactly.
pub const MAX_SAFE: u64 = 1 << 53;
/// Longest scope or tool label in a key, in bytes.
pub const LABEL_MAX: usize = 48;
/// Digest bytes kept in the key: 160 bits.
pub const DIGEST_BYTES: usize = 20;

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// Why a key could not be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeriveError {
    /// The scope is empty.
    #[error("scope must be a non-empty string")]
    EmptyScope,
    /// The tool name is empty.
    #[error("tool must be a non-empty string")]
    EmptyTool,
    /// The ordinal is beyond 2^53.
    #[error("ordinal must be an integer from 0 to 2^53")]
    Ordinal,
    /// A number in the arguments is an integer JCS cannot carry exactly.
    #[error("{0} is an integer beyond 2^53; JCS cannot carry it exactly (send it as a string)")]
    Unsafe(String),
    /// The arguments are not JSON.
    #[error("args are not JSON: {0}")]
    NotJson(String),
    /// A string escapes half of a UTF-16 surrogate pair: not Unicode text.
    #[error("a string has a lone surrogate (\\u{0:04x}); it is not Unicode text")]
    LoneSurrogate(u16),
}

/// Checks every number: integral values beyond 2^53 would be rounded by JCS, so two different
/// ids could name one intent. They must travel as strings.
fn check_numbers(v: &Value) -> Result<(), DeriveError> {
    match v {
        Value::Number(n) => {
            let unsafe_int = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => u > MAX_SAFE,
                (_, Some(i), _) => i.unsigned_abs() > MAX_SAFE,
                (_, _, Some(f)) => f.fract() == 0.0 && f.abs() > MAX_SAFE as f64,
                _ => true,
            };
            if unsafe_int {
                return Err(DeriveError::Unsafe(format!("number {n}")));
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(check_numbers),
        Value::Object(map) => map.values().try_for_each(check_numbers),
        _ => Ok(()),
    }
}

/// Parses JSON text for [`derive()`]; integers beyond 2^53 are an error, not a rounding.
pub fn parse_args(text: &str) -> Result<Value, DeriveError> {
    check_surrogates(text)?;
    let v: Value = serde_json::from_str(text).map_err(|e| DeriveError::NotJson(e.to_string()))?;
    check_numbers(&v)?;
    Ok(v)
}

/// Finds `\uD800`..`\uDFFF` escapes that are not a high surrogate followed by a low one.
/// (serde_json refuses them too, but with a message of its own; this names the rule.)
fn check_surrogates(text: &str) -> Result<(), DeriveError> {
    let b = text.as_bytes();
    let hex_at = |i: usize| -> Option<u16> {
        let h = b.get(i + 2..i + 6)?;
        u16::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
    };
    let (mut i, mut in_string) = (0, false);
    while i < b.len() {
        match b[i] {
            b'"' => in_string = !in_string,
            b'\\' if in_string && b.get(i + 1) == Some(&b'u') => {
                if let Some(u) = hex_at(i) {
                    if (0xD800..0xDC00).contains(&u) {
                        let low = (b.get(i + 6..i + 8) == Some(b"\\u".as_slice()))
                            .then(|| hex_at(i + 6))
                            .flatten();
                        match low {
                            Some(l) if (0xDC00..0xE000).contains(&l) => i += 6,
                            _ => return Err(DeriveError::LoneSurrogate(u)),
                        }
                    } else if (0xDC00..0xE000).contains(&u) {
                        return Err(DeriveError::LoneSurrogate(u));
                    }
                }
                i += 5;
            }
            b'\\' if in_string => i += 1,
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The bytes that are hashed.
pub fn canonical_bytes(
    scope: &str,
    tool: &str,
    args: &Value,
    ordinal: u64,
) -> Result<Vec<u8>, DeriveError> {
    if scope.is_empty() {
        return Err(DeriveError::EmptyScope);
    }
    if tool.is_empty() {
        return Err(DeriveError::EmptyTool);
    }
    if ordinal > MAX_SAFE {
        return Err(DeriveError::Ordinal);
    }
    check_numbers(args)?;
    // The tuple's canonical form, written in place: the arguments are neither copied nor
    // re-sorted per member as a general JCS serializer would.
    let mut out = Vec::with_capacity(128);
    out.push(b'[');
    for text in [VERSION, scope, tool] {
        jcs::write_string(text, &mut out);
        out.push(b',');
    }
    jcs::write(&Value::from(ordinal), &mut out);
    out.push(b',');
    match args {
        Value::Object(members) => jcs::write_object(members, Some("idempotency_key"), &mut out),
        other => jcs::write(other, &mut out),
    }
    out.push(b']');
    Ok(out)
}

fn label(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':') {
                c
            } else {
                '_'
            }
        })
        .take(LABEL_MAX)
        .collect()
}

fn base32(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 8 / 5 + 1);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(BASE32[((acc >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(BASE32[((acc << (5 - bits)) & 31) as usize]));
    }
    out
}

/// The idempotency key of one intent. `ordinal` separates two deliberate, identical calls in
/// one scope; `secret` makes the digest an HMAC, for arguments an outsider could guess.
pub fn derive(
    scope: &str,
    tool: &str,
    args: &Value,
    ordinal: u64,
    secret: Option<&[u8]>,
) -> Result<Key, DeriveError> {
    let data = canonical_bytes(scope, tool, args, ordinal)?;
    let digest: [u8; 32] = match secret {
        None => Sha256::digest(&data).into(),
        Some(secret) => {
            // HMAC accepts keys of any length; this cannot fail.
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
                .map_err(|e| DeriveError::NotJson(e.to_string()))?;
            mac.update(&data);
            mac.finalize().into_bytes().into()
        }
    };
    let text = format!(
        "{}-{}-{}",
        label(scope),
        label(tool),
        base32(&digest[..DIGEST_BYTES])
    );
    // Labels are visible ASCII and at most 48 bytes each: always a valid key.
    Key::new(text).map_err(|e| DeriveError::NotJson(e.to_string()))
}
