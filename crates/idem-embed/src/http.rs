//! The HTTP core ([`idem_http::Front`]) for a host language's web framework: what the Python
//! (ASGI, WSGI) and Node (Express, Fastify, Hono) middleware bind, so that every decision a
//! keyed request gets is the tower layer's own, made once, in Rust
//! ([design §3](docs/design.md#3-what-a-request-with-a-key-gets)).
//!
//! A middleware moves its framework's request and response in and out, on plain values:
//!
//! 1. [`HttpFront::admit`] (no I/O, cheap: fine on an event loop) answers
//!    [`Admitted::Pass`] (hand the request on untouched), [`Admitted::Reply`] (send this; a
//!    `Content-Length` over the bound included), or [`Admitted::Keyed`] (buffer the body, at
//!    most [`Keyed::max_body`] bytes);
//! 2. [`HttpFront::replay`] (no I/O) answers a replay the completed-record cache holds;
//!    else [`HttpFront::begin`] (blocking: a store round trip, and a wait for a duplicate in
//!    flight) claims the key, or answers what the store holds ([`Begun::Reply`]);
//! 3. the framework runs the handler on the buffered body, and the middleware buffers its
//!    response; [`HttpExecution::finish`] (blocking) stores it and says what to send;
//!    [`HttpExecution::unknown`] marks the outcome unknown when the handler raised or the
//!    response broke off.
//!
//! A store that cannot be used answers `store-unavailable` at [`HttpFront::begin`] and the
//! handler never runs. The completed-record cache the tower layer has (design §9) is this
//! front's too, shared by every call in the process.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use idem_core::{Answer, Begun as EngineBegun, Effect, Engine, Execution};
use idem_http::{Admission, BodyError, Config, FileConfig, Front, Problem};
use idem_stores::AnyStore;

use crate::EmbedError;
use crate::call::{Store, task_ended};
use crate::driven::Pool;
use crate::host::Host;

/// A response as a host sends it: the status, the headers in order, the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: u16,
    /// The headers, names in lower case.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl From<Response<Bytes>> for Reply {
    fn from(r: Response<Bytes>) -> Self {
        let (parts, body) = r.into_parts();
        Reply {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: body.to_vec(),
        }
    }
}

/// The HTTP core over one configuration and one store, for a host's middleware.
#[derive(Debug)]
pub struct HttpFront {
    /// Shared with every execution it begins.
    front: Arc<Front>,
    /// The store is `memory:`: no call waits on I/O.
    memory: bool,
    store: Store,
    /// This process's engine with its completed-record cache (a forked child makes its own).
    cached: Mutex<Option<Cached>>,
}

/// The engine [`HttpFront`] uses, and the process it was made in.
#[derive(Debug)]
struct Cached {
    pid: u32,
    host: Arc<Host>,
    engine: Engine<AnyStore>,
    /// Handles a blocking call drives itself (`crate::driven`), over this engine's cache.
    pool: Option<Arc<Pool>>,
}

/// What a request gets before its body is read.
#[derive(Debug)]
pub enum Admitted {
    /// Not idem's: hand it to the handler as it came.
    Pass,
    /// Send this; nothing was claimed.
    Reply(Reply),
    /// Keyed: buffer the body and [`HttpFront::begin`].
    Keyed(Keyed),
}

/// A keyed request admitted: what [`HttpFront::begin`] needs of its head.
#[derive(Debug, Clone)]
pub struct Keyed {
    keyed: idem_http::Keyed,
    method: Method,
    target: String,
    /// The media type, which the fingerprint covers.
    content_type: Option<String>,
    /// The `Content-Encoding`, which the fingerprint undoes ([`idem_http::encoding`]).
    content_encoding: Option<String>,
    /// The most of its body to buffer.
    pub max_body: usize,
    /// Whether its route waits for a duplicate in flight, so [`HttpFront::begin`] may block
    /// for that long (a host keeps such calls off a shared thread pool).
    pub waits: bool,
    /// Whether [`HttpFront::begin`] answers without waiting on anything outside the process
    /// (a `memory:` store, on a route that does not wait): a host may call it on its event
    /// loop, where a hop to a thread and back would cost more than the call.
    pub inline: bool,
}

impl Keyed {
    /// The request's key.
    pub fn key(&self) -> &str {
        self.keyed.key.as_str()
    }
}

/// What [`HttpFront::begin`] came to.
#[derive(Debug)]
pub enum Begun {
    /// The key is this request's: run the handler, then [`HttpExecution::finish`].
    Execute(HttpExecution),
    /// Send this: a replay, or a refusal (in flight, key reused, outcome unknown, store
    /// unavailable). The handler does not run.
    Reply(Reply),
}

/// A keyed request whose handler runs. Dropped without finishing (the host crashed, or its
/// middleware failed), the heartbeat stops and the record reads as abandoned when the lease
/// ends: never released.
#[derive(Debug)]
pub struct HttpExecution {
    /// Boxed: an execution is large beside a reply.
    execution: Box<Execution<AnyStore>>,
    host: Arc<Host>,
    /// The handles its store lends blocking calls (`crate::driven`): the completion is made
    /// over one, whichever the claim used.
    pool: Option<Arc<Pool>>,
    front: Arc<Front>,
    anonymous: bool,
    /// See [`HttpExecution::inline`].
    inline: bool,
    /// See [`HttpExecution::lease`].
    lease: std::time::Duration,
}

/// The configuration of `file` (the text of the TOML file `idem serve` reads; `None`: every
/// default) with `overrides` on top (JSON text of an object of the file's top-level settings,
/// as a host's middleware takes them in code: `routes`, `anonymous`, `limits`, ...), and the
/// store URL they name, if any. One parser, so a setting means the same in a file, in code
/// and in `idem serve`, and is refused with the same words.
pub fn config_of(
    file: Option<&str>,
    overrides: Option<&str>,
) -> Result<(Config, Option<String>), EmbedError> {
    let bad = |e: &dyn std::fmt::Display| EmbedError::Value(e.to_string());
    let mut table: toml::Table = match file {
        Some(text) => text
            .parse()
            .map_err(|e: toml::de::Error| bad(&format_args!("in the config file: {e}")))?,
        None => toml::Table::new(),
    };
    if let Some(json) = overrides {
        let given: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(json).map_err(|e| bad(&e))?;
        for (name, value) in given {
            if value.is_null() {
                continue;
            }
            let value = toml::Value::try_from(value)
                .map_err(|e| bad(&format_args!("setting {name}: {e}")))?;
            table.insert(name, value);
        }
    }
    let file: FileConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| bad(&e))?;
    let config = file.http().map_err(|e| bad(&format_args!("{e:#}")))?;
    Ok((config, file.store))
}

impl HttpFront {
    /// The core over `config`, keeping records in the store at `url`: checked now, so a
    /// wrong URL fails here and not at the first request; a PostgreSQL or Redis store is
    /// connected to now, a SQLite file opened by the first request of the process that
    /// serves ([`Store::checked`]: a server that loads the app before forking its workers,
    /// `gunicorn --preload`, must not have opened it).
    pub fn new(config: Config, url: &str) -> Result<Self, EmbedError> {
        Ok(HttpFront {
            memory: matches!(url.parse(), Ok(idem_stores::StoreUrl::Memory)),
            front: Arc::new(Front::new(config)),
            store: Store::checked(url)?,
            cached: Mutex::new(None),
        })
    }

    /// The store's URL with any password hidden.
    pub fn store(&self) -> String {
        self.store.redacted()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        self.front.config()
    }

    /// What a request gets before its body is read: `target` is the request target as the
    /// client sent it (percent-escapes included; the absolute form and a fragment are
    /// reduced here to the path the framework routes, [`idem_http::origin_form`]), `headers`
    /// as received. A method, a header or a target that is not HTTP is refused
    /// (`request-invalid`), never guessed at.
    pub fn admit(&self, method: &str, target: &str, headers: &[(String, Vec<u8>)]) -> Admitted {
        self.admit_routed(method, target, None, headers)
    }

    /// As [`HttpFront::admit`], for a middleware mounted under a path its framework strips
    /// before routing (Express's `app.use("/api", ...)`): `routed` is the target the framework
    /// routes below the mount (Express's `req.url`), which the routes are matched on, while
    /// the fingerprint covers the whole `target` (`req.originalUrl`), so one key sent to two
    /// mounts is two requests, never a replay of the other's. A route written as the whole
    /// path (`/api/v1/charges`) protects it too: of the two readings, one whose route
    /// requires a key wins.
    ///
    /// `routed` is taken verbatim, as the framework routes it: one that is not a path (`/`
    /// first) or holds a `#` is a target the server handed the app as the client wrote it
    /// (uvicorn's h11 parser passes the absolute form and a fragment on as the ASGI `path`),
    /// which the app would route as no path of its own, answering 404 under the key; it is
    /// refused on an unsafe method (`request-invalid`), and nothing is claimed.
    pub fn admit_routed(
        &self,
        method: &str,
        target: &str,
        routed: Option<&str>,
        headers: &[(String, Vec<u8>)],
    ) -> Admitted {
        let method = match Method::from_bytes(method.as_bytes()) {
            Ok(m) => m,
            Err(_) => return self.invalid(format!("The method {method:?} is not an HTTP method")),
        };
        let mut map = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                (Ok(n), Ok(v)) => {
                    map.append(n, v);
                }
                _ => {
                    return self.invalid(format!("The header {name:?} is not a valid HTTP header"));
                }
            }
        }
        // What the framework routes, in origin form: a target it reduces (absolute form,
        // fragment) must not reach the routes as written, where it would match no route.
        let target = match idem_http::origin_form(target) {
            Ok(target) => target,
            Err(why) => {
                if idem_http::front::is_safe(&method) {
                    return Admitted::Pass;
                }
                return self.invalid(why.to_string());
            }
        };
        if let Some(given) = routed
            && (!given.starts_with('/') || given.contains('#'))
        {
            if idem_http::front::is_safe(&method) {
                return Admitted::Pass;
            }
            return self.invalid(
                "The server hands the application the request target as the client wrote it (an absolute URL or a #fragment), which it would not route as the path; send the path (/v1/...) without a fragment".into(),
            );
        }
        let full = path_part(&target);
        let path = match routed {
            Some(below) => {
                let below = path_part(below);
                let routes = &self.front.config().routes;
                let keyed = |p: &str| routes.policy_for(&method, p).require_key;
                if !keyed(below) && keyed(full) {
                    full
                } else {
                    below
                }
            }
            None => full,
        };
        match self.front.admit(&method, path, &map) {
            Admission::Pass => Admitted::Pass,
            Admission::Refused(r) => Admitted::Reply(r.into()),
            // A declared length over the bound is refused before any of the body is read.
            Admission::Keyed(keyed) if self.declared_over(&keyed, &map) => {
                Admitted::Reply(self.front.body_failed(&keyed, &BodyError::TooLarge).into())
            }
            Admission::Keyed(keyed) => Admitted::Keyed(Keyed {
                max_body: self.front.max_body(&keyed),
                waits: self.front.policy(&keyed).engine.wait.is_some(),
                inline: self.memory && self.front.policy(&keyed).engine.wait.is_none(),
                keyed,
                content_type: map
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                content_encoding: map
                    .get(http::header::CONTENT_ENCODING)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                method,
                target: target.into_owned(),
            }),
        }
    }

    /// Whether `Content-Length` says the body is over the route's bound.
    fn declared_over(&self, keyed: &idem_http::Keyed, headers: &HeaderMap) -> bool {
        let declared = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        self.front.declared(keyed, declared).is_some()
    }

    fn invalid(&self, why: String) -> Admitted {
        idem_core::Outcome::Invalid.count();
        Admitted::Reply(self.front.refuse(&Problem::RequestInvalid(why)).into())
    }

    /// The refusal of a body that could not be buffered: over the bound, unreadable, or not
    /// in time. Nothing was claimed.
    pub fn body_failed(&self, keyed: &Keyed, error: &BodyError) -> Reply {
        self.front.body_failed(&keyed.keyed, error).into()
    }

    /// What the completed-record cache answers for this request (a replay, or `key-reused`),
    /// without a store call; `None` when it does not hold the key, or before the first
    /// [`HttpFront::begin`] of this process opened the engine. No I/O: a host asks on its
    /// event loop before it hands [`HttpFront::begin`] to a thread, so that a replay costs
    /// no hop there and back. `body` is the buffered body [`HttpFront::begin`] would get.
    pub fn replay(&self, keyed: &Keyed, body: &[u8]) -> Option<Reply> {
        let engine = {
            let cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
            match cached.as_ref() {
                Some(c) if c.pid == std::process::id() => c.engine.clone(),
                _ => return None,
            }
        };
        let answer = engine.answer_cached::<()>(
            &keyed.keyed.scope,
            &keyed.keyed.key,
            fingerprint(keyed, body),
        )?;
        Some(
            self.front
                .prior(&keyed.keyed, &answer)
                .unwrap_or_else(|| self.front.store_unavailable())
                .into(),
        )
    }

    /// Claims the request's key (blocking: a store round trip, and the route's `wait` for a
    /// duplicate in flight), or answers what the store holds. Never an error: a store that
    /// cannot be used is `store-unavailable`, and the handler does not run.
    pub fn begin(&self, keyed: Keyed, body: &[u8]) -> Begun {
        let (host, engine, pool) = match self.engine() {
            Ok(opened) => opened,
            Err(reply) => return reply,
        };
        // Over a handle this thread drives (`crate::driven`), when the store lends them.
        let Some(mut lent) = pool.as_ref().and_then(Pool::lend) else {
            return host
                .clone()
                .block_on(self.beginning(host, engine, pool, keyed, body));
        };
        let engine = lent.engine();
        lent.block_on(self.beginning(host, engine, pool, keyed, body))
    }

    /// As [`HttpFront::begin`], without blocking the calling thread: the claim runs as a
    /// task on the process's runtime and `done` gets what it came to, on one of the
    /// runtime's threads (or on this thread, when the store cannot be used at all). For a
    /// host that must not block (Node's event loop); a wait holds no thread.
    /// The body's fingerprint is taken there too, off the calling thread (a SHA-256 of up to
    /// `max_body_bytes`).
    pub fn begin_then<F>(&self, keyed: Keyed, body: Vec<u8>, done: F)
    where
        F: FnOnce(Begun) + Send + 'static,
    {
        let front = self.front.clone();
        match self.engine() {
            Ok((host, engine, _)) => {
                let claiming = self.beginning(host.clone(), engine, None, keyed, body);
                host.spawn_then(claiming, done, move || {
                    tracing::warn!(error = %task_ended("claim"), "request not executed");
                    Begun::Reply(front.store_unavailable().into())
                });
            }
            Err(reply) => done(reply),
        }
    }

    /// The claim of [`HttpFront::begin`] over `engine`, to run on the runtime that drives
    /// `engine`'s store; `pool`, the handles the execution is finished over, if any.
    fn beginning<B>(
        &self,
        host: Arc<Host>,
        engine: Engine<AnyStore>,
        pool: Option<Arc<Pool>>,
        keyed: Keyed,
        body: B,
    ) -> impl Future<Output = Begun> + Send + use<B>
    where
        B: AsRef<[u8]> + Send,
    {
        let policy = self.front.policy(&keyed.keyed).engine.clone();
        let (front, inline) = (self.front.clone(), self.memory);
        async move {
            let fingerprint = fingerprint(&keyed, body.as_ref());
            let begun = engine
                .begin::<()>(
                    keyed.keyed.scope.clone(),
                    keyed.keyed.key.clone(),
                    fingerprint,
                    &policy,
                )
                .await;
            match begun {
                Ok(EngineBegun::Execute(execution)) => Begun::Execute(HttpExecution {
                    execution: Box::new(execution),
                    host,
                    pool,
                    anonymous: keyed.keyed.anonymous(),
                    lease: front.policy(&keyed.keyed).engine.lease,
                    front,
                    inline,
                }),
                Ok(EngineBegun::Answered(answer)) => Begun::Reply(
                    front
                        .prior(&keyed.keyed, &answer)
                        .unwrap_or_else(|| front.store_unavailable())
                        .into(),
                ),
                Err(e) => {
                    store_failed(&e);
                    Begun::Reply(front.store_unavailable().into())
                }
            }
        }
    }

    /// The reply when the store cannot be used at all.
    fn unusable(&self, e: &EmbedError) -> Begun {
        store_failed(e);
        Begun::Reply(self.front.store_unavailable().into())
    }

    /// This process's engine for the store, with the completed-record cache, and the
    /// handles over it that a blocking call drives itself; or the reply when the store
    /// cannot be used.
    #[allow(clippy::type_complexity)]
    fn engine(&self) -> Result<(Arc<Host>, Engine<AnyStore>, Option<Arc<Pool>>), Begun> {
        let pid = std::process::id();
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        match cached.as_ref() {
            Some(c) if c.pid == pid => Ok((c.host.clone(), c.engine.clone(), c.pool.clone())),
            _ => {
                let (host, engine) = self.store.engine().map_err(|e| self.unusable(&e))?;
                let engine = engine.with_cache_bytes(self.front.config().cache_bytes);
                let pool = Pool::for_store(&engine, host.handle().clone());
                let fresh = Cached {
                    pid,
                    host: host.clone(),
                    engine: engine.clone(),
                    pool: pool.clone(),
                };
                // A pair inherited by fork is leaked, as the host leaks its own.
                if let Some(inherited) = cached.replace(fresh) {
                    std::mem::forget(inherited);
                }
                Ok((host, engine, pool))
            }
        }
    }
}

/// A store that could not be used for a claim: logged, and the first of the process said on
/// stderr too. A host process has no tracing subscriber, so a store it cannot use (a SQLite
/// file its parent had open before fork, a file that is not a database, a server down) would
/// answer 503 with no reason anywhere. Store errors never hold a password (idem-stores
/// redacts them).
fn store_failed(e: &dyn std::fmt::Display) {
    tracing::warn!(error = %e, "the idempotency store cannot be used; request not executed");
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "idem-runtime: a keyed request was refused 503 store-unavailable, nothing run: {e} (said once per process)"
        );
    });
}

/// A target's path, without its query.
fn path_part(target: &str) -> &str {
    target.split_once('?').map_or(target, |(p, _)| p)
}

/// What the fingerprint of a keyed request covers: its method, target, media type and body.
fn fingerprint(keyed: &Keyed, body: &[u8]) -> idem_core::Fingerprint {
    let body =
        idem_http::encoding::decoded(keyed.content_encoding.as_deref(), body, keyed.max_body);
    idem_core::Fingerprint::http(
        keyed.method.as_str(),
        &keyed.target,
        keyed.content_type.as_deref(),
        &body,
    )
}

impl HttpExecution {
    /// Whether finishing waits on nothing outside the process (a `memory:` store), so a host
    /// may finish on its event loop.
    pub fn inline(&self) -> bool {
        self.inline
    }

    /// The route's lease: how long a response whose client left before it was complete is
    /// still waited for (its handler may yet complete it, and the retry then gets it) before
    /// a host marks it unknown ([`HttpExecution::unknown`]): a response that never completes
    /// (an event stream) must not keep its key in flight for as long as the process lives.
    pub fn lease(&self) -> std::time::Duration {
        self.lease
    }

    /// The most of the handler's response body to buffer: over it, [`HttpExecution::failed`].
    pub fn max_response(&self) -> usize {
        self.front.config().max_response_bytes
    }

    /// Stores the handler's response (or releases the key, for a status the route says means
    /// "not processed": 429 and 503 by default) and wakes duplicates waiting in this process;
    /// blocking. Answers what the caller is sent: the response, with the headers withheld from
    /// the record in the anonymous scope. A header that is not HTTP is not stored or sent.
    pub fn finish(mut self, status: u16, headers: &[(String, Vec<u8>)], body: Vec<u8>) -> Reply {
        if self.claimed_elsewhere() {
            return self.left_to_its_process();
        }
        let host = self.host.clone();
        let Some(pool) = self.pool.take() else {
            return host.block_on(self.finishing(status, headers, body));
        };
        match pool.lend() {
            Some(mut lent) => {
                self.execution = Box::new(self.execution.over(&lent.engine()));
                lent.block_on(self.finishing(status, headers, body))
            }
            None => {
                self.execution = Box::new(self.execution.over(pool.shared()));
                host.block_on(self.finishing(status, headers, body))
            }
        }
    }

    /// As [`HttpExecution::finish`], without blocking the calling thread: the completion runs
    /// as a task on the runtime that began the request, and `done` gets the reply, on one
    /// of its threads (see [`HttpFront::begin_then`]).
    pub fn finish_then<F>(self, status: u16, headers: &[(String, Vec<u8>)], body: Vec<u8>, done: F)
    where
        F: FnOnce(Reply) + Send + 'static,
    {
        if self.claimed_elsewhere() {
            return done(self.left_to_its_process());
        }
        let (host, front) = (self.host.clone(), self.front.clone());
        let this = self.on_the_runtime();
        let finishing = this.finishing(status, headers, body);
        host.spawn_then(finishing, done, move || {
            tracing::warn!(error = %task_ended("completion"), "the response was not stored");
            front.store_unavailable().into()
        });
    }

    fn finishing(
        self,
        status: u16,
        headers: &[(String, Vec<u8>)],
        body: Vec<u8>,
    ) -> impl Future<Output = Reply> + Send + 'static {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut map = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                map.append(n, v);
            }
        }
        let captured = self
            .front
            .capture(self.anonymous, status, &map, Bytes::from(body));
        async move {
            let answer = self
                .execution
                .finish(Effect::Done(captured.stored), ())
                .await;
            match answer {
                Answer::Executed { response, .. } => {
                    self.front.executed(&response, &captured.withheld).into()
                }
                // The engine answers an execution it was told `Done` only as executed.
                _ => self.front.store_unavailable().into(),
            }
        }
    }

    /// The handler raised (and the framework made no response of it), or the process is
    /// going away mid-request: whatever it did is unknown, so the record is marked abandoned
    /// at once, never released ([design §4](docs/design.md#4-which-results-are-kept)).
    pub fn unknown(self) {
        if self.claimed_elsewhere() {
            self.left_to_its_process();
            return;
        }
        let host = self.host.clone();
        host.block_on(self.on_the_runtime().marked_unknown());
    }

    /// The response broke off or was over [`HttpExecution::max_response`]: marked unknown, as
    /// [`HttpExecution::unknown`]; the answer is `response-failed`.
    pub fn failed(self) -> Reply {
        let front = self.front.clone();
        self.unknown();
        front.response_failed().into()
    }

    /// As [`HttpExecution::unknown`], without blocking the calling thread: `done` is called
    /// once the record is marked, on one of the runtime's threads.
    pub fn unknown_then<F>(self, done: F)
    where
        F: FnOnce() + Send + 'static,
    {
        if self.claimed_elsewhere() {
            self.left_to_its_process();
            return done();
        }
        let host = self.host.clone();
        host.spawn_then(self.on_the_runtime().marked_unknown(), |()| done(), || ());
    }

    /// As [`HttpExecution::failed`], without blocking the calling thread: `done` gets
    /// `response-failed` once the record is marked, on one of the runtime's threads.
    pub fn failed_then<F>(self, done: F)
    where
        F: FnOnce(Reply) + Send + 'static,
    {
        let front = self.front.clone();
        self.unknown_then(move || done(front.response_failed().into()));
    }

    /// This execution, to be finished over the shared connection, which the runtime drives:
    /// a claim a blocking thread drove went over a connection no thread drives now.
    fn on_the_runtime(mut self) -> Self {
        if let Some(pool) = self.pool.take() {
            self.execution = Box::new(self.execution.over(pool.shared()));
        }
        self
    }

    /// Whether this request was claimed in another process: a handler forked, and its child
    /// returned through the middleware. The parent's runtime and connections are not the
    /// child's to use.
    fn claimed_elsewhere(&self) -> bool {
        std::process::id() != self.host.pid()
    }

    /// Lets go of a request claimed in another process without touching anything of it (its
    /// drop would stop a heartbeat on the parent's runtime): the parent finishes it, or its
    /// lease ends. The child's caller is told the store could not be used.
    fn left_to_its_process(self) -> Reply {
        let reply = self.front.store_unavailable().into();
        std::mem::forget(self);
        reply
    }

    async fn marked_unknown(self) {
        let _ = self.execution.finish::<()>(Effect::Unknown, ()).await;
    }
}
