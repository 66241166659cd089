//! A claimed key: `finish` on libuv's thread pool.

use napi::bindgen_prelude::{AsyncTask, Buffer};
use napi::{Env, Task};
use napi_derive::napi;

use idem_embed::{Report, Saved};

use crate::{embed_error, js_error};

/// The claim of one call whose function runs in JavaScript. Collected without `finish` (the
/// wrapper failed), the heartbeat stops and the key reads as abandoned when its lease ends.
#[napi]
#[derive(Debug)]
pub struct Ticket {
    inner: Option<idem_embed::Ticket>,
}

impl Ticket {
    pub(crate) fn new(inner: idem_embed::Ticket) -> Self {
        Ticket { inner: Some(inner) }
    }

    fn take(&mut self, report: Report) -> napi::Result<AsyncTask<Finish>> {
        let ticket = self
            .inner
            .take()
            .ok_or_else(|| js_error("invalid", "this ticket is already finished"))?;
        Ok(AsyncTask::new(Finish {
            ticket: Some(ticket),
            report: Some(report),
        }))
    }
}

#[napi]
impl Ticket {
    /// Stores the function's encoded result (`status` 200) or kept error (500). Resolves to
    /// `stored`, or `lost: <why>` when the store failed meanwhile.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn finish(
        &mut self,
        status: u32,
        body: Buffer,
        media_type: String,
    ) -> napi::Result<AsyncTask<Finish>> {
        let status = u16::try_from(status)
            .map_err(|_| js_error("invalid", format!("status {status} is not an HTTP status")))?;
        self.take(Report::Result {
            status,
            body: body.to_vec(),
            media_type,
        })
    }

    /// The function failed before or without its effect: release the key so a retry runs.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn release(&mut self) -> napi::Result<AsyncTask<Finish>> {
        self.take(Report::NotRun)
    }

    /// The function may have acted but its outcome is unknown: mark the record abandoned.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn unknown(&mut self) -> napi::Result<AsyncTask<Finish>> {
        self.take(Report::Unknown)
    }
}

/// [`Ticket`]'s finishing work.
#[derive(Debug)]
pub struct Finish {
    ticket: Option<idem_embed::Ticket>,
    report: Option<Report>,
}

impl Task for Finish {
    type Output = Saved;
    type JsValue = String;

    fn compute(&mut self) -> napi::Result<Saved> {
        match (self.ticket.take(), self.report.take()) {
            (Some(t), Some(r)) => t.finish(r).map_err(|e| embed_error(&e)),
            _ => Err(js_error("invalid", "this ticket is already finished")),
        }
    }

    fn resolve(&mut self, _env: Env, saved: Saved) -> napi::Result<String> {
        Ok(match saved {
            Saved::Stored => "stored".into(),
            Saved::Released => "released".into(),
            Saved::MarkedUnknown => "unknown".into(),
            Saved::Lost(why) => format!("lost: {why}"),
        })
    }
}
