//! The HTTP core for the package's ASGI and WSGI middleware (`idem_runtime.asgi`,
//! `idem_runtime.wsgi`): [`idem_embed::http::HttpFront`] with plain values across, the GIL
//! released while a store is waited on. A reply crosses as `(status, headers, body)` with
//! headers as `[(name, value bytes)]`.

use std::sync::Mutex;

use idem_embed::http::{Admitted, Begun, HttpExecution as Execution, HttpFront, Keyed, Reply};
use idem_http::BodyError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::raise;

type PyReply<'py> = (u16, Vec<(String, Bound<'py, PyBytes>)>, Bound<'py, PyBytes>);

fn reply(py: Python<'_>, r: Reply) -> PyReply<'_> {
    (
        r.status,
        r.headers
            .into_iter()
            .map(|(n, v)| (n, PyBytes::new(py, &v)))
            .collect(),
        PyBytes::new(py, &r.body),
    )
}

/// The HTTP core over one configuration and store.
#[pyclass(module = "idem_runtime._native", frozen, name = "HttpFront")]
pub(crate) struct Front(HttpFront);

#[pymethods]
impl Front {
    /// `file`: the text of an `idem serve` TOML file; `overrides`: JSON text of top-level
    /// settings given in code; `store`: a store URL (else the file's `store`, else the
    /// package's default). Opens the store.
    #[new]
    #[pyo3(signature = (file=None, overrides=None, store=None))]
    fn new(
        py: Python<'_>,
        file: Option<&str>,
        overrides: Option<&str>,
        store: Option<&str>,
    ) -> PyResult<Self> {
        let (config, named) =
            idem_embed::http::config_of(file, overrides).map_err(|e| raise(py, e))?;
        let url = store
            .map(str::to_owned)
            .or(named)
            .unwrap_or_else(|| idem_embed::DEFAULT_STORE.to_owned());
        py.detach(move || HttpFront::new(config, &url))
            .map(Front)
            .map_err(|e| raise(py, e))
    }

    /// The store URL, password redacted.
    #[getter]
    fn store(&self) -> String {
        self.0.store()
    }

    /// The body read bound in seconds (`[timeouts] body_read`).
    #[getter]
    fn body_read(&self) -> Option<f64> {
        self.0.config().body_read.map(|d| d.as_secs_f64())
    }

    /// `None` (hand the request on), a reply to send, or a `HttpKeyed` (buffer the body).
    /// `routed`: the target the framework routes below a mount it strips, when it differs
    /// from `target` (`HttpFront::admit_routed`).
    #[pyo3(signature = (method, target, headers, routed=None))]
    fn admit<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        target: &str,
        headers: Vec<(String, Vec<u8>)>,
        routed: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(
            match self.0.admit_routed(method, target, routed, &headers) {
                Admitted::Pass => None,
                Admitted::Reply(r) => Some(reply(py, r).into_pyobject(py)?.into_any()),
                Admitted::Keyed(k) => Some(Bound::new(py, HttpKeyed(k))?.into_any()),
            },
        )
    }

    /// The refusal of a body that could not be buffered: `kind` is `too_large`, `unreadable`
    /// (with `detail`) or `timeout` (after `seconds`).
    #[pyo3(signature = (keyed, kind, detail="", seconds=0.0))]
    fn body_failed<'py>(
        &self,
        py: Python<'py>,
        keyed: &HttpKeyed,
        kind: &str,
        detail: &str,
        seconds: f64,
    ) -> PyReply<'py> {
        let error = match kind {
            "too_large" => BodyError::TooLarge,
            "timeout" => BodyError::Timeout(
                std::time::Duration::try_from_secs_f64(seconds).unwrap_or_default(),
            ),
            _ => BodyError::Unreadable(detail.to_owned()),
        };
        reply(py, self.0.body_failed(&keyed.0, &error))
    }

    /// The reply the completed-record cache holds for this request (a replay, or
    /// `key-reused`), or `None`: no I/O, so it is asked on the event loop before `begin` goes
    /// to a thread.
    fn replay<'py>(&self, py: Python<'py>, keyed: &HttpKeyed, body: &[u8]) -> Option<PyReply<'py>> {
        self.0.replay(&keyed.0, body).map(|r| reply(py, r))
    }

    /// Claims the key (blocking, GIL released): an `HttpExecution` (run the handler, then
    /// finish it), or a reply to send.
    fn begin<'py>(
        &self,
        py: Python<'py>,
        keyed: &HttpKeyed,
        body: &[u8],
    ) -> PyResult<Bound<'py, PyAny>> {
        let keyed = keyed.0.clone();
        let begun = py.detach(|| self.0.begin(keyed, body));
        Ok(match begun {
            Begun::Execute(e) => Bound::new(py, HttpExecution(Mutex::new(Some(e))))?.into_any(),
            Begun::Reply(r) => reply(py, r).into_pyobject(py)?.into_any(),
        })
    }
}

/// A keyed request admitted.
#[pyclass(module = "idem_runtime._native", frozen)]
pub(crate) struct HttpKeyed(Keyed);

#[pymethods]
impl HttpKeyed {
    /// The most of the body to buffer.
    #[getter]
    fn max_body(&self) -> usize {
        self.0.max_body
    }

    /// The key.
    #[getter]
    fn key(&self) -> &str {
        self.0.key()
    }

    /// Whether its route waits for a duplicate in flight (`begin` may block that long).
    #[getter]
    fn waits(&self) -> bool {
        self.0.waits
    }

    /// Whether `begin` waits on nothing (a `memory:` store, a route that does not wait), so
    /// it may be called on an event loop.
    #[getter]
    fn inline(&self) -> bool {
        self.0.inline
    }
}

/// A claimed key whose handler runs; finish it exactly once.
#[pyclass(module = "idem_runtime._native", frozen)]
pub(crate) struct HttpExecution(Mutex<Option<Execution>>);

impl HttpExecution {
    fn take(&self) -> PyResult<Execution> {
        self.0
            .lock()
            .map_err(|_| PyRuntimeError::new_err("execution lock poisoned"))?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this execution was already finished"))
    }
}

#[pymethods]
impl HttpExecution {
    /// The most of the handler's response to buffer.
    #[getter]
    fn max_response(&self) -> PyResult<usize> {
        let guard = self
            .0
            .lock()
            .map_err(|_| PyRuntimeError::new_err("execution lock poisoned"))?;
        Ok(guard.as_ref().map_or(0, Execution::max_response))
    }

    /// Whether `finish` waits on nothing (a `memory:` store).
    #[getter]
    fn inline(&self) -> PyResult<bool> {
        let guard = self
            .0
            .lock()
            .map_err(|_| PyRuntimeError::new_err("execution lock poisoned"))?;
        Ok(guard.as_ref().is_some_and(Execution::inline))
    }

    /// Stores the handler's response (blocking, GIL released); the reply to send.
    fn finish<'py>(
        &self,
        py: Python<'py>,
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    ) -> PyResult<PyReply<'py>> {
        let execution = self.take()?;
        let r = py.detach(move || execution.finish(status, &headers, body));
        Ok(reply(py, r))
    }

    /// The handler raised, or the request is going away mid-way: the outcome is unknown.
    fn unknown(&self, py: Python<'_>) -> PyResult<()> {
        let execution = self.take()?;
        py.detach(move || execution.unknown());
        Ok(())
    }

    /// The response broke off or was too large: unknown; the `response-failed` reply.
    fn failed<'py>(&self, py: Python<'py>) -> PyResult<PyReply<'py>> {
        let execution = self.take()?;
        let r = py.detach(move || execution.failed());
        Ok(reply(py, r))
    }
}
