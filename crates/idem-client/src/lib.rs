//! The runtime side ([design §7](docs/design.md#7-the-runtime-side)): a tool client for agent
//! runtimes that retries safely.
//!
//! For an effect (a tool that charges, sends, provisions) the key is derived **once**, at the
//! point of intent, with [`idem_keys`], and sent on **every** attempt as the header
//! `Idempotency-Key` (an RFC 8941 sf-string, or bare: [`HttpTransport::bare_key_header`]; in the
//! arguments too only when asked: [`ToolClient::key_in_args`]). Retries use exponential backoff with full
//! jitter, bounded in attempts and total time, and honour `Retry-After` on 409, 429 and 503.
//! Timeouts and resets are retried when that is safe: always with a key, never for an effect
//! sent without one. 400 and 422 are never retried.
//!
//! ```no_run
//! use idem_client::{Category, HttpTransport, Intent, ToolClient, ToolPolicy};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = ToolClient::new(HttpTransport::new("http://127.0.0.1:8080/tools",
//! std::time::Duration::from_secs(10))?); let intent = Intent {
//!     scope: "turn_9f3a".into(),
//!     tool: "charge_card".into(),
//!     args: serde_json::json!({"customer": "cus_8g2k", "amount_cents": 4900}),
//!     ordinal: 0,
//!     policy: ToolPolicy::effect(Category::Money),
//! };
//! let response = client.call(&intent).await?;
//! # Ok(()) }
//! ```

pub mod client;
pub mod policy;
pub mod transport;

pub use client::{Attempt, AttemptOutcome, CallError, Intent, ToolClient};
pub use policy::{Category, RetryPolicy, ToolClass, ToolPolicies, ToolPolicy};
pub use transport::{HttpTransport, Request, Response, Transport, TransportError};
