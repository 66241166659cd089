//! JSON-RPC messages as the relay sees them: the few members it reads, the original bytes for
//! everything else ([design §8](docs/design.md#8-mcp): relay, do not rebuild).
//!
//! A message is read into an [`Envelope`] that borrows `id`, `params`, `result` and `error` as
//! raw JSON; a message the proxy does not interpret is forwarded as the bytes it came in, so
//! members and methods of protocol versions newer than this code pass unchanged. Messages are
//! read with a size bound ([`Lines`]): one over it is not buffered, only hashed, and its `id`
//! is found by a scanner that reads it as it streams past ([`IdScan`]), so the request it
//! answers can be told promptly.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The largest message the proxy buffers: a larger one is hashed and answered as too large.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// The members of a JSON-RPC message the proxy reads.
#[derive(Debug, Deserialize)]
pub struct Envelope<'a> {
    /// The request or response id (absent in notifications).
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    /// The method of a request or notification.
    #[serde(default)]
    pub method: Option<String>,
    /// Its parameters.
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
    /// A response's result.
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    /// A response's error.
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

impl<'a> Envelope<'a> {
    /// Reads the envelope of one message; `None` for anything that is not a JSON object
    /// (a batch, garbage): such messages are relayed as they are.
    pub fn parse(bytes: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    /// The id as text (`1`, `"abc"`), the key the relay matches responses by.
    pub fn id_text(&self) -> Option<String> {
        self.id.map(|id| id.get().to_owned())
    }

    /// A request: a method and an id.
    pub fn is_request(&self) -> bool {
        self.method.is_some() && self.id.is_some()
    }

    /// A response: no method, an id, a result or an error.
    pub fn is_response(&self) -> bool {
        self.method.is_none() && (self.result.is_some() || self.error.is_some())
    }

    /// The params as a JSON value (`Null` when absent or unreadable).
    pub fn params_value(&self) -> Value {
        self.params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null)
    }
}

/// A response with `result` (raw JSON) to the request `id` (raw JSON text).
pub fn response(id: &str, result: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#).into_bytes()
}

/// An error response with the error object `error` (raw JSON) to the request `id`.
pub fn error_response(id: &str, error: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#).into_bytes()
}

/// A JSON-RPC error object.
pub fn error_object(code: i64, message: &str) -> String {
    serde_json::json!({ "code": code, "message": message }).to_string()
}

/// A request the proxy sends itself, with its own `id` (raw JSON text).
pub fn request(id: &str, method: &str, params: &Value) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#).into_bytes()
}

/// JSON-RPC's internal error code.
pub const INTERNAL_ERROR: i64 = -32603;

/// One message read off a stream.
#[derive(Debug)]
pub enum Line {
    /// The whole message, without its line end.
    Whole(Vec<u8>),
    /// Over [`MAX_MESSAGE`]: only what identifies it was kept.
    Oversized {
        /// The top-level `id` member's raw text, if it had one.
        id: Option<String>,
        /// Its length in bytes.
        len: u64,
        /// SHA-256 of the message.
        sha256: [u8; 32],
    },
}

/// Reads newline-delimited messages with a size bound.
#[derive(Debug)]
pub struct Lines<R> {
    reader: R,
    max: usize,
    keep_empty: bool,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    /// Messages off `reader`, each buffered up to `max` bytes.
    pub fn new(reader: R, max: usize) -> Self {
        Lines {
            reader,
            max,
            keep_empty: false,
        }
    }

    /// Lines of an SSE stream: empty lines (the ends of events) are kept.
    pub fn sse(reader: R, max: usize) -> Self {
        Lines {
            reader,
            max,
            keep_empty: true,
        }
    }

    /// The next message; `None` at the end of the stream. Empty lines are skipped.
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let mut buf = Vec::new();
            let mut over: Option<(Sha256, u64)> = None;
            let mut scan = IdScan::default();
            let mut ended = false;
            loop {
                let chunk = self.reader.fill_buf().await?;
                if chunk.is_empty() {
                    ended = true;
                    break;
                }
                let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
                    Some(i) => (&chunk[..i], Some(i + 1)),
                    None => (chunk, None),
                };
                scan.feed(part);
                match &mut over {
                    Some((hash, len)) => {
                        hash.update(part);
                        *len += part.len() as u64;
                    }
                    None if buf.len() + part.len() > self.max => {
                        let mut hash = Sha256::new();
                        hash.update(&buf);
                        hash.update(part);
                        over = Some((hash, (buf.len() + part.len()) as u64));
                        buf = Vec::new();
                    }
                    None => buf.extend_from_slice(part),
                }
                let used = done.unwrap_or(part.len());
                self.reader.consume(used);
                if done.is_some() {
                    break;
                }
            }
            if let Some((hash, len)) = over {
                return Ok(Some(Line::Oversized {
                    id: scan.found,
                    len,
                    sha256: hash.finalize().into(),
                }));
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            if ended && buf.is_empty() {
                return Ok(None);
            }
            if self.keep_empty || !buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some(Line::Whole(buf)));
            }
        }
    }
}

/// Finds the top-level `id` member of a JSON object streamed past it in pieces, wherever the
/// member is, without keeping the object.
#[derive(Debug, Default)]
pub struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1: 0 expecting a key, 1 reading a key, 2 expecting ':', 3 in a value.
    state: u8,
    key: Vec<u8>,
    key_is_id: bool,
    capture: Option<Vec<u8>>,
    /// The `id` member's raw text, once read.
    pub found: Option<String>,
}

impl IdScan {
    /// Feeds the next bytes of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if let Some(c) = &mut self.capture
            && c.len() < 512
            && !(self.depth == 1 && !self.in_string && (b == b',' || b == b'}'))
        {
            c.push(b);
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.depth == 1 && self.state == 1 {
                    self.state = 2;
                    self.key_is_id = self.key == b"id";
                }
                return;
            }
            if self.depth == 1 && self.state == 1 && self.key.len() < 8 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.state == 0 {
                    self.state = 1;
                    self.key.clear();
                }
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                if self.depth == 1 {
                    self.finish_value();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 && self.state == 2 => {
                self.state = 3;
                if self.key_is_id && self.found.is_none() {
                    self.capture = Some(Vec::new());
                }
            }
            b',' if self.depth == 1 => {
                self.finish_value();
                self.state = 0;
            }
            _ => {}
        }
    }

    fn finish_value(&mut self) {
        if let Some(c) = self.capture.take() {
            let text = String::from_utf8_lossy(&c).trim().to_owned();
            if !text.is_empty() {
                self.found = Some(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(s: &str) -> Option<String> {
        let mut sc = IdScan::default();
        for piece in s.as_bytes().chunks(3) {
            sc.feed(piece);
        }
        sc.found
    }

    #[test]
    fn finds_the_top_level_id_wherever_it_is() {
        assert_eq!(
            scan(r#"{"jsonrpc":"2.0","id":7,"result":{"id":9}}"#).as_deref(),
            Some("7")
        );
        assert_eq!(
            scan(r#"{"result":{"id":9,"x":[1,{"id":3}]},"id":"a\"b","jsonrpc":"2.0"}"#).as_deref(),
            Some(r#""a\"b""#)
        );
        assert_eq!(
            scan(r#"{"result":{"text":"\"id\":5"},"id" : 12 }"#).as_deref(),
            Some("12")
        );
        assert_eq!(scan(r#"{"method":"x","params":{"id":1}}"#), None);
        assert_eq!(scan(r#"data: {"id":4,"result":{}}"#).as_deref(), Some("4"));
    }

    #[tokio::test]
    async fn a_message_over_the_bound_is_hashed_not_kept() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"result\":{{\"t\":\"{}\"}},\"id\":3}}",
            "x".repeat(100)
        );
        let input = format!("{{\"id\":1}}\n\n{big}\r\n{{\"id\":2}}");
        let mut lines = Lines::new(input.as_bytes(), 64);
        assert!(matches!(lines.next().await, Ok(Some(Line::Whole(b))) if b == br#"{"id":1}"#));
        match lines.next().await {
            Ok(Some(Line::Oversized { id, len, sha256 })) => {
                assert_eq!(id.as_deref(), Some("3"));
                assert_eq!(len, big.len() as u64 + 1);
                let mut h = Sha256::new();
                h.update(big.as_bytes());
                h.update(b"\r");
                assert_eq!(sha256, <[u8; 32]>::from(h.finalize()));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(lines.next().await, Ok(Some(Line::Whole(b))) if b == br#"{"id":2}"#));
        assert!(matches!(lines.next().await, Ok(None)));
    }
}
