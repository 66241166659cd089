//! A claimed key: `finish` in its store's `Lane`.

use napi::bindgen_prelude::{AsyncTask, Buffer, Either, Object};
use napi::{Env, Task};
use napi_derive::napi;

use idem_embed::{Report, Saved};

use crate::tool::Lane;
use crate::{embed_error, js_error, settled_later};

/// The claim of one call whose function runs in JavaScript. Collected without `finish` (the
/// wrapper failed), the heartbeat stops and the key reads as abandoned when its lease ends.
#[napi]
#[derive(Debug)]
pub struct Ticket {
    inner: Option<idem_embed::Ticket>,
    /// Its store's: `Lane::Inline` (a `memory:` store) lets `finishNow` keep the result on
    /// the calling thread.
    lane: Lane,
}

/// What `finish`, `release` and `unknown` return: a promise either way.
type Finishing<'env> = Either<AsyncTask<Finish>, Object<'env>>;

impl Ticket {
    pub(crate) fn new(inner: idem_embed::Ticket, lane: Lane) -> Self {
        Ticket {
            inner: Some(inner),
            lane,
        }
    }

    fn take(&mut self) -> napi::Result<idem_embed::Ticket> {
        self.inner
            .take()
            .ok_or_else(|| js_error("invalid", "this ticket is already finished"))
    }

    fn later<'env>(&mut self, env: &'env Env, report: Report) -> napi::Result<Finishing<'env>> {
        let ticket = self.take()?;
        if self.lane != Lane::Runtime {
            return Ok(Either::A(AsyncTask::new(Finish {
                ticket: Some(ticket),
                report: Some(report),
            })));
        }
        let settling = settled_later(env, |settle| {
            ticket.finish_then(report, |s| settle.settle(Ok(saved(s))));
            Ok(())
        });
        settling.map(Either::B)
    }

    fn now(&mut self, report: Report) -> napi::Result<String> {
        if self.lane != Lane::Inline {
            return Err(js_error(
                "invalid",
                "finishing now is for memory: stores; a store with I/O must use finish",
            ));
        }
        self.take()?
            .finish(report)
            .map(saved)
            .map_err(|e| embed_error(&e))
    }
}

fn result(status: u32, body: &Buffer, media_type: String) -> napi::Result<Report> {
    let status = u16::try_from(status)
        .map_err(|_| js_error("invalid", format!("status {status} is not an HTTP status")))?;
    Ok(Report::Result {
        status,
        body: body.to_vec(),
        media_type,
    })
}

fn saved(saved: Saved) -> String {
    match saved {
        Saved::Stored => "stored".into(),
        Saved::Released => "released".into(),
        Saved::MarkedUnknown => "unknown".into(),
        Saved::Lost(why) => format!("lost: {why}"),
    }
}

#[napi]
impl Ticket {
    /// Stores the function's encoded result (`status` 200) or kept error (500). Resolves to
    /// `stored`, or `lost: <why>` when the store failed meanwhile.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn finish<'env>(
        &mut self,
        env: &'env Env,
        status: u32,
        body: Buffer,
        media_type: String,
    ) -> napi::Result<Finishing<'env>> {
        let report = result(status, &body, media_type)?;
        self.later(env, report)
    }

    /// As `finish`, on this thread, for a ticket of a `memory:` store.
    #[napi]
    pub fn finish_now(
        &mut self,
        status: u32,
        body: Buffer,
        media_type: String,
    ) -> napi::Result<String> {
        self.now(result(status, &body, media_type)?)
    }

    /// As `release`, on this thread, for a ticket of a `memory:` store.
    #[napi]
    pub fn release_now(&mut self) -> napi::Result<String> {
        self.now(Report::NotRun)
    }

    /// Whether `finishNow` / `releaseNow` may be used.
    #[napi(getter)]
    pub fn inline(&self) -> bool {
        self.lane == Lane::Inline
    }

    /// The function failed before or without its effect: release the key so a retry runs.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn release<'env>(&mut self, env: &'env Env) -> napi::Result<Finishing<'env>> {
        self.later(env, Report::NotRun)
    }

    /// The function may have acted but its outcome is unknown: mark the record abandoned.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn unknown<'env>(&mut self, env: &'env Env) -> napi::Result<Finishing<'env>> {
        self.later(env, Report::Unknown)
    }
}

/// [`Ticket`]'s finishing work on libuv's pool (`Lane::Pool`; an inline ticket's promised
/// `finish` too).
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

    fn resolve(&mut self, _env: Env, s: Saved) -> napi::Result<String> {
        Ok(saved(s))
    }
}
