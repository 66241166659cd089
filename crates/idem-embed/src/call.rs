//! One call of a host language's function through the engine: [`Store::begin`], the
//! function, [`Ticket::finish`].
//!
//! The record's result is what the host's codec made of the function's return value (or of a
//! kept exception), stored as a response with a status from this one vocabulary, so `idem
//! inspect` shows it and both languages read each other's records:
//!
//! | status | meaning |
//! |---|---|
//! | [`RETURNED`] (200) | the function returned; the body is its encoded value |
//! | [`RAISED`] (500) | the function raised an error the tool keeps; the body describes it |

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Answer, Begun, Effect, Engine, Execution, Fingerprint, Kept, Key, Policy,
    Record, Scope, StoredBody, StoredResponse,
};
use idem_stores::{AnyStore, StoreUrl, redact};
use serde_json::Value;

use crate::{
    EmbedError, KeyFields,
    driven::Pool,
    host::{Host, Opened, fresh_tokens, host},
    key_args,
};

/// The status of a result the function returned.
pub const RETURNED: u16 = 200;
/// The status of an error the function raised and the tool keeps (replayed as raised).
pub const RAISED: u16 = 500;

/// The engine's scope of in-process tools. Their keys carry the caller's own scope (the run
/// or task) in their text; there is no principal to separate, so records sit in the scope
/// `idem inspect` reads by default.
fn tool_scope() -> Scope {
    Scope::anonymous()
}

/// A tool's policy, validated when the host language builds it (at decoration time), so a
/// bad value is an error before any call.
#[derive(Debug, Clone)]
pub struct ToolPolicy(Policy);

impl ToolPolicy {
    /// `wait`: how long a duplicate of a call in flight waits for its result (`None`: answer
    /// in flight at once). `on_abandoned`: `reject` (an unknown outcome is reported until an
    /// operator resolves it) or `retry` (run again). `max_result_bytes`: larger results are
    /// kept as a digest only, and a replay reports that.
    pub fn new(
        lease: Duration,
        retention: Duration,
        wait: Option<Duration>,
        on_abandoned: &str,
        max_result_bytes: usize,
    ) -> Result<Self, EmbedError> {
        let on_abandoned: AbandonedPolicy = on_abandoned.parse().map_err(EmbedError::Value)?;
        let policy = Policy {
            lease,
            retention,
            on_abandoned,
            wait,
            release_statuses: Vec::new(),
            max_stored_body: max_result_bytes,
        };
        policy.validate()?;
        Ok(ToolPolicy(policy))
    }
}

impl Default for ToolPolicy {
    fn default() -> Self {
        ToolPolicy(Policy {
            release_statuses: Vec::new(),
            wait: Some(Duration::from_secs(30)),
            ..Policy::default()
        })
    }
}

/// A store by URL. The engine behind it is the process's ([`crate::host()`]); the store keeps
/// a handle to it so a call skips the host's lock and map, and checks the process id on each
/// call, so a value made before `fork()` looks the child's own engine up instead of using the
/// parent's (whose threads do not exist in the child).
#[derive(Debug, Clone)]
pub struct Store {
    url: String,
    bound: Arc<Mutex<Option<Bound>>>,
    /// The process that made this value.
    made_in: u32,
}

/// The engine a [`Store`] last used, and the process it belongs to.
#[derive(Debug, Clone)]
struct Bound {
    pid: u32,
    host: Arc<Host>,
    engine: Engine<AnyStore>,
    /// The handles a blocking call drives itself, for a store that gains by them.
    pool: Option<Arc<Pool>>,
}

/// What [`Store::start`] derived and began.
#[derive(Debug)]
pub struct Claimed {
    /// The key: the one given, or the one derived.
    pub key: String,
    /// What the claim came to.
    pub started: Started,
}

impl Store {
    /// Checks the URL and opens the store (creating a SQLite file and its schema, connecting
    /// to PostgreSQL or Redis), so that a wrong URL fails here and not at the first call.
    pub fn open(url: &str) -> Result<Self, EmbedError> {
        let _: StoreUrl = url.parse()?;
        let store = Self::unopened(url);
        store.bound()?;
        Ok(store)
    }

    /// A value for `url` that opens it at its first call.
    fn unopened(url: &str) -> Self {
        Store {
            url: url.to_owned(),
            bound: Arc::new(Mutex::new(None)),
            made_in: std::process::id(),
        }
    }

    /// As [`Store::open`], except that a SQLite file is only checked (its URL, and that its
    /// folder exists), not opened: it is opened by the first call, in the process that makes
    /// it. For a value made before a server forks its workers (`gunicorn --preload`, Node's
    /// cluster): SQLite's locks do not survive `fork()`, so a worker of a process that had the
    /// file open is refused it ([`EmbedError::ForkedSqlite`]); opened in each worker, it
    /// works. PostgreSQL and Redis are opened now, as their workers connect anew anyway.
    pub fn checked(url: &str) -> Result<Self, EmbedError> {
        let parsed: StoreUrl = url.parse()?;
        let StoreUrl::Sqlite { path, .. } = &parsed else {
            return Self::open(url);
        };
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        if !folder.is_dir() {
            return Err(EmbedError::Value(format!(
                "the SQLite store's folder {} does not exist; create it, or name a file in an existing folder",
                folder.display()
            )));
        }
        Ok(Self::unopened(url))
    }

    /// This process's host and engine for the URL: the cached pair, or (first call, or first
    /// call after a fork) the host's.
    fn bound(&self) -> Result<Bound, EmbedError> {
        let pid = std::process::id();
        fresh_tokens(pid)?;
        if pid != self.made_in {
            // A value inherited by fork: a parent thread may have held its cache's lock at
            // that moment, and the child would wait on it forever, so the child never
            // touches it and asks the host each time.
            let host = host()?;
            let Opened { engine, pool } = host.opened(&self.url)?;
            return Ok(Bound {
                pid,
                host,
                engine,
                pool,
            });
        }
        let mut cached = self.bound.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = cached.as_ref().filter(|b| b.pid == pid) {
            return Ok(b.clone());
        }
        let host = host()?;
        let Opened { engine, pool } = host.opened(&self.url)?;
        let b = Bound {
            pid,
            host,
            engine,
            pool,
        };
        // A pair inherited by fork is leaked, as the host leaks its own (see crate::host).
        if let Some(inherited) = cached.replace(b.clone()) {
            std::mem::forget(inherited);
        }
        Ok(b)
    }

    /// This process's host and engine for the store (the HTTP front builds its cached engine
    /// from it).
    pub(crate) fn engine(&self) -> Result<(Arc<Host>, Engine<AnyStore>), EmbedError> {
        let Bound { host, engine, .. } = self.bound()?;
        Ok((host, engine))
    }

    /// The URL with any password replaced, for messages.
    pub fn redacted(&self) -> String {
        redact(&self.url)
    }

    /// Claims `key` for a call of `tool` with `args` (the fingerprint is taken over the key
    /// fields only, when given, so noise outside them is not a mismatch). Blocks while a
    /// duplicate in flight is waited for. An error means the store could not be used, and
    /// the function must not run.
    pub fn begin(
        &self,
        key: &str,
        tool: &str,
        args: &Value,
        fields: Option<&KeyFields>,
        policy: &ToolPolicy,
    ) -> Result<Started, EmbedError> {
        let (key, fingerprint) = claim_of(key, tool, args, fields)?;
        self.claim(key, fingerprint, policy)
    }

    /// One call's whole start, for a binding's hot path: selects the key fields once, derives
    /// the key from them (unless `key` is given: a caller's explicit key is used as is), takes
    /// the fingerprint from the same selection, and claims the key. The same as
    /// [`crate::derive_key`] followed by [`Store::begin`], without selecting twice.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &self,
        key: Option<&str>,
        scope: &str,
        tool: &str,
        args: &Value,
        ordinal: u64,
        secret: Option<&[u8]>,
        fields: Option<&KeyFields>,
        policy: &ToolPolicy,
    ) -> Result<Claimed, EmbedError> {
        let args = key_args(args, fields)?;
        let key = match key {
            Some(k) => Key::new(k)?,
            None => idem_keys::derive(scope, tool, &args, ordinal, secret)?,
        };
        let text = key.as_str().to_owned();
        let started = self.claim(key, Fingerprint::json_call(tool, &args), policy)?;
        Ok(Claimed { key: text, started })
    }

    /// As [`Store::begin`], without blocking the calling thread: the claim runs as a task on
    /// the process's runtime, and `done` gets what it came to, on one of the runtime's
    /// threads (an error in its place if the task panics). For a host whose calling thread
    /// must not block (Node's event loop). A wait for a duplicate in flight holds no thread.
    /// An error in the call's own values (the key, the key fields) is returned at once and
    /// `done` is not called.
    pub fn begin_then<F>(
        &self,
        key: &str,
        tool: &str,
        args: &Value,
        fields: Option<&KeyFields>,
        policy: &ToolPolicy,
        done: F,
    ) -> Result<(), EmbedError>
    where
        F: FnOnce(Result<Started, EmbedError>) + Send + 'static,
    {
        let (key, fingerprint) = claim_of(key, tool, args, fields)?;
        let Bound { host, engine, .. } = self.bound()?;
        let policy = policy.0.clone();
        let on = host.clone();
        on.spawn_then(
            async move { Self::claimed(&engine, host, None, key, fingerprint, &policy).await },
            done,
            || Err(EmbedError::Store(task_ended("claim"))),
        );
        Ok(())
    }

    /// Claims on the calling thread: over a handle it drives itself when the store has them
    /// (`driven.rs`), which the ticket keeps until its completion; else on the runtime.
    fn claim(
        &self,
        key: Key,
        fingerprint: Fingerprint,
        policy: &ToolPolicy,
    ) -> Result<Started, EmbedError> {
        let Bound {
            host, engine, pool, ..
        } = self.bound()?;
        let Some(mut lent) = pool.as_ref().and_then(Pool::lend) else {
            let claiming = Self::claimed(&engine, host.clone(), pool, key, fingerprint, &policy.0);
            return host.block_on(claiming);
        };
        let engine = lent.engine();
        lent.block_on(Self::claimed(
            &engine,
            host,
            pool,
            key,
            fingerprint,
            &policy.0,
        ))
    }

    async fn claimed(
        engine: &Engine<AnyStore>,
        host: Arc<Host>,
        pool: Option<Arc<Pool>>,
        key: Key,
        fingerprint: Fingerprint,
        policy: &Policy,
    ) -> Result<Started, EmbedError> {
        let begun = engine
            .begin::<()>(tool_scope(), key, fingerprint, policy)
            .await?;
        Ok(match begun {
            Begun::Execute(execution) => Started::Execute(Ticket {
                execution,
                host,
                pool,
            }),
            Begun::Answered(answer) => Started::Prior(Prior::of(answer)),
        })
    }

    /// The record of `key`, as a prior answer would describe it, or `None` when there is none
    /// (or it expired).
    pub fn record(&self, key: &str) -> Result<Option<Prior>, EmbedError> {
        let key = Key::new(key)?;
        let Bound {
            host, engine, pool, ..
        } = self.bound()?;
        let scope = tool_scope();
        let record = match pool.as_ref().and_then(Pool::lend) {
            Some(mut lent) => {
                let engine = lent.engine();
                lent.block_on(idem_core::Store::get(engine.store(), &scope, &key))?
            }
            None => host.block_on(idem_core::Store::get(engine.store(), &scope, &key))?,
        };
        Ok(record.map(|r| Prior::from_record(PriorKind::Found, &r)))
    }
}

/// The error of a task on the runtime that ended without an answer: it panicked (which the
/// runtime logs). What it was doing is not known to have happened.
pub(crate) fn task_ended(what: &str) -> idem_core::StoreError {
    idem_core::StoreError::Unavailable(
        format!("the {what} ended without an answer (a panic on idem's runtime)").into(),
    )
}

/// The key and fingerprint of a call of `tool` with `args` under an explicit `key` (the
/// fingerprint over the key fields only, when given).
fn claim_of(
    key: &str,
    tool: &str,
    args: &Value,
    fields: Option<&KeyFields>,
) -> Result<(Key, Fingerprint), EmbedError> {
    let key = Key::new(key)?;
    let args = key_args(args, fields)?;
    Ok((key, Fingerprint::json_call(tool, &args)))
}

/// What [`Store::begin`] came to.
// A ticket is a few hundred bytes, moved once or twice per call: cheaper than boxing it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Started {
    /// The key is this call's: run the function, then [`Ticket::finish`].
    Execute(Ticket),
    /// Nothing to run.
    Prior(Prior),
}

/// A claimed key whose function the host runs. Dropped without [`Ticket::finish`] (the host
/// crashed, or its wrapper failed), its heartbeat stops and the record reads as abandoned
/// when the lease ends.
#[derive(Debug)]
pub struct Ticket {
    execution: Execution<AnyStore>,
    host: Arc<Host>,
    /// The handles its store lends blocking calls (`driven.rs`): the completion is made over
    /// one, whichever the claim used.
    pool: Option<Arc<Pool>>,
}

/// What the function did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// It returned, or raised an error the tool keeps: store this.
    Result {
        /// [`RETURNED`] or [`RAISED`].
        status: u16,
        /// The encoded value or error.
        body: Vec<u8>,
        /// The codec's media type, shown by `idem inspect`.
        media_type: String,
    },
    /// It raised before or without its effect: release the key, a retry runs again.
    NotRun,
    /// It may have acted but the outcome is unknown: the record is marked abandoned.
    Unknown,
}

/// What became of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saved {
    /// Stored: retries replay it.
    Stored,
    /// The key was released: a retry runs again.
    Released,
    /// The record is marked abandoned (an unknown outcome).
    MarkedUnknown,
    /// Not stored: the store failed or the lease was lost meanwhile. The function's result
    /// is still the caller's; a retry will meet an unknown outcome (or another executor's
    /// result).
    Lost(String),
}

impl Ticket {
    /// Keeps what the function reported (blocking), and wakes duplicates waiting in this
    /// process.
    pub fn finish(self, report: Report) -> Result<Saved, EmbedError> {
        let Ticket {
            execution,
            host,
            pool,
        } = self;
        if std::process::id() != host.pid() {
            // Claimed by the parent: its runtime's threads and its connections' sockets are
            // not this process's to use. Nothing of it is touched, not even to drop it.
            std::mem::forget(execution);
            return Ok(Saved::Lost(
                "this call was claimed in the parent process, and a forked child cannot \
                 finish it: the parent's lease ends and the record reads as abandoned"
                    .into(),
            ));
        }
        let Some(pool) = pool else {
            return Ok(host.block_on(finished(execution, report)));
        };
        Ok(match pool.lend() {
            Some(mut lent) => {
                let engine = lent.engine();
                lent.block_on(finished(execution.over(&engine), report))
            }
            None => host.block_on(finished(execution.over(pool.shared()), report)),
        })
    }

    /// As [`Ticket::finish`], without blocking the calling thread: the completion runs as a
    /// task on the runtime that began the call, and `done` gets what became of the report,
    /// on one of the runtime's threads (see [`Store::begin_then`]).
    pub fn finish_then<F>(self, report: Report, done: F)
    where
        F: FnOnce(Saved) + Send + 'static,
    {
        let Ticket {
            execution,
            host,
            pool,
        } = self;
        // A claim a blocking thread drove is finished over the shared connection, which the
        // runtime drives.
        let execution = match &pool {
            Some(pool) => execution.over(pool.shared()),
            None => execution,
        };
        host.spawn_then(finished(execution, report), done, || {
            Saved::Lost(task_ended("completion").to_string())
        });
    }
}

/// Finishes `execution` with what the function reported.
async fn finished(execution: Execution<AnyStore>, report: Report) -> Saved {
    let effect = match report {
        Report::Result {
            status,
            body,
            media_type,
        } => Effect::Done(StoredResponse {
            status,
            headers: vec![("content-type".into(), media_type.into_bytes())],
            body: StoredBody::Full(body.into()),
        }),
        Report::NotRun => Effect::NotSent,
        Report::Unknown => Effect::Unknown,
    };
    match execution.finish(effect, ()).await {
        Answer::Executed { kept, .. } => match kept {
            Kept::Stored => Saved::Stored,
            Kept::Released => Saved::Released,
            Kept::Lost(e) => Saved::Lost(e.to_string()),
        },
        Answer::NotSent(()) => Saved::Released,
        Answer::Unknown(()) => Saved::MarkedUnknown,
        // `finish` answers only for an execution; keep the result's fate honest anyway.
        other => Saved::Lost(format!("unexpected answer {:?}", other.outcome())),
    }
}

/// An answer that did not run the function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PriorKind {
    /// A result is stored: replay it.
    Replayed,
    /// Another call with this key is running, and the wait ran out.
    InFlight,
    /// The key was used with other arguments.
    Mismatch,
    /// An earlier call's outcome is unknown (it crashed or lost its store mid-call); under
    /// `reject` nothing runs until an operator resolves the key.
    Unknown,
    /// Read by [`Store::record`]: see `state`.
    Found,
}

/// A record as a binding shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prior {
    /// What this answer is.
    pub kind: PriorKind,
    /// The record's state now: `in_flight`, `completed` or `abandoned`.
    pub state: &'static str,
    /// The stored status ([`RETURNED`], [`RAISED`]), once completed.
    pub status: Option<u16>,
    /// The stored body, when it was kept whole.
    pub body: Option<Vec<u8>>,
    /// The length of a body that was over the size bound and kept as a digest only.
    pub omitted_len: Option<u64>,
    /// The stored media type.
    pub media_type: Option<String>,
    /// How many times an executor took the key.
    pub attempts: u32,
    /// How many times the result was replayed before this answer.
    pub replays: u32,
    /// When the key was first claimed, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// When the result was stored.
    pub completed_at_ms: Option<i64>,
    /// When retention ends (`None` until completed: an unknown outcome is never forgotten).
    pub expires_at_ms: Option<i64>,
}

impl Prior {
    fn of(answer: Answer<()>) -> Self {
        match answer {
            Answer::Replayed(r) => Prior::from_record(PriorKind::Replayed, &r),
            Answer::InFlight(r) => Prior::from_record(PriorKind::InFlight, &r),
            Answer::Mismatch(r) => Prior::from_record(PriorKind::Mismatch, &r),
            Answer::Abandoned(r) => Prior::from_record(PriorKind::Unknown, &r),
            // `begin` answers these only through an execution, which it hands back instead.
            Answer::Executed { .. } | Answer::NotSent(()) | Answer::Unknown(()) => {
                unreachable!("Engine::begin answers an execution as Begun::Execute")
            }
        }
    }

    fn from_record(kind: PriorKind, r: &Record) -> Self {
        let now = idem_core::Timestamp::from_millis(now_ms());
        let state = r.state(now).as_str();
        let (status, body, omitted_len, media_type) = match &r.response {
            Some(resp) => {
                let media = resp
                    .headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                match &resp.body {
                    StoredBody::Full(b) => (Some(resp.status), Some(b.to_vec()), None, media),
                    StoredBody::Omitted { len, .. } => (Some(resp.status), None, Some(*len), media),
                }
            }
            None => (None, None, None, None),
        };
        Prior {
            kind,
            state,
            status,
            body,
            omitted_len,
            media_type,
            attempts: r.attempts,
            replays: r.replays,
            created_at_ms: r.created_at.as_millis(),
            completed_at_ms: r.completed_at.map(|t| t.as_millis()),
            expires_at_ms: (r.expires_at != idem_core::Timestamp::NEVER)
                .then(|| r.expires_at.as_millis()),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
