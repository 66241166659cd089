//! The native half of the `idem-runtime` Python package: idem's engine and stores, through
//! [`idem_embed`], with the GIL released whenever the engine or a store is waited on.
//!
//! Only plain values cross: arguments as JSON text, or on a call's hot path as the plain
//! Python types JSON has (read by `values.rs`; anything else is serialised by the Python
//! side first, so no other Python type is interpreted in Rust), bytes for encoded results.
//! Errors are the package's typed exceptions from `idem_runtime.errors`, so a caller catches
//! one hierarchy whether the error came from Python or from here.

use std::sync::Mutex;
use std::time::Duration;

use idem_embed::{EmbedError, KeyFields as Fields, Prior as NativePrior, Report, Saved, Started};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

mod http;
mod values;

/// Raises `idem_runtime.errors.<name>(message)`.
fn typed(py: Python<'_>, name: &str, message: String) -> PyErr {
    let class = py
        .import("idem_runtime.errors")
        .and_then(|m| m.getattr(name));
    match class {
        Ok(class) => match class.call1((message.clone(),)) {
            Ok(instance) => PyErr::from_value(instance),
            Err(e) => e,
        },
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// Maps an engine error to the exception a caller can act on.
pub(crate) fn raise(py: Python<'_>, e: EmbedError) -> PyErr {
    let message = e.to_string();
    let class = match e {
        EmbedError::Store(_) | EmbedError::Host(_) => "StoreUnavailableError",
        EmbedError::Derive(_) | EmbedError::Field(_) | EmbedError::Key(_) => "KeyDerivationError",
        _ => "ConfigurationError",
    };
    typed(py, class, message)
}

fn parse_args(py: Python<'_>, args_json: &str) -> PyResult<serde_json::Value> {
    idem_embed::parse_args(args_json).map_err(|e| raise(py, e))
}

/// The fields a key is derived from, parsed and checked once.
#[pyclass(module = "idem_runtime._native", frozen)]
struct KeyFields(Fields);

#[pymethods]
impl KeyFields {
    #[new]
    fn new(py: Python<'_>, specs: Vec<String>) -> PyResult<Self> {
        Fields::parse(&specs)
            .map(KeyFields)
            .map_err(|e| raise(py, e.into()))
    }

    /// The fields as written.
    #[getter]
    fn specs(&self) -> Vec<String> {
        self.0.specs().map(str::to_owned).collect()
    }

    /// The object the key is derived from: each field mapped to its value, as JSON text.
    fn select(&self, py: Python<'_>, args_json: &str) -> PyResult<String> {
        let args = parse_args(py, args_json)?;
        let selected = self.0.select(&args).map_err(|e| raise(py, e.into()))?;
        Ok(selected.to_string())
    }
}

/// The key of one intent (`idem/v1`, docs/key-derivation.md).
#[pyfunction]
#[pyo3(signature = (scope, tool, args_json, ordinal=0, secret=None, key_fields=None))]
fn derive_key(
    py: Python<'_>,
    scope: &str,
    tool: &str,
    args_json: &str,
    ordinal: u64,
    secret: Option<&[u8]>,
    key_fields: Option<&KeyFields>,
) -> PyResult<String> {
    let args = parse_args(py, args_json)?;
    idem_embed::derive_key(
        scope,
        tool,
        &args,
        ordinal,
        secret,
        key_fields.map(|f| &f.0),
    )
    .map(|k| k.as_str().to_owned())
    .map_err(|e| raise(py, e))
}

/// A tool's policy, validated when it is made.
#[pyclass(module = "idem_runtime._native", frozen)]
struct Policy(idem_embed::ToolPolicy);

fn seconds(py: Python<'_>, what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        typed(
            py,
            "ConfigurationError",
            format!("{what} must be a finite number of seconds >= 0, not {s}"),
        )
    })
}

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (lease, retention, wait, on_abandoned, max_result_bytes))]
    fn new(
        py: Python<'_>,
        lease: f64,
        retention: f64,
        wait: f64,
        on_abandoned: &str,
        max_result_bytes: usize,
    ) -> PyResult<Self> {
        let wait = seconds(py, "wait", wait)?;
        idem_embed::ToolPolicy::new(
            seconds(py, "lease", lease)?,
            seconds(py, "retention", retention)?,
            (!wait.is_zero()).then_some(wait),
            on_abandoned,
            max_result_bytes,
        )
        .map(Policy)
        .map_err(|e| raise(py, e))
    }
}

/// A store, by URL; opened (and created) when made.
#[pyclass(module = "idem_runtime._native", frozen)]
struct Store(idem_embed::Store);

#[pymethods]
impl Store {
    #[new]
    fn new(py: Python<'_>, url: &str) -> PyResult<Self> {
        let url = url.to_owned();
        py.detach(move || idem_embed::Store::open(&url))
            .map(Store)
            .map_err(|e| raise(py, e))
    }

    /// The URL, password redacted.
    #[getter]
    fn url(&self) -> String {
        self.0.redacted()
    }

    /// Claims `key`: a `Ticket` (run the function, then finish it) or a `Prior` answer.
    #[pyo3(signature = (key, tool, args_json, key_fields, policy))]
    fn begin(
        &self,
        py: Python<'_>,
        key: &str,
        tool: &str,
        args_json: &str,
        key_fields: Option<&KeyFields>,
        policy: &Policy,
    ) -> PyResult<Py<PyAny>> {
        let args = parse_args(py, args_json)?;
        let fields = key_fields.map(|f| &f.0);
        let started = py
            .detach(|| self.0.begin(key, tool, &args, fields, &policy.0))
            .map_err(|e| raise(py, e))?;
        started_object(py, started)
    }

    /// One call's start in one crossing: takes the arguments once, derives the key from them
    /// (or takes `key`, a caller's explicit one), and claims it. Answers `(key, Ticket)` or
    /// `(key, Prior)`. `args` is JSON text (a `str`) or the bound arguments themselves; for
    /// the latter it answers `None` when they are not plain types only, and the caller
    /// passes their JSON text instead.
    #[pyo3(signature = (key, scope, tool, args, ordinal, secret, key_fields, policy))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        key: Option<&str>,
        scope: &str,
        tool: &str,
        args: &Bound<'_, PyAny>,
        ordinal: u64,
        secret: Option<&[u8]>,
        key_fields: Option<&KeyFields>,
        policy: &Policy,
    ) -> PyResult<Option<(String, Py<PyAny>)>> {
        let args = match args.cast_exact::<PyString>() {
            Ok(text) => parse_args(py, &text.to_cow()?)?,
            Err(_) => match values::plain_value(args) {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        let fields = key_fields.map(|f| &f.0);
        let claimed = py
            .detach(|| {
                self.0
                    .start(key, scope, tool, &args, ordinal, secret, fields, &policy.0)
            })
            .map_err(|e| raise(py, e))?;
        Ok(Some((claimed.key, started_object(py, claimed.started)?)))
    }

    /// The record of `key`, or `None`.
    fn record(&self, py: Python<'_>, key: &str) -> PyResult<Option<Prior>> {
        py.detach(|| self.0.record(key))
            .map(|p| p.map(Prior))
            .map_err(|e| raise(py, e))
    }
}

fn started_object(py: Python<'_>, started: Started) -> PyResult<Py<PyAny>> {
    match started {
        Started::Execute(t) => Ok(Py::new(py, Ticket(Mutex::new(Some(t))))?.into_any()),
        Started::Prior(p) => Ok(Py::new(py, Prior(p))?.into_any()),
    }
}

/// A claimed key; finish it exactly once with what the function did.
#[pyclass(module = "idem_runtime._native", frozen)]
struct Ticket(Mutex<Option<idem_embed::Ticket>>);

impl Ticket {
    fn finish(&self, py: Python<'_>, report: Report) -> PyResult<String> {
        let ticket = self
            .0
            .lock()
            .map_err(|_| PyRuntimeError::new_err("ticket lock poisoned"))?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this ticket was already finished"))?;
        let saved = py
            .detach(move || ticket.finish(report))
            .map_err(|e| raise(py, e))?;
        Ok(match saved {
            Saved::Stored => "stored".into(),
            Saved::Released => "released".into(),
            Saved::MarkedUnknown => "unknown".into(),
            Saved::Lost(why) => format!("lost: {why}"),
        })
    }
}

#[pymethods]
impl Ticket {
    /// Stores the encoded result (`status` 200 returned, 500 a kept exception). Answers
    /// "stored", or "lost: <why>" when the store failed or the lease was lost meanwhile.
    fn finish_result(
        &self,
        py: Python<'_>,
        status: u16,
        body: Vec<u8>,
        media_type: String,
    ) -> PyResult<String> {
        self.finish(
            py,
            Report::Result {
                status,
                body,
                media_type,
            },
        )
    }

    /// Releases the key: the function did not act, a retry runs it.
    fn finish_not_run(&self, py: Python<'_>) -> PyResult<String> {
        self.finish(py, Report::NotRun)
    }

    /// Marks the outcome unknown: the record reads as abandoned.
    fn finish_unknown(&self, py: Python<'_>) -> PyResult<String> {
        self.finish(py, Report::Unknown)
    }
}

/// A record, as an answer that did not run the function (or as `Store.record` read it).
#[pyclass(module = "idem_runtime._native", frozen)]
struct Prior(NativePrior);

#[pymethods]
impl Prior {
    /// `replayed`, `in_flight`, `mismatch`, `unknown`, or `found` (from `Store.record`).
    #[getter]
    fn kind(&self) -> &'static str {
        match self.0.kind {
            idem_embed::PriorKind::Replayed => "replayed",
            idem_embed::PriorKind::InFlight => "in_flight",
            idem_embed::PriorKind::Mismatch => "mismatch",
            idem_embed::PriorKind::Unknown => "unknown",
            _ => "found",
        }
    }
    /// `in_flight`, `completed` or `abandoned`.
    #[getter]
    fn state(&self) -> &'static str {
        self.0.state
    }
    #[getter]
    fn status(&self) -> Option<u16> {
        self.0.status
    }
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.0.body.as_deref().map(|b| PyBytes::new(py, b))
    }
    #[getter]
    fn omitted_len(&self) -> Option<u64> {
        self.0.omitted_len
    }
    #[getter]
    fn media_type(&self) -> Option<String> {
        self.0.media_type.clone()
    }
    #[getter]
    fn attempts(&self) -> u32 {
        self.0.attempts
    }
    #[getter]
    fn replays(&self) -> u32 {
        self.0.replays
    }
    /// Seconds since the Unix epoch.
    #[getter]
    fn created_at(&self) -> f64 {
        self.0.created_at_ms as f64 / 1000.0
    }
    #[getter]
    fn completed_at(&self) -> Option<f64> {
        self.0.completed_at_ms.map(|t| t as f64 / 1000.0)
    }
    #[getter]
    fn expires_at(&self) -> Option<f64> {
        self.0.expires_at_ms.map(|t| t as f64 / 1000.0)
    }
    fn __repr__(&self) -> String {
        format!(
            "Prior(kind={:?}, state={:?}, status={:?}, attempts={}, replays={})",
            self.kind(),
            self.0.state,
            self.0.status,
            self.0.attempts,
            self.0.replays
        )
    }
}

/// Registered with `os.register_at_fork(before=...)`: the fork waits until no thread is
/// choosing the process's host, whose lock a child would otherwise inherit held.
#[pyfunction]
fn before_fork(py: Python<'_>) {
    // The GIL is released while waiting, as every native call that may block does.
    py.detach(idem_embed::before_fork);
}

/// Registered with `os.register_at_fork(after_in_parent=..., after_in_child=...)`.
#[pyfunction]
fn after_fork() {
    idem_embed::after_fork();
}

/// Registered with `atexit`: closes the process's stores, so a SQLite store leaves its
/// database file complete and alone (no `-wal`, no `-shm`); a call after it raises
/// `StoreUnavailableError`.
#[pyfunction]
fn shutdown(py: Python<'_>) {
    // Waits for the store's writer to commit what is queued: the GIL is released meanwhile.
    py.detach(idem_embed::shutdown);
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(derive_key, m)?)?;
    m.add_function(wrap_pyfunction!(before_fork, m)?)?;
    m.add_function(wrap_pyfunction!(after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_class::<KeyFields>()?;
    m.add_class::<Policy>()?;
    m.add_class::<Store>()?;
    m.add_class::<Ticket>()?;
    m.add_class::<Prior>()?;
    m.add_class::<http::Front>()?;
    m.add_class::<http::HttpKeyed>()?;
    m.add_class::<http::HttpExecution>()?;
    m.add("DEFAULT_STORE", idem_embed::DEFAULT_STORE)?;
    m.add("RETURNED", idem_embed::call::RETURNED)?;
    m.add("RAISED", idem_embed::call::RAISED)?;
    Ok(())
}
