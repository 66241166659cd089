//! The HTTP core for the package's Express, Fastify and Hono middleware
//! (`idem-runtime/express`, `/fastify`, `/hono`): [`idem_embed::http::HttpFront`], with every
//! store call off the event loop (libuv's pool, or a thread of its own for a route that waits
//! for a duplicate in flight). Headers cross as flat arrays `[name, value, name, value, ...]`
//! of strings holding one byte per character (Node's `rawHeaders`, a `Headers`' values), so
//! no byte is reinterpreted.

use std::sync::{Arc, Mutex, PoisonError};

use napi::bindgen_prelude::{AsyncTask, Buffer, Either, Object, ToNapiValue, TypeName};
use napi::{Env, Task};
use napi_derive::napi;

use idem_embed::http::{Admitted, Begun, HttpExecution as Execution, Keyed, Reply};
use idem_http::BodyError;

use crate::{embed_error, js_error, on_own_thread};

/// A reply to send.
#[napi(object)]
pub struct HttpReply {
    /// The status.
    pub status: u32,
    /// The headers, flat: `[name, value, ...]`, names in lower case.
    pub headers: Vec<String>,
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
        HttpReply {
            status: u32::from(r.status),
            headers: r
                .headers
                .into_iter()
                .flat_map(|(n, v)| [n, latin1(&v)])
                .collect(),
            body: r.body.into(),
        }
    }
}

/// Flat `[name, value, ...]` headers as pairs; a character beyond one byte is refused.
fn pairs(flat: &[String]) -> napi::Result<Vec<(String, Vec<u8>)>> {
    flat.chunks(2)
        .map(|pair| match pair {
            [name, value] => {
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
                Ok((name.to_ascii_lowercase(), bytes))
            }
            _ => Err(js_error("invalid", "headers come in name, value pairs")),
        })
        .collect()
}

/// The HTTP core over one configuration and store.
#[napi]
#[derive(Debug, Clone)]
pub struct HttpFront {
    inner: Arc<idem_embed::http::HttpFront>,
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

    /// What a request gets before its body is read (no I/O: on the event loop).
    #[napi]
    pub fn admit(
        &self,
        method: String,
        target: String,
        headers: Vec<String>,
    ) -> napi::Result<HttpAdmission> {
        let admitted = self.inner.admit(&method, &target, &pairs(&headers)?);
        Ok(HttpAdmission {
            front: self.inner.clone(),
            admitted: Mutex::new(Some(admitted)),
        })
    }
}

/// A request admitted: pass, a reply, or keyed.
#[napi]
#[derive(Debug)]
pub struct HttpAdmission {
    front: Arc<idem_embed::http::HttpFront>,
    admitted: Mutex<Option<Admitted>>,
}

impl HttpAdmission {
    /// `f` of the keyed request, borrowed.
    fn with_keyed<T>(&self, f: impl FnOnce(&Keyed) -> T) -> napi::Result<T> {
        match &*self.admitted.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(Admitted::Keyed(k)) => Ok(f(k)),
            _ => Err(js_error("invalid", "this request is not a keyed one")),
        }
    }

    /// The keyed request, taken: it begins once.
    fn take_keyed(&self) -> napi::Result<Keyed> {
        let mut admitted = self.admitted.lock().unwrap_or_else(PoisonError::into_inner);
        match admitted.take() {
            Some(Admitted::Keyed(k)) => Ok(k),
            other => {
                *admitted = other;
                Err(js_error(
                    "invalid",
                    "this request is not a keyed one, or it has begun",
                ))
            }
        }
    }
}

#[napi]
impl HttpAdmission {
    /// `pass` (hand the request on), `reply` (send `reply()`), or `keyed` (buffer the body,
    /// at most `maxBody` bytes, and `begin`).
    #[napi(getter)]
    pub fn kind(&self) -> &'static str {
        match &*self.admitted.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(Admitted::Pass) | None => "pass",
            Some(Admitted::Reply(_)) => "reply",
            Some(Admitted::Keyed(_)) => "keyed",
        }
    }

    /// The reply of a request refused before its body was read.
    #[napi]
    pub fn reply(&self) -> Option<HttpReply> {
        match &*self.admitted.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(Admitted::Reply(r)) => Some(r.clone().into()),
            _ => None,
        }
    }

    /// Whether `beginNow` may be called: a `memory:` store on a route that does not wait,
    /// whose claim waits on nothing (a hop to libuv's pool would cost more than the call).
    #[napi(getter)]
    pub fn inline(&self) -> bool {
        self.with_keyed(|k| k.inline).unwrap_or(false)
    }

    /// As `begin`, on this thread, for an `inline` request.
    #[napi]
    pub fn begin_now(&self, body: Buffer) -> napi::Result<HttpExecution> {
        if !self.inline() {
            return Err(js_error(
                "invalid",
                "beginNow is for inline requests; use begin",
            ));
        }
        let keyed = self.take_keyed()?;
        Ok(HttpExecution::of(self.front.begin(keyed, &body)))
    }

    /// The most of a keyed request's body to buffer.
    #[napi(getter)]
    pub fn max_body(&self) -> napi::Result<f64> {
        // Bounds of a few MiB: exact as a double.
        #[allow(clippy::cast_precision_loss)]
        self.with_keyed(|k| k.max_body as f64)
    }

    /// The refusal of a declared length (`content-length`) over the bound, or `null`.
    #[napi]
    pub fn declared(&self, length: Option<f64>) -> napi::Result<Option<HttpReply>> {
        let length = length.filter(|l| *l >= 0.0).map(|l| {
            // A header's digits, parsed by JavaScript: whole and non-negative.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            {
                l as u64
            }
        });
        self.with_keyed(|keyed| self.front.declared(keyed, length).map(HttpReply::from))
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
        self.with_keyed(|keyed| self.front.body_failed(keyed, &error).into())
    }

    /// Claims the key with the buffered body: resolves to an `HttpExecution` whose `reply`
    /// is set when there is nothing to run (a replay, a refusal), off the event loop.
    #[napi(ts_return_type = "Promise<HttpExecution>")]
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        body: Buffer,
    ) -> napi::Result<Either<AsyncTask<Run<HttpExecution>>, Object<'env>>> {
        let keyed = self.take_keyed()?;
        let waits = keyed.waits;
        let front = self.front.clone();
        let body = body.to_vec();
        let work = move || Ok(HttpExecution::of(front.begin(keyed, &body)));
        if waits {
            // A wait must not hold a thread of libuv's pool (see `on_own_thread`).
            on_own_thread(env, work, Ok).map(Either::B)
        } else {
            Ok(Either::A(on_pool(Box::new(work))))
        }
    }
}

/// Work for libuv's thread pool: a closure run once.
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

/// A keyed request after `begin`: a reply to send, or the claimed key to finish once.
#[napi]
#[derive(Debug)]
pub struct HttpExecution {
    reply: Option<Reply>,
    execution: Arc<Mutex<Option<Execution>>>,
}

impl HttpExecution {
    fn of(begun: Begun) -> Self {
        match begun {
            Begun::Execute(e) => HttpExecution {
                reply: None,
                execution: Arc::new(Mutex::new(Some(e))),
            },
            Begun::Reply(r) => HttpExecution {
                reply: Some(r),
                execution: Arc::default(),
            },
        }
    }

    fn take(&self) -> napi::Result<Execution> {
        self.execution
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                js_error(
                    "invalid",
                    "this execution was already finished, or never began",
                )
            })
    }
}

#[napi]
impl HttpExecution {
    /// Set when the handler must not run: send it.
    #[napi(getter)]
    pub fn reply(&self) -> Option<HttpReply> {
        self.reply.clone().map(HttpReply::from)
    }

    /// The most of the handler's response to buffer.
    #[napi(getter)]
    pub fn max_response(&self) -> f64 {
        let guard = self
            .execution
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Bounds of at most a few GiB: exact as a double.
        #[allow(clippy::cast_precision_loss)]
        guard.as_ref().map_or(0.0, |e| e.max_response() as f64)
    }

    /// Whether `finishNow` may be called (a `memory:` store).
    #[napi(getter)]
    pub fn inline(&self) -> bool {
        let guard = self
            .execution
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        guard.as_ref().is_some_and(Execution::inline)
    }

    /// As `finish`, on this thread, for an `inline` execution.
    #[napi]
    pub fn finish_now(
        &self,
        status: u32,
        headers: Vec<String>,
        body: Buffer,
    ) -> napi::Result<HttpReply> {
        if !self.inline() {
            return Err(js_error(
                "invalid",
                "finishNow is for a memory: store; use finish",
            ));
        }
        let status = u16::try_from(status)
            .map_err(|_| js_error("invalid", format!("status {status} is not an HTTP status")))?;
        let headers = pairs(&headers)?;
        Ok(self.take()?.finish(status, &headers, body.to_vec()).into())
    }

    /// Stores the handler's response; resolves to the reply to send.
    #[napi(ts_return_type = "Promise<HttpReply>")]
    pub fn finish(
        &self,
        status: u32,
        headers: Vec<String>,
        body: Buffer,
    ) -> napi::Result<AsyncTask<Run<HttpReply>>> {
        let status = u16::try_from(status)
            .map_err(|_| js_error("invalid", format!("status {status} is not an HTTP status")))?;
        let headers = pairs(&headers)?;
        let execution = self.take()?;
        let body = body.to_vec();
        Ok(on_pool(Box::new(move || {
            Ok(execution.finish(status, &headers, body).into())
        })))
    }

    /// The handler failed, or the request went away mid-way: the outcome is unknown.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn unknown(&self) -> napi::Result<AsyncTask<Run<()>>> {
        let execution = self.take()?;
        Ok(on_pool(Box::new(move || {
            execution.unknown();
            Ok(())
        })))
    }

    /// The response broke off or was too large: unknown; resolves to `response-failed`.
    #[napi(ts_return_type = "Promise<HttpReply>")]
    pub fn failed(&self) -> napi::Result<AsyncTask<Run<HttpReply>>> {
        let execution = self.take()?;
        Ok(on_pool(Box::new(move || Ok(execution.failed().into()))))
    }
}
