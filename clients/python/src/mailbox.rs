//! Where idem's runtime leaves the answers of an event loop's calls: the asyncio path of
//! the decorator and of the ASGI middleware.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};

use idem_embed::http::{Begun, Reply};
use idem_embed::{EmbedError, Saved};
use pyo3::prelude::*;

use crate::{http, raise, saved_text, started_object};

/// Where idem's runtime leaves the answers of one event loop's `*_then` calls, and the file
/// descriptor the loop watches for them (`loop.add_reader(mailbox.fileno(), ...)`, then
/// `drain`). The runtime's threads never take the GIL: they queue the answer and, when the
/// queue was empty, write a byte to wake the loop, which converts the answers to Python
/// values itself. (Delivering with the GIL from the runtime's threads cost a thread state per
/// answer, and one such thread still releasing it as the interpreter began to finalize
/// aborted the process.)
#[pyclass(module = "idem_runtime._native", frozen)]
pub(crate) struct Mailbox(pub(crate) Arc<Slots>);

/// A mailbox's queue and its socket pair.
pub(crate) struct Slots {
    queue: Mutex<Vec<(u64, Delivery)>>,
    /// Written by the runtime (non-blocking: a byte already waiting wakes the loop as well).
    wake: UnixStream,
    /// Watched by the loop.
    woken: UnixStream,
}

/// What a `*_then` call came to.
pub(crate) enum Delivery {
    /// A tool call's claim: `(key, Ticket | Prior)`, or its error.
    Claim(Box<Result<idem_embed::Claimed, EmbedError>>),
    /// What became of a tool call's report.
    Saved(Saved),
    /// An HTTP request's claim: an `HttpExecution`, or the reply to send.
    Begun(Box<Begun>),
    /// The reply to send after an HTTP request's finish.
    Reply(Reply),
    /// An HTTP request marked unknown: `None`.
    Marked,
}

impl Slots {
    pub(crate) fn post(&self, token: u64, delivery: Delivery) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.push((token, delivery));
        if queue.len() == 1 {
            // The loop drains the whole queue per wake-up: one byte per empty-to-full turn.
            // A write that fails (the loop's side closed, or bytes already waiting) needs none.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

#[pymethods]
impl Mailbox {
    #[new]
    fn new() -> PyResult<Self> {
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        Ok(Mailbox(Arc::new(Slots {
            queue: Mutex::new(Vec::new()),
            wake,
            woken,
        })))
    }

    /// The descriptor that becomes readable when answers are waiting.
    fn fileno(&self) -> i32 {
        self.0.woken.as_raw_fd()
    }

    /// The answers waiting, as `(token, ok, value)`: `value` is the call's answer, or (`ok`
    /// false) the exception it came to.
    fn drain(&self, py: Python<'_>) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
        let mut bytes = [0u8; 64];
        while matches!((&self.0.woken).read(&mut bytes), Ok(n) if n > 0) {}
        let waiting =
            std::mem::take(&mut *self.0.queue.lock().unwrap_or_else(PoisonError::into_inner));
        waiting
            .into_iter()
            .map(|(token, delivery)| {
                let value = delivery.into_py(py);
                Ok(match value {
                    Ok(v) => (token, true, v),
                    Err(e) => (token, false, e.into_value(py).into_any()),
                })
            })
            .collect()
    }
}

impl Delivery {
    /// The Python value of the answer, made on the loop's thread.
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Delivery::Claim(claim) => {
                let claimed = (*claim).map_err(|e| raise(py, e))?;
                let started = started_object(py, claimed.started)?;
                (claimed.key, started)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
            Delivery::Saved(saved) => saved_text(saved).into_pyobject(py)?.into_any().unbind(),
            Delivery::Begun(begun) => http::begun_object(py, *begun)?,
            Delivery::Reply(r) => http::reply(py, r).into_pyobject(py)?.into_any().unbind(),
            Delivery::Marked => py.None(),
        })
    }
}
