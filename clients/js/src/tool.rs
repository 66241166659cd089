//! A store and a tool declared on it, and the `Lane` each store's calls take off the event
//! loop.

use std::time::Duration;

use napi::bindgen_prelude::{AsyncTask, Buffer, Either, Object};
use napi::{Env, Task};
use napi_derive::napi;

use idem_embed::{EmbedError, KeyFields, PriorKind, Started, ToolPolicy};
use idem_stores::StoreUrl;

use crate::derive::{derive_text, ordinal, parse_fields};
use crate::ticket::Ticket;
use crate::{embed_error, js_error, settled_later};

/// An open store (one engine per URL per process, shared by every tool and worker thread).
#[napi]
#[derive(Debug, Clone)]
pub struct Store {
    inner: idem_embed::Store,
    lane: Lane,
}

/// Where a store's `begin` and `finish` run, so that none blocks the event loop and each
/// crosses as few threads as its store allows (measured in docs/benchmarks.md, "Node.js").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// On the calling thread: a `memory:` store does no I/O, and a hop to any other thread and
    /// back costs more than the whole call.
    Inline,
    /// On libuv's thread pool, blocking there: a SQLite store's I/O runs on its own threads,
    /// which a pool thread reaches directly. Through a task on idem's runtime a SQLite replay
    /// cost 30 – 45 µs more (the runtime's workers wake each other on the way).
    Pool,
    /// As a task on idem's runtime, settling a promise: a PostgreSQL or Redis store's
    /// connections are driven by tasks on that runtime, so a call from the pool crossed to it
    /// and back as well; from the event loop straight to the runtime is one hop fewer.
    Runtime,
}

impl Lane {
    /// The lane of the store at `url` (a URL that does not parse fails when opened).
    pub(crate) fn of(url: &str) -> Self {
        match url.parse() {
            Ok(StoreUrl::Memory) => Lane::Inline,
            Ok(StoreUrl::Sqlite { .. }) => Lane::Pool,
            _ => Lane::Runtime,
        }
    }
}

#[napi]
impl Store {
    /// The URL with any password replaced, for messages.
    #[napi(getter)]
    pub fn redacted(&self) -> String {
        self.inner.redacted()
    }

    /// Whether calls may run on the calling thread: a `memory:` store answers without I/O, so
    /// only a wait for a duplicate in flight would block (and that goes to the thread pool).
    /// A hop to the pool and back costs tens of microseconds, more than the whole call.
    #[napi(getter)]
    pub fn inline(&self) -> bool {
        self.lane == Lane::Inline
    }
}

/// Opens a store off the event loop (creating a SQLite file, connecting to PostgreSQL or
/// Redis).
#[derive(Debug)]
pub struct OpenStore {
    url: String,
}

impl Task for OpenStore {
    type Output = Store;
    type JsValue = Store;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let lane = Lane::of(&self.url);
        let inner = idem_embed::Store::open(&self.url).map_err(|e| embed_error(&e))?;
        Ok(Store { inner, lane })
    }

    fn resolve(&mut self, _env: Env, store: Self::Output) -> napi::Result<Store> {
        Ok(store)
    }
}

/// Opens the store at `url` (`memory:`, `sqlite:PATH`, `postgres://...`, `redis://...`).
#[napi(ts_return_type = "Promise<Store>")]
pub fn open_store(url: String) -> AsyncTask<OpenStore> {
    AsyncTask::new(OpenStore { url })
}

/// Closes the process's stores as it exits (`native.js` calls it on Node's `exit` event): a
/// SQLite store's file is then complete and alone, with no `-wal` or `-shm` beside it. A call
/// after it rejects with `StoreUnavailableError`. Synchronous, as `exit` listeners must be: it
/// waits for the store's writer to commit what is queued.
#[napi]
pub fn shutdown() {
    idem_embed::shutdown();
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
    /// The policy without the wait, for [`Tool::begin_now`].
    at_once: ToolPolicy,
    waits: bool,
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
        let max = {
            // Checked above: integral, non-negative, below 2^53.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            {
                max as usize
            }
        };
        let lease = duration("lease", options.lease_ms)?;
        let retention = duration("retention", options.retention_ms)?;
        let policy = |wait| {
            ToolPolicy::new(lease, retention, wait, &options.on_abandoned, max)
                .map_err(|e| embed_error(&e))
        };
        Ok(Tool {
            policy: policy(wait)?,
            at_once: policy(None)?,
            waits: wait.is_some(),
            name: options.name,
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

    /// Derives the key of a call in `scope` and claims it on this thread, for an inline
    /// (`memory:`) store only, parsing the arguments once: the replay path of a `memory:`
    /// store in one crossing. Kind `wait` (with `key`) when a duplicate is in flight and the
    /// tool waits for it: then call [`Tool::begin_waiting`] with that key.
    #[napi]
    pub fn derive_and_begin_now(
        &self,
        store: &Store,
        scope: String,
        args_json: String,
        ordinal_: Option<f64>,
    ) -> napi::Result<BeginOutcome> {
        inline_only(store)?;
        let args = idem_keys::parse_args(&args_json).map_err(|e| js_error("derive", e))?;
        let key = idem_embed::derive_key(
            &scope,
            &self.name,
            &args,
            ordinal(ordinal_)?,
            self.secret.as_deref(),
            self.fields.as_ref(),
        )
        .map_err(|e| match e {
            EmbedError::Field(f) => js_error("invalid", f),
            other => js_error("derive", other),
        })?;
        let started = store
            .inner
            .begin(
                key.as_str(),
                &self.name,
                &args,
                self.fields.as_ref(),
                &self.at_once,
            )
            .map_err(|e| embed_error(&e))?;
        let mut out = if self.must_wait(&started) {
            BeginOutcome {
                kind: "wait".into(),
                ..BeginOutcome::default()
            }
        } else {
            outcome(started, Lane::Inline)
        };
        out.key = Some(key.as_str().to_owned());
        Ok(out)
    }

    fn must_wait(&self, started: &Started) -> bool {
        must_wait(self.waits, started)
    }

    /// Claims `key` on this thread, for an inline (`memory:`) store only. `null` when a
    /// duplicate is in flight and the tool waits for it: then call [`Tool::begin_waiting`].
    #[napi]
    pub fn begin_now(
        &self,
        store: &Store,
        key: String,
        args_json: String,
    ) -> napi::Result<Option<BeginOutcome>> {
        inline_only(store)?;
        let started = begin(
            &store.inner,
            &key,
            &self.name,
            &args_json,
            self.fields.as_ref(),
            &self.at_once,
        )?;
        if self.must_wait(&started) {
            return Ok(None);
        }
        Ok(Some(outcome(started, Lane::Inline)))
    }

    /// Claims `key` for a call with these arguments off the event loop (the store's
    /// `Lane`), without waiting: kind `wait` when a duplicate is in flight and the tool
    /// waits for it; then call [`Tool::begin_waiting`].
    #[napi(ts_return_type = "Promise<BeginOutcome>")]
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        store: &Store,
        key: String,
        args_json: String,
    ) -> napi::Result<Either<AsyncTask<Begin>, Object<'env>>> {
        let (waits, lane) = (self.waits, store.lane);
        if lane == Lane::Pool {
            return Ok(Either::A(AsyncTask::new(Begin {
                store: store.inner.clone(),
                tool: self.name.clone(),
                policy: self.at_once.clone(),
                waits,
                fields: self.fields.clone(),
                key,
                args_json,
            })));
        }
        let begun = self.begin_later(env, store, &key, &args_json, &self.at_once, move |s| {
            if must_wait(waits, &s) {
                return BeginOutcome {
                    kind: "wait".into(),
                    ..BeginOutcome::default()
                };
            }
            outcome(s, lane)
        });
        begun.map(Either::B)
    }

    /// Claims `key`, waiting for a duplicate in flight, as a task on idem's runtime on every
    /// store: the wait holds no thread, so no number of waiting duplicates delays the
    /// `finish` that ends their wait (on libuv's pool, four of them, the pool's size, queued
    /// it behind them until their wait ran out).
    #[napi(ts_return_type = "Promise<BeginOutcome>")]
    pub fn begin_waiting<'env>(
        &self,
        env: &'env Env,
        store: &Store,
        key: String,
        args_json: String,
    ) -> napi::Result<Object<'env>> {
        let lane = store.lane;
        self.begin_later(env, store, &key, &args_json, &self.policy, move |s| {
            outcome(s, lane)
        })
    }

    /// `begin` under `policy`, settling the returned promise with `to_js` of what it came to
    /// (or rejecting it: a value of the call's refused, the store unusable).
    fn begin_later<'env>(
        &self,
        env: &'env Env,
        store: &Store,
        key: &str,
        args_json: &str,
        policy: &ToolPolicy,
        to_js: impl FnOnce(Started) -> BeginOutcome + Send + 'static,
    ) -> napi::Result<Object<'env>> {
        settled_later(env, |settle| {
            let args = parse_args_json(args_json)?;
            store
                .inner
                .begin_then(key, &self.name, &args, self.fields.as_ref(), policy, |r| {
                    settle.settle(r.map_err(|e| embed_error(&e)).map(to_js));
                })
                .map_err(|e| embed_error(&e))
        })
    }
}

/// [`Tool::begin`]'s work on libuv's pool (`Lane::Pool`).
#[derive(Debug)]
pub struct Begin {
    store: idem_embed::Store,
    tool: String,
    /// The tool's policy without the wait.
    policy: ToolPolicy,
    waits: bool,
    fields: Option<KeyFields>,
    key: String,
    args_json: String,
}

impl Task for Begin {
    type Output = Started;
    type JsValue = BeginOutcome;

    fn compute(&mut self) -> napi::Result<Started> {
        begin(
            &self.store,
            &self.key,
            &self.tool,
            &self.args_json,
            self.fields.as_ref(),
            &self.policy,
        )
    }

    fn resolve(&mut self, _env: Env, started: Started) -> napi::Result<BeginOutcome> {
        if must_wait(self.waits, &started) {
            return Ok(BeginOutcome {
                kind: "wait".into(),
                ..BeginOutcome::default()
            });
        }
        Ok(outcome(started, Lane::Pool))
    }
}

/// A claim made without waiting met a duplicate in flight, and the tool waits for it.
fn must_wait(waits: bool, started: &Started) -> bool {
    waits && matches!(started, Started::Prior(p) if p.kind == PriorKind::InFlight)
}

fn inline_only(store: &Store) -> napi::Result<()> {
    if store.lane == Lane::Inline {
        Ok(())
    } else {
        Err(js_error(
            "invalid",
            "calls on this thread are for memory: stores; a store with I/O must use begin",
        ))
    }
}

fn parse_args_json(args_json: &str) -> napi::Result<serde_json::Value> {
    serde_json::from_str(args_json)
        .map_err(|e| js_error("invalid", format!("the arguments are not JSON: {e}")))
}

fn begin(
    store: &idem_embed::Store,
    key: &str,
    tool: &str,
    args_json: &str,
    fields: Option<&KeyFields>,
    policy: &ToolPolicy,
) -> napi::Result<Started> {
    let args = parse_args_json(args_json)?;
    store
        .begin(key, tool, &args, fields, policy)
        .map_err(|e: EmbedError| embed_error(&e))
}

/// `lane`: where the ticket is finished (its store's).
fn outcome(started: Started, lane: Lane) -> BeginOutcome {
    match started {
        Started::Execute(ticket) => BeginOutcome {
            kind: "execute".into(),
            ticket: Some(Ticket::new(ticket, lane)),
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
            key: None,
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
    }
}

/// What `begin` came to: `execute` (run the function, then finish the ticket), or an answer
/// that runs nothing: `replayed`, `in_flight`, `mismatch`, `unknown`.
#[napi(object, object_from_js = false)]
#[derive(Default)]
pub struct BeginOutcome {
    /// `execute`, `replayed`, `in_flight`, `mismatch` or `unknown` (or, from
    /// `deriveAndBeginNow` or `begin`, `wait`: call `beginWaiting` to wait for a duplicate in
    /// flight).
    pub kind: String,
    /// From `deriveAndBeginNow`: the derived key.
    pub key: Option<String>,
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
