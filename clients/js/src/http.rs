//! The HTTP core for the package's Express, Fastify and Hono middleware
//! (`idem-runtime/express`, `/fastify`, `/hono`): [`idem_embed::http::HttpFront`], with every
//! store call off the event loop, in the store's `Lane` (a route that waits for a duplicate
//! in flight claims on idem's runtime whatever the store). Headers cross as flat arrays
//! `[name, value, name, value, ...]` of strings holding one byte per character (Node's
//! `rawHeaders`, a `Headers`' values), so no byte is reinterpreted.

use std::sync::{Arc, Mutex, PoisonError};

use napi::bindgen_prelude::{AsyncTask, Buffer, Either, Object, ToNapiValue, TypeName};
use napi::{Env, Task};
use napi_derive::napi;

use idem_embed::http::{Admitted, Begun as EmbedBegun, HttpExecution as Execution, Keyed, Reply};
use idem_http::BodyError;

use crate::tool::Lane;
use crate::{embed_error, js_error, settled_later};

/// A reply to send.
#[napi(object)]
pub struct HttpReply {
    /// The status.
    pub status: u32,
    /// The headers, names in lower case, as `name\nvalue\nname\nvalue` (as `pairs` reads them).
    pub headers: String,
    /// The body.
    pub body: Buffer,
}

impl std::fmt::Debug for HttpReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpReply")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.body.len())
            .finish()
    }
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|b| char::from(*b)).collect()
}

impl From<Reply> for HttpReply {
    fn from(r: Reply) -> Self {
        let mut headers = String::new();
        for (i, (name, value)) in r.headers.iter().enumerate() {
            if i > 0 {
                headers.push('\n');
            }
            headers.push_str(name);
            headers.push('\n');
            headers.push_str(&latin1(value));
        }
        HttpReply {
            status: u32::from(r.status),
            headers,
            body: r.body.into(),
        }
    }
}

/// Headers as they cross: one string, `name\nvalue\nname\nvalue` (Node's `rawHeaders`
/// joined with `\n`, which no field name or value may hold: HTTP forbids CR and LF in them,
/// and Node refuses both), each value one byte per character, so no byte is reinterpreted.
/// One string crosses the boundary where an array of them cost a crossing per element. A
/// character beyond one byte is refused.
fn pairs(joined: &str) -> napi::Result<Vec<(String, Vec<u8>)>> {
    if joined.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = joined.split('\n');
    let mut out = Vec::new();
    while let Some(name) = parts.next() {
        let Some(value) = parts.next() else {
            return Err(js_error("invalid", "headers come in name, value pairs"));
        };
        let bytes = value
            .chars()
            .map(|c| u8::try_from(u32::from(c)))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| {
                js_error(
                    "invalid",
                    format!("the header {name:?} holds a character beyond one byte"),
                )
            })?;
        out.push((name.to_ascii_lowercase(), bytes));
    }
    Ok(out)
}

/// The HTTP core over one configuration and store.
#[napi]
#[derive(Debug, Clone)]
pub struct HttpFront {
    inner: Arc<idem_embed::http::HttpFront>,
    lane: Lane,
}

/// Opens the store and reads the configuration off the event loop.
#[derive(Debug)]
pub struct OpenHttpFront {
    file: Option<String>,
    overrides: Option<String>,
    store: Option<String>,
}

impl Task for OpenHttpFront {
    type Output = HttpFront;
    type JsValue = HttpFront;

    fn compute(&mut self) -> napi::Result<HttpFront> {
        let (config, named) =
            idem_embed::http::config_of(self.file.as_deref(), self.overrides.as_deref())
                .map_err(|e| embed_error(&e))?;
        let url = self
            .store
            .clone()
            .or(named)
            .unwrap_or_else(|| idem_embed::DEFAULT_STORE.to_owned());
        let inner = idem_embed::http::HttpFront::new(config, &url).map_err(|e| embed_error(&e))?;
        Ok(HttpFront {
            inner: Arc::new(inner),
            lane: Lane::of(&url),
        })
    }

    fn resolve(&mut self, _env: Env, front: HttpFront) -> napi::Result<HttpFront> {
        Ok(front)
    }
}

/// The HTTP core over `file` (the text of an `idem serve` TOML file), with `overrides` (JSON
/// text of top-level settings given in code) on top, keeping records in `store` (else the
/// file's, else the default).
#[napi(ts_return_type = "Promise<HttpFront>")]
pub fn open_http_front(
    file: Option<String>,
    overrides: Option<String>,
    store: Option<String>,
) -> AsyncTask<OpenHttpFront> {
    AsyncTask::new(OpenHttpFront {
        file,
        overrides,
        store,
    })
}

#[napi]
impl HttpFront {
    /// The store's URL, password hidden.
    #[napi(getter)]
    pub fn store(&self) -> String {
        self.inner.store()
    }

    /// The body read bound in milliseconds (`[timeouts] body_read`).
    #[napi(getter)]
    pub fn body_read_ms(&self) -> Option<f64> {
        self.inner
            .config()
            .body_read
            .map(|d| d.as_secs_f64() * 1000.0)
    }

    /// What a request gets before its body is read (no I/O: on the event loop), as a plain
    /// object, so the adapter reads every field without a further call into the module.
    /// `routed`: the target the framework routes below a mount it strips (Express's
    /// `req.url` under `app.use("/api", ...)`), when it differs from `target`
    /// (`HttpFront::admit_routed`).
    #[napi]
    pub fn admit(
        &self,
        method: String,
        target: String,
        headers: String,
        routed: Option<String>,
    ) -> napi::Result<Admission> {
        Ok(
            match self
                .inner
                .admit_routed(&method, &target, routed.as_deref(), &pairs(&headers)?)
            {
                Admitted::Pass => Admission {
                    kind: "pass".into(),
                    ..Admission::default()
                },
                Admitted::Reply(r) => Admission {
                    kind: "reply".into(),
                    reply: Some(r.into()),
                    ..Admission::default()
                },
                Admitted::Keyed(k) => Admission {
                    kind: "keyed".into(),
                    // Bounds of a few MiB: exact as a double.
                    #[allow(clippy::cast_precision_loss)]
                    max_body: k.max_body as f64,
                    inline: k.inline,
                    keyed: Some(HttpKeyed {
                        front: self.inner.clone(),
                        keyed: Mutex::new(Some(k)),
                        lane: self.lane,
                    }),
                    reply: None,
                },
            },
        )
    }
}

/// What `admit` came to.
#[napi(object, object_from_js = false)]
#[derive(Debug, Default)]
pub struct Admission {
    /// `pass` (hand the request on), `reply` (send `reply`), or `keyed` (buffer the body, at
    /// most `maxBody` bytes, then `keyed.begin`, or `keyed.beginNow` when `inline`).
    pub kind: String,
    /// The reply of a request refused before its body was read.
    pub reply: Option<HttpReply>,
    /// The keyed request.
    pub keyed: Option<HttpKeyed>,
    /// The most of a keyed request's body to buffer.
    pub max_body: f64,
    /// Whether `keyed.beginNow` may be called: a `memory:` store on a route that does not
    /// wait, whose claim waits on nothing (a hop to libuv's pool would cost more than it).
    pub inline: bool,
}

/// A keyed request admitted, to begin once.
#[napi]
#[derive(Debug)]
pub struct HttpKeyed {
    front: Arc<idem_embed::http::HttpFront>,
    keyed: Mutex<Option<Keyed>>,
    lane: Lane,
}

impl HttpKeyed {
    fn take(&self) -> napi::Result<Keyed> {
        self.keyed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| js_error("invalid", "this request has begun, or was refused"))
    }
}

#[napi]
impl HttpKeyed {
    /// As `begin`, on this thread, for an `inline` request.
    #[napi]
    pub fn begin_now(&self, body: Buffer) -> napi::Result<Begun> {
        let keyed = self.take()?;
        if !keyed.inline {
            return Err(js_error(
                "invalid",
                "beginNow is for inline requests; use begin",
            ));
        }
        Ok(Begun::of(self.front.begin(keyed, &body), self.lane))
    }

    /// The reply the completed-record cache holds for this request (a replay, or
    /// `key-reused`), or `null` (then `begin`): no I/O, so it is asked on the event loop
    /// before `begin` goes to libuv's pool. A reply ends this request: it cannot begin.
    #[napi]
    pub fn replay(&self, body: Buffer) -> Option<HttpReply> {
        let mut slot = self.keyed.lock().unwrap_or_else(PoisonError::into_inner);
        let reply = self.front.replay(slot.as_ref()?, &body)?;
        *slot = None;
        Some(reply.into())
    }

    /// The refusal of a body that could not be buffered: `kind` is `too_large`,
    /// `unreadable` (with `detail`) or `timeout` (after `ms`).
    #[napi]
    pub fn body_failed(
        &self,
        kind: String,
        detail: Option<String>,
        ms: Option<f64>,
    ) -> napi::Result<HttpReply> {
        let error = match kind.as_str() {
            "too_large" => BodyError::TooLarge,
            "timeout" => BodyError::Timeout(
                std::time::Duration::try_from_secs_f64(ms.unwrap_or(0.0) / 1000.0)
                    .unwrap_or_default(),
            ),
            _ => BodyError::Unreadable(detail.unwrap_or_default()),
        };
        let keyed = self.take()?;
        Ok(self.front.body_failed(&keyed, &error).into())
    }

    /// Claims the key with the buffered body, off the event loop: resolves to `Begun`.
    #[napi(ts_return_type = "Promise<Begun>")]
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        body: Buffer,
    ) -> napi::Result<Either<AsyncTask<Run<Begun>>, Object<'env>>> {
        let keyed = self.take()?;
        let lane = self.lane;
        // A wait holds no thread on idem's runtime; on libuv's pool it would (see
        // `settled_later`).
        if lane == Lane::Runtime || keyed.waits {
            let front = self.front.clone();
            return settled_later(env, |settle| {
                front.begin_then(keyed, body.to_vec(), move |b| {
                    settle.settle(Ok(Begun::of(b, lane)));
                });
                Ok(())
            })
            .map(Either::B);
        }
        let front = self.front.clone();
        let body = body.to_vec();
        Ok(Either::A(on_pool(Box::new(move || {
            Ok(Begun::of(front.begin(keyed, &body), lane))
        }))))
    }
}

/// What `begin` came to: a reply to send (a replay, a refusal), or the execution to finish.
#[napi(object, object_from_js = false)]
#[derive(Debug, Default)]
pub struct Begun {
    /// Set when the handler must not run: send it.
    pub reply: Option<HttpReply>,
    /// Set when the handler runs: finish it once.
    pub execution: Option<HttpExecution>,
    /// The most of the handler's response to buffer.
    pub max_response: f64,
    /// Whether `execution.finishNow` may be called (a `memory:` store).
    pub inline: bool,
    /// The route's lease in milliseconds: how long a response whose client left before it
    /// was complete is still waited for before `execution.unknown` (`HttpExecution::lease`).
    pub lease_ms: f64,
}

impl Begun {
    fn of(begun: EmbedBegun, lane: Lane) -> Self {
        match begun {
            EmbedBegun::Execute(e) => Begun {
                // Bounds of at most a few GiB: exact as a double.
                #[allow(clippy::cast_precision_loss)]
                max_response: e.max_response() as f64,
                inline: e.inline(),
                lease_ms: e.lease().as_secs_f64() * 1000.0,
                execution: Some(HttpExecution {
                    execution: Mutex::new(Some(e)),
                    lane,
                }),
                reply: None,
            },
            EmbedBegun::Reply(r) => Begun {
                reply: Some(r.into()),
                ..Begun::default()
            },
        }
    }
}

/// Work for libuv's thread pool (`Lane::Pool`): a closure run once.
type Work<T> = Box<dyn FnOnce() -> napi::Result<T> + Send>;

/// A closure run once on libuv's thread pool.
pub struct Run<T>(Option<Work<T>>);

impl<T> std::fmt::Debug for Run<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Run")
    }
}

fn on_pool<T>(work: Work<T>) -> AsyncTask<Run<T>>
where
    T: Send + ToNapiValue + TypeName + 'static,
{
    AsyncTask::new(Run(Some(work)))
}

impl<T> Task for Run<T>
where
    T: Send + ToNapiValue + TypeName + 'static,
{
    type Output = T;
    type JsValue = T;

    fn compute(&mut self) -> napi::Result<T> {
        match self.0.take() {
            Some(work) => work(),
            None => Err(js_error("invalid", "this task already ran")),
        }
    }

    fn resolve(&mut self, _env: Env, value: T) -> napi::Result<T> {
        Ok(value)
    }
}

/// A keyed request whose handler runs: finish it once.
#[napi]
#[derive(Debug)]
pub struct HttpExecution {
    execution: Mutex<Option<Execution>>,
    /// Its store's: where `finish`, `unknown` and `failed` run.
    lane: Lane,
}

/// What `finish` and `failed` return: a promise either way.
type Replying<'env> = Either<AsyncTask<Run<HttpReply>>, Object<'env>>;

impl HttpExecution {
    fn take(&self) -> napi::Result<Execution> {
        self.execution
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| js_error("invalid", "this execution was already finished"))
    }
}

#[napi]
impl HttpExecution {
    /// As `finish`, on this thread, for an `inline` execution (a `memory:` store).
    #[napi]
    pub fn finish_now(
        &self,
        status: u32,
        headers: String,
        body: Buffer,
    ) -> napi::Result<HttpReply> {
        let status = u16::try_from(status)
            .map_err(|_| js_error("invalid", format!("status {status} is not an HTTP status")))?;
        let headers = pairs(&headers)?;
        let execution = self.take()?;
        if !execution.inline() {
            return Err(js_error(
                "invalid",
                "finishNow is for a memory: store; use finish",
            ));
        }
        Ok(execution.finish(status, &headers, body.to_vec()).into())
    }

    /// Stores the handler's response; resolves to the reply to send.
    #[napi(ts_return_type = "Promise<HttpReply>")]
    pub fn finish<'env>(
        &self,
        env: &'env Env,
        status: u32,
        headers: String,
        body: Buffer,
    ) -> napi::Result<Replying<'env>> {
        let status = u16::try_from(status)
            .map_err(|_| js_error("invalid", format!("status {status} is not an HTTP status")))?;
        let headers = pairs(&headers)?;
        let execution = self.take()?;
        let body = body.to_vec();
        if self.lane == Lane::Runtime {
            return settled_later(env, |settle| {
                execution.finish_then(status, &headers, body, |r| {
                    settle.settle(Ok(HttpReply::from(r)))
                });
                Ok(())
            })
            .map(Either::B);
        }
        Ok(Either::A(on_pool(Box::new(move || {
            Ok(execution.finish(status, &headers, body).into())
        }))))
    }

    /// The handler failed, or the request went away mid-way: the outcome is unknown.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn unknown<'env>(
        &self,
        env: &'env Env,
    ) -> napi::Result<Either<AsyncTask<Run<()>>, Object<'env>>> {
        let execution = self.take()?;
        if self.lane == Lane::Runtime {
            return settled_later(env, |settle| {
                execution.unknown_then(|| settle.settle(Ok(())));
                Ok(())
            })
            .map(Either::B);
        }
        Ok(Either::A(on_pool(Box::new(move || {
            execution.unknown();
            Ok(())
        }))))
    }

    /// The response broke off or was too large: unknown; resolves to `response-failed`.
    #[napi(ts_return_type = "Promise<HttpReply>")]
    pub fn failed<'env>(&self, env: &'env Env) -> napi::Result<Replying<'env>> {
        let execution = self.take()?;
        if self.lane == Lane::Runtime {
            return settled_later(env, |settle| {
                execution.failed_then(|r| settle.settle(Ok(HttpReply::from(r))));
                Ok(())
            })
            .map(Either::B);
        }
        Ok(Either::A(on_pool(Box::new(move || {
            Ok(execution.failed().into())
        }))))
    }
}
