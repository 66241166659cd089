//! A store and a tool declared on it: `begin` on libuv's thread pool.

use std::time::Duration;

use napi::bindgen_prelude::{AsyncTask, Buffer};
use napi::{Env, Task};
use napi_derive::napi;

use idem_embed::{EmbedError, KeyFields, PriorKind, Started, ToolPolicy};

use crate::derive::{derive_text, ordinal, parse_fields};
use crate::ticket::Ticket;
use crate::{embed_error, js_error};

/// An open store (one engine per URL per process, shared by every tool and worker thread).
#[napi]
#[derive(Debug, Clone)]
pub struct Store {
    inner: idem_embed::Store,
}

#[napi]
impl Store {
    /// The URL with any password replaced, for messages.
    #[napi(getter)]
    pub fn redacted(&self) -> String {
        self.inner.redacted()
    }
}

/// Opens a store off the event loop (creating a SQLite file, connecting to PostgreSQL or
/// Redis).
#[derive(Debug)]
pub struct OpenStore {
    url: String,
}

impl Task for OpenStore {
    type Output = idem_embed::Store;
    type JsValue = Store;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        idem_embed::Store::open(&self.url).map_err(|e| embed_error(&e))
    }

    fn resolve(&mut self, _env: Env, inner: Self::Output) -> napi::Result<Store> {
        Ok(Store { inner })
    }
}

/// Opens the store at `url` (`memory:`, `sqlite:PATH`, `postgres://...`, `redis://...`).
#[napi(ts_return_type = "Promise<Store>")]
pub fn open_store(url: String) -> AsyncTask<OpenStore> {
    AsyncTask::new(OpenStore { url })
}

/// A tool's declaration: its name and policy, validated once (when the JavaScript function is
/// wrapped, so a bad value fails there and not at the first call).
#[napi(object)]
pub struct ToolOptions {
    /// The tool's name: part of every key and of the fingerprint.
    pub name: String,
    /// How long a claim lasts without a heartbeat, in milliseconds.
    pub lease_ms: f64,
    /// How long a result is kept for replay, in milliseconds.
    pub retention_ms: f64,
    /// How long a duplicate waits for a call in flight (milliseconds); `null`: not at all.
    pub wait_ms: Option<f64>,
    /// `reject` or `retry`.
    pub on_abandoned: String,
    /// Results larger than this are kept as a digest only.
    pub max_result_bytes: f64,
    /// Derive keys (and fingerprints) from these arguments only.
    pub key_fields: Option<Vec<String>>,
    /// HMAC secret for derived keys.
    pub secret: Option<Buffer>,
}

impl std::fmt::Debug for ToolOptions {
    /// Leaves the secret out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolOptions")
            .field("name", &self.name)
            .field("key_fields", &self.key_fields)
            .finish_non_exhaustive()
    }
}

/// A tool's validated declaration; each call names its store.
#[napi]
pub struct Tool {
    name: String,
    policy: ToolPolicy,
    fields: Option<KeyFields>,
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for Tool {
    /// Leaves the secret out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("fields", &self.fields)
            .finish_non_exhaustive()
    }
}

fn duration(what: &str, ms: f64) -> napi::Result<Duration> {
    Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
        js_error(
            "invalid",
            format!("{what} must be a non-negative number of milliseconds, not {ms}"),
        )
    })
}

#[napi]
impl Tool {
    /// Validates the policy and key fields (throws `invalid: ...` on a bad value).
    #[napi(constructor)]
    pub fn new(options: ToolOptions) -> napi::Result<Self> {
        if options.name.is_empty() {
            return Err(js_error("invalid", "a tool needs a non-empty name"));
        }
        let wait = options.wait_ms.map(|ms| duration("wait", ms)).transpose()?;
        let max = options.max_result_bytes;
        if !(max >= 0.0 && max.fract() == 0.0 && max <= 9_007_199_254_740_991.0) {
            return Err(js_error(
                "invalid",
                format!("maxResultBytes must be a whole number of bytes, not {max}"),
            ));
        }
        let policy = ToolPolicy::new(
            duration("lease", options.lease_ms)?,
            duration("retention", options.retention_ms)?,
            wait,
            &options.on_abandoned,
            // Checked above: integral, non-negative, below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            {
                max as usize
            },
        )
        .map_err(|e| embed_error(&e))?;
        Ok(Tool {
            name: options.name,
            policy,
            fields: parse_fields(options.key_fields)?,
            secret: options.secret.map(|b| b.to_vec()),
        })
    }

    /// The key of a call with these arguments (JSON text) in `scope`.
    #[napi]
    pub fn derive(
        &self,
        scope: String,
        args_json: String,
        ordinal_: Option<f64>,
    ) -> napi::Result<String> {
        derive_text(
            &scope,
            &self.name,
            &args_json,
            ordinal(ordinal_)?,
            self.secret.as_deref(),
            self.fields.as_ref(),
        )
    }

    /// Claims `key` for a call with these arguments, off the event loop (it may wait for a
    /// duplicate in flight).
    #[napi(ts_return_type = "Promise<BeginOutcome>")]
    pub fn begin(&self, store: &Store, key: String, args_json: String) -> AsyncTask<Begin> {
        AsyncTask::new(Begin {
            store: store.inner.clone(),
            tool: self.name.clone(),
            policy: self.policy.clone(),
            fields: self.fields.clone(),
            key,
            args_json,
        })
    }
}

/// [`Tool::begin`]'s work.
#[derive(Debug)]
pub struct Begin {
    store: idem_embed::Store,
    tool: String,
    policy: ToolPolicy,
    fields: Option<KeyFields>,
    key: String,
    args_json: String,
}

impl Task for Begin {
    type Output = Started;
    type JsValue = BeginOutcome;

    fn compute(&mut self) -> napi::Result<Started> {
        let args: serde_json::Value = serde_json::from_str(&self.args_json)
            .map_err(|e| js_error("invalid", format!("the arguments are not JSON: {e}")))?;
        self.store
            .begin(
                &self.key,
                &self.tool,
                &args,
                self.fields.as_ref(),
                &self.policy,
            )
            .map_err(|e: EmbedError| embed_error(&e))
    }

    fn resolve(&mut self, _env: Env, started: Started) -> napi::Result<BeginOutcome> {
        Ok(match started {
            Started::Execute(ticket) => BeginOutcome {
                kind: "execute".into(),
                ticket: Some(Ticket::new(ticket)),
                ..BeginOutcome::default()
            },
            Started::Prior(p) => BeginOutcome {
                kind: match p.kind {
                    PriorKind::Replayed => "replayed",
                    PriorKind::InFlight => "in_flight",
                    PriorKind::Mismatch => "mismatch",
                    PriorKind::Unknown => "unknown",
                    PriorKind::Found => "found",
                }
                .into(),
                ticket: None,
                state: Some(p.state.into()),
                status: p.status.map(u32::from),
                body: p.body.map(Buffer::from),
                // Lengths and counts are far below 2^53.
                #[allow(clippy::cast_precision_loss)]
                omitted_len: p.omitted_len.map(|n| n as f64),
                media_type: p.media_type,
                attempts: p.attempts,
                replays: p.replays,
            },
        })
    }
}

/// What `begin` came to: `execute` (run the function, then finish the ticket), or an answer
/// that runs nothing: `replayed`, `in_flight`, `mismatch`, `unknown`.
#[napi(object, object_from_js = false)]
#[derive(Default)]
pub struct BeginOutcome {
    /// `execute`, `replayed`, `in_flight`, `mismatch` or `unknown`.
    pub kind: String,
    /// With `execute`: the claim to finish.
    pub ticket: Option<Ticket>,
    /// The record's state: `in_flight`, `completed` or `abandoned`.
    pub state: Option<String>,
    /// The stored status: 200 (returned) or 500 (a kept error).
    pub status: Option<u32>,
    /// The stored body, when kept whole.
    pub body: Option<Buffer>,
    /// The length of a body kept as a digest only.
    pub omitted_len: Option<f64>,
    /// The stored media type.
    pub media_type: Option<String>,
    /// How many times an executor took the key.
    pub attempts: u32,
    /// How many times the result was replayed before.
    pub replays: u32,
}

impl std::fmt::Debug for BeginOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeginOutcome")
            .field("kind", &self.kind)
            .field("state", &self.state)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}
