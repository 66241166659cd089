//! The idempotency key: the string that names one intent.
//!
//! [design §1](docs/design.md#1-words): a key is 1..=255 bytes of visible ASCII (`0x21..=0x7E`).
//! Over HTTP it travels in the `Idempotency-Key` header as an RFC 8941 sf-string (`"..."` with `\"`
//! and `\\` escapes); a bare value is accepted too, because most clients (Stripe's libraries,
//! `uuidgen`) send keys unquoted and many of those keys start with a digit, which a strict sf-token
//! would refuse.
//!
//! Validation is strict everywhere else: a key that is not exactly what the design allows is
//! refused with an error that says which byte is wrong, so a client author can fix it without
//! guessing.

use std::fmt;
use std::sync::Arc;

/// Longest key accepted, in bytes ([design §1](docs/design.md#1-words)).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key. Shared, not copied: a request's key is cloned into the store's
/// map, its expiry index, the cache and the trace, so a clone is a reference count, not an
/// allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key (after removing the quotes, if any) has no bytes.
    #[error("the idempotency key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("the idempotency key is {len} bytes long; at most {MAX_KEY_LEN} are allowed")]
    TooLong {
        /// Length of the decoded key in bytes.
        len: usize,
    },
    /// A byte outside visible ASCII (`0x21..=0x7E`): a space, a control character or non-ASCII.
    #[error(
        "the idempotency key has byte 0x{byte:02x} at position {position}; only visible ASCII (0x21-0x7e) is allowed"
    )]
    InvalidByte {
        /// Offset of the byte in the header value (or in the key given directly).
        position: usize,
        /// The offending byte.
        byte: u8,
    },
    /// A quoted value whose closing quote is missing.
    #[error("the idempotency key starts with a quote but has no closing quote")]
    Unterminated,
    /// A backslash in a quoted value not followed by `"` or `\` (RFC 8941 §4.2.5).
    #[error(
        "the idempotency key has an invalid escape at position {position}; only \\\" and \\\\ are allowed"
    )]
    InvalidEscape {
        /// Offset of the backslash in the header value.
        position: usize,
    },
    /// A comma in a bare (unquoted) header value. A header sent twice reads, to every server
    /// that combines field lines (RFC 9110 §5.3; WSGI servers always do), as its values
    /// joined by commas, so a bare key holding one cannot be told from two keys.
    #[error(
        "the idempotency key has a comma at position {position}: a header sent twice reads as its values joined by commas (RFC 9110 §5.3), so an unquoted key cannot hold one; send one key, or quote it as an sf-string"
    )]
    Comma {
        /// Offset of the comma in the header value.
        position: usize,
    },
    /// Characters after the closing quote (RFC 8941 parameters are not defined for this field).
    #[error("the idempotency key has characters after its closing quote at position {position}")]
    TrailingCharacters {
        /// Offset of the first unexpected byte in the header value.
        position: usize,
    },
}

impl Key {
    /// Accepts a key given directly (a tool argument, a CLI argument): no quoting is removed.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        check_len(value.len())?;
        if let Some((position, &byte)) = value
            .as_bytes()
            .iter()
            .enumerate()
            .find(|(_, b)| !is_visible_ascii(**b))
        {
            return Err(KeyError::InvalidByte { position, byte });
        }
        Ok(Key(value.into()))
    }

    /// Parses an `Idempotency-Key` header value: an RFC 8941 sf-string or a bare value, with
    /// surrounding spaces and tabs ignored as HTTP field values allow.
    pub fn from_header(value: &[u8]) -> Result<Self, KeyError> {
        let start = value
            .iter()
            .position(|b| !is_ows(*b))
            .unwrap_or(value.len());
        let end = value
            .iter()
            .rposition(|b| !is_ows(*b))
            .map_or(start, |i| i + 1);
        let trimmed = &value[start..end];
        if trimmed.first() == Some(&b'"') {
            parse_sf_string(value, start)
        } else {
            check_len(trimmed.len())?;
            if let Some((i, &byte)) = trimmed
                .iter()
                .enumerate()
                .find(|(_, b)| !is_visible_ascii(**b))
            {
                return Err(KeyError::InvalidByte {
                    position: start + i,
                    byte,
                });
            }
            if let Some(i) = trimmed.iter().position(|b| *b == b',') {
                return Err(KeyError::Comma {
                    position: start + i,
                });
            }
            // Checked above: every byte is ASCII, so this cannot fail.
            Ok(Key(String::from_utf8_lossy(trimmed).into()))
        }
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an RFC 8941 sf-string, ready to be sent as a header value.
    pub fn to_header_value(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

fn parse_sf_string(value: &[u8], open: usize) -> Result<Key, KeyError> {
    let mut out = Vec::new();
    let mut i = open + 1;
    loop {
        let Some(&b) = value.get(i) else {
            return Err(KeyError::Unterminated);
        };
        match b {
            b'\\' => {
                match value.get(i + 1) {
                    Some(&e @ (b'"' | b'\\')) => out.push(e),
                    Some(_) => return Err(KeyError::InvalidEscape { position: i }),
                    None => return Err(KeyError::Unterminated),
                }
                i += 2;
            }
            b'"' => break,
            b if is_visible_ascii(b) => {
                out.push(b);
                i += 1;
            }
            byte => return Err(KeyError::InvalidByte { position: i, byte }),
        }
    }
    if let Some(extra) = value[i + 1..].iter().position(|b| !is_ows(*b)) {
        return Err(KeyError::TrailingCharacters {
            position: i + 1 + extra,
        });
    }
    check_len(out.len())?;
    Ok(Key(String::from_utf8_lossy(&out).into()))
}

fn check_len(len: usize) -> Result<(), KeyError> {
    match len {
        0 => Err(KeyError::Empty),
        len if len > MAX_KEY_LEN => Err(KeyError::TooLong { len }),
        _ => Ok(()),
    }
}

const fn is_visible_ascii(b: u8) -> bool {
    matches!(b, 0x21..=0x7e)
}

const fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.0)
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Key::new(s)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(v: &str) -> Result<Key, KeyError> {
        Key::from_header(v.as_bytes())
    }

    #[test]
    fn bare_values_are_accepted() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(header(uuid).map(|k| k.0.to_string()), Ok(uuid.to_string()));
        assert_eq!(
            header("  abc\t").map(|k| k.0.to_string()),
            Ok("abc".to_string())
        );
    }

    #[test]
    fn sf_strings_are_unquoted_and_unescaped() {
        assert_eq!(
            header(r#""abc""#).map(|k| k.0.to_string()),
            Ok("abc".to_string())
        );
        assert_eq!(
            header(r#" "a\"b\\c" "#).map(|k| k.0.to_string()),
            Ok(r#"a"b\c"#.to_string())
        );
    }

    #[test]
    fn header_value_round_trips() {
        for raw in ["abc", r#"a"b\c"#, "~!@#$%^&*()_+"] {
            let key = Key::new(raw).expect("valid");
            let again = header(&key.to_header_value()).expect("round trip");
            assert_eq!(again, key);
        }
    }

    #[test]
    fn refusals_are_precise() {
        assert_eq!(header(""), Err(KeyError::Empty));
        assert_eq!(header("   "), Err(KeyError::Empty));
        assert_eq!(header(r#""""#), Err(KeyError::Empty));
        assert_eq!(
            header("a b"),
            Err(KeyError::InvalidByte {
                position: 1,
                byte: b' '
            })
        );
        assert_eq!(
            header(r#""a b""#),
            Err(KeyError::InvalidByte {
                position: 2,
                byte: b' '
            })
        );
        assert_eq!(
            Key::from_header("café".as_bytes()),
            Err(KeyError::InvalidByte {
                position: 3,
                byte: 0xc3
            })
        );
        assert_eq!(
            header("a\u{7f}"),
            Err(KeyError::InvalidByte {
                position: 1,
                byte: 0x7f
            })
        );
        assert_eq!(header(r#""abc"#), Err(KeyError::Unterminated));
        assert_eq!(header(r#""ab\"#), Err(KeyError::Unterminated));
        assert_eq!(
            header(r#""a\nb""#),
            Err(KeyError::InvalidEscape { position: 2 })
        );
        assert_eq!(
            header(r#""abc";p=1"#),
            Err(KeyError::TrailingCharacters { position: 5 })
        );
        assert_eq!(
            Key::new("a\nb"),
            Err(KeyError::InvalidByte {
                position: 1,
                byte: b'\n'
            })
        );
    }

    /// A header sent twice reads as its values joined by a comma wherever field lines are
    /// combined (every WSGI server): a bare key cannot hold one, a quoted key can.
    #[test]
    fn a_bare_comma_is_two_keys_and_a_quoted_one_is_a_character() {
        assert_eq!(header("a,b"), Err(KeyError::Comma { position: 1 }));
        assert_eq!(header(" k-1,k-2"), Err(KeyError::Comma { position: 4 }));
        assert_eq!(
            header(r#""a,b""#).map(|k| k.0.to_string()),
            Ok("a,b".to_string())
        );
        assert!(matches!(
            header(r#""a", "b""#),
            Err(KeyError::TrailingCharacters { .. })
        ));
        assert_eq!(
            Key::new("a,b").map(|k| k.0.to_string()),
            Ok("a,b".to_string()),
            "given directly"
        );
    }

    #[test]
    fn length_bounds_count_decoded_bytes() {
        let max = "k".repeat(MAX_KEY_LEN);
        assert!(header(&max).is_ok());
        assert!(header(&format!("\"{max}\"")).is_ok());
        assert_eq!(
            header(&format!("{max}k")),
            Err(KeyError::TooLong {
                len: MAX_KEY_LEN + 1
            })
        );
        assert_eq!(
            header(&format!("\"{max}k\"")),
            Err(KeyError::TooLong {
                len: MAX_KEY_LEN + 1
            })
        );
        // An escape takes two bytes on the wire but one in the key.
        let escaped = format!("\"{}\"", r#"\""#.repeat(MAX_KEY_LEN));
        assert_eq!(header(&escaped).map(|k| k.0.len()), Ok(MAX_KEY_LEN));
    }

    #[test]
    fn every_visible_ascii_byte_is_a_key() {
        for b in 0x21u8..=0x7e {
            let s = (b as char).to_string();
            assert!(Key::new(s.clone()).is_ok(), "{s:?}");
            if b != b'"' && b != b',' {
                assert!(header(&s).is_ok(), "{s:?}");
            }
        }
        for b in (0u8..=0x20).chain(0x7f..=0xff) {
            assert!(Key::from_header(&[b'a', b, b'a']).is_err(), "{b:#x}");
        }
    }
}
