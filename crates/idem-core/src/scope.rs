//! The scope: whose keys these are.
//!
//! [design §1](docs/design.md#1-words): keys of two scopes never meet. The HTTP side derives the
//! scope from the caller's principal (for example the `Authorization` header) by hashing it, so the
//! store never holds the secret; the MCP proxy over stdio uses a configured name. Either way the
//! store sees one short, printable label.

use std::fmt;

use sha2::{Digest, Sha256};

/// Longest scope label accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 128;

/// The label of the anonymous scope: requests that carry no principal.
pub const ANONYMOUS: &str = "anonymous";

/// A validated scope label.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(String);

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
        Ok(Scope(label))
    }

    /// The scope of callers without a principal.
    pub fn anonymous() -> Self {
        Scope(ANONYMOUS.to_owned())
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
        Scope(format!("p:{}", hex::encode(hasher.finalize())))
    }

    /// The scope of a request named by its headers: the hash of the values of `names` (each
    /// value with its header's name, in the order of `names`), or the anonymous scope when
    /// none is present. The HTTP layer, the gateway, the MCP proxy over HTTP and `idem inspect
    /// --principal` all compute it here, so an operator finds a caller's records.
    pub fn from_headers(headers: &http::HeaderMap, names: &[http::HeaderName]) -> Self {
        let parts: Vec<&[u8]> = names
            .iter()
            .flat_map(|name| {
                headers
                    .get_all(name)
                    .iter()
                    .flat_map(move |v| [name.as_str().as_bytes(), v.as_bytes()])
            })
            .collect();
        if parts.is_empty() {
            Scope::anonymous()
        } else {
            Scope::from_principal(parts)
        }
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
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
}
