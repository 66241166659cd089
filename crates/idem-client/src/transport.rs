//! How a tool call travels. HTTP is one transport; the MCP proxy will be another.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use idem_core::Key;
use serde_json::Value;

/// One attempt of a call, as handed to a transport.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The tool.
    pub tool: &'a str,
    /// The arguments (with `idempotency_key` inserted for an effect when the client was told
    /// to, [`crate::ToolClient::key_in_args`]).
    pub args: &'a Value,
    /// The key, for effects: sent as `Idempotency-Key` where the transport has headers.
    pub key: Option<&'a Key>,
    /// 1 for the first attempt.
    pub attempt: u32,
}

/// What the other side answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP-style status.
    pub status: u16,
    /// `Retry-After`, when the server sent one.
    pub retry_after: Option<Duration>,
    /// Whether the answer is a replay of an earlier execution (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// The body.
    pub body: Bytes,
}

/// Why an attempt got no answer, and so whether the request may have had an effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The request surely did not reach the server (connection refused, DNS).
    #[error("not sent: {0}")]
    NotSent(String),
    /// The request may have reached the server: a timeout or a reset after sending.
    #[error("sent, no answer: {0}")]
    NoAnswer(String),
}

/// Sends one attempt.
pub trait Transport: Send + Sync {
    /// Sends `req` and waits for the answer.
    fn send(
        &self,
        req: Request<'_>,
    ) -> impl Future<Output = Result<Response, TransportError>> + Send;
}

/// Tools over HTTP: `POST {base}/{tool}` with the arguments as a JSON body.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    base: String,
    routes: std::collections::HashMap<String, String>,
    /// The header's key unquoted ([`HttpTransport::bare_key_header`]).
    bare_key: bool,
}

impl HttpTransport {
    /// Calls tools under `base` (e.g. `http://127.0.0.1:8080/tools`), each attempt bounded by
    /// `timeout`.
    pub fn new(base: impl Into<String>, timeout: Duration) -> Result<Self, TransportError> {
        // reqwest's TLS stack takes the process's default rustls provider, and builds without
        // one may panic here: install ring's unless the process chose another.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Redirects are not followed: a connect failure on a redirect target would look like
        // "not sent" for a request that was executed.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
            .map_err(|e| TransportError::NotSent(e.to_string()))?;
        Ok(HttpTransport {
            client,
            base: base.into().trim_end_matches('/').to_owned(),
            routes: std::collections::HashMap::new(),
            bare_key: false,
        })
    }

    /// Writes the `Idempotency-Key` header's key as it is, not as the RFC 8941 sf-string the
    /// IETF draft writes (`"k"`): for a service that compares raw header values, which would
    /// take `"k"` and `k` for two keys (many Stripe-style APIs). idem's own front ends read
    /// both as one.
    pub fn bare_key_header(mut self) -> Self {
        self.bare_key = true;
        self
    }

    /// Sends `tool` to `path` under the base instead of `/{tool}`.
    pub fn route(mut self, tool: impl Into<String>, path: impl Into<String>) -> Self {
        self.routes.insert(tool.into(), path.into());
        self
    }
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    // Seconds only; an HTTP date is rare from APIs and is then treated as absent.
    // Capped at a day: the retry policy's total bound decides anyway.
    v.trim()
        .parse::<u64>()
        .ok()
        .map(|s| Duration::from_secs(s.min(86_400)))
}

impl Transport for HttpTransport {
    async fn send(&self, req: Request<'_>) -> Result<Response, TransportError> {
        let mut http = self
            .client
            .post(match self.routes.get(req.tool) {
                Some(path) => format!("{}{path}", self.base),
                None => format!("{}/{}", self.base, req.tool),
            })
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(req.args.to_string());
        if let Some(key) = req.key {
            http = if self.bare_key {
                http.header("idempotency-key", key.as_str())
            } else {
                http.header("idempotency-key", key.to_header_value())
            };
        }
        let classify = |e: reqwest::Error| {
            if e.is_connect() {
                TransportError::NotSent(e.to_string())
            } else {
                TransportError::NoAnswer(e.to_string())
            }
        };
        let resp = http.send().await.map_err(classify)?;
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers());
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        // A body cut off midway is an answer we did not get: the call may have happened.
        let body = resp
            .bytes()
            .await
            .map_err(|e| TransportError::NoAnswer(e.to_string()))?;
        Ok(Response {
            status,
            retry_after,
            replayed,
            body,
        })
    }
}
