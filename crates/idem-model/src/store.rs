//! The model's one linearizable store: what it holds for the one (scope, key), and the store
//! calls, each applying a decision of [`idem_core::machine`] the way
//! [`idem_core::MemoryStore`] applies it (one call is one atomic step of the model, which is
//! what a linearizable store promises).
//!
//! Nothing here decides anything: every answer and every write comes from the machine's
//! functions. The model only turns its discrete clock into [`Timestamp`]s and picks tokens.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use idem_core::machine::{self, Write};
use idem_core::store::{Claim, ClaimRequest, Resolution, StoreError};
use idem_core::{CompletedBy, FencingToken, Record, StoredBody, StoredResponse, Timestamp};

/// The model's clock reading as the store sees it: one tick is one millisecond. Only the order
/// of instants matters to the machine, so small integers explore the same cases as real times.
pub fn at(tick: u8) -> Timestamp {
    Timestamp::from_millis(i64::from(tick))
}

/// A duration of `ticks` model ticks.
pub fn ticks(ticks: u8) -> Duration {
    Duration::from_millis(u64::from(ticks))
}

/// Which execution produced a stored result: the fencing token it held, or
/// [`OPERATOR_RESULT`] for a result an operator stored with `resolve`.
pub type ResultId = u64;

/// The result an operator stores: tokens are never zero, so it names no execution.
pub const OPERATOR_RESULT: ResultId = 0;

/// The response an execution holding `id` stores: its body names the execution, so a property
/// can tell whose result a record holds.
pub fn response_of(id: ResultId) -> StoredResponse {
    StoredResponse::new(200, id.to_be_bytes().to_vec())
}

/// Whose result `resp` is (the inverse of [`response_of`]); `None` for a response the model
/// never writes.
pub fn result_id(resp: &StoredResponse) -> Option<ResultId> {
    match &resp.body {
        StoredBody::Full(b) => <[u8; 8]>::try_from(&b[..]).ok().map(u64::from_be_bytes),
        StoredBody::Omitted { .. } => None,
    }
}

/// What the store holds for the model's (scope, key), expired or not (expiry is decided by the
/// machine when the record is read).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Stored(Option<Record>);

impl Stored {
    /// The record as held, expired or not (the model's ghost view, not a store call).
    pub fn raw(&self) -> Option<&Record> {
        self.0.as_ref()
    }

    /// Applies a write the way `MemoryStore` does.
    fn apply(&mut self, write: Write) {
        match write {
            Write::Nothing => {}
            Write::Put(rec) => self.0 = Some(rec),
            Write::CountReplay => {
                if let Some(r) = self.0.as_mut() {
                    r.replays = r.replays.saturating_add(1);
                }
            }
            Write::Delete => self.0 = None,
        }
    }

    /// `Store::claim`, granting `token` if the claim acquires.
    pub fn claim(&mut self, req: &ClaimRequest, now: u8, token: FencingToken) -> Claim {
        let (answer, write) = machine::claim(self.0.as_ref(), req, at(now), token);
        self.apply(write);
        answer
    }

    /// `Store::complete`.
    pub fn complete(
        &mut self,
        token: FencingToken,
        response: StoredResponse,
        now: u8,
    ) -> Result<Record, StoreError> {
        let rec = machine::complete(self.0.as_ref(), token, response, at(now))?;
        self.apply(Write::Put(rec.clone()));
        Ok(rec)
    }

    /// `Store::release`.
    pub fn release(&mut self, token: FencingToken, now: u8) -> Result<(), StoreError> {
        machine::release(self.0.as_ref(), token, at(now))?;
        self.apply(Write::Delete);
        Ok(())
    }

    /// `Store::extend`: the lease's new end.
    pub fn extend(
        &mut self,
        token: FencingToken,
        lease: Duration,
        now: u8,
    ) -> Result<Timestamp, StoreError> {
        let rec = machine::extend(self.0.as_ref(), token, lease, at(now))?;
        let end = rec.lease_expires_at;
        self.apply(Write::Put(rec));
        Ok(end)
    }

    /// `Store::resolve`. The machine gives an operator's result a random token so that no
    /// executor's token completes over it; the model replaces that token with `fresh` (a token
    /// no executor was ever granted, as the random one is), because a model's steps must be
    /// deterministic for its traces to replay.
    pub fn resolve(
        &mut self,
        resolution: Resolution,
        now: u8,
        fresh: FencingToken,
    ) -> Result<(), StoreError> {
        let (_, write) = machine::resolve(self.0.as_ref(), resolution, at(now))?;
        let write = match write {
            Write::Put(mut rec) => {
                rec.token = fresh;
                Write::Put(rec)
            }
            other => other,
        };
        self.apply(write);
        Ok(())
    }

    /// `Store::get`: the record unless expired.
    pub fn read(&self, now: u8) -> Option<Record> {
        machine::read(self.0.clone(), at(now))
    }

    /// `Store::purge_expired`: deletes the record if it has expired. Whether it has is the
    /// record's own [`Record::is_expired`], as in every backend's purge.
    pub fn purge(&mut self, now: u8) -> bool {
        let expired = self.0.as_ref().is_some_and(|r| r.is_expired(at(now)));
        if expired {
            self.apply(Write::Delete);
        }
        expired
    }
}

/// Hashes what varies in the model; scope, key and fingerprint are the same in every state.
/// Equal records hash alike, which is all the checker needs.
impl Hash for Stored {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let Some(r) = &self.0 else {
            0u8.hash(h);
            return;
        };
        1u8.hash(h);
        r.token.hash(h);
        r.created_at.hash(h);
        r.acquired_at.hash(h);
        r.lease_expires_at.hash(h);
        r.completed_at.hash(h);
        r.completed_by.map(|b| b == CompletedBy::Operator).hash(h);
        r.expires_at.hash(h);
        r.retention.hash(h);
        r.attempts.hash(h);
        r.replays.hash(h);
        r.response.as_ref().and_then(result_id).hash(h);
    }
}

/// One line per record, with the fields the protocol turns on, so a trace reads quickly.
impl fmt::Debug for Stored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(r) = &self.0 else {
            return f.write_str("absent");
        };
        write!(
            f,
            "token {} attempts {} acquired {} lease-end {}",
            r.token.as_u64(),
            r.attempts,
            r.acquired_at.as_millis(),
            r.lease_expires_at.as_millis()
        )?;
        if let Some(done) = r.completed_at {
            let result = r.response.as_ref().and_then(result_id);
            write!(
                f,
                " | completed {} by {:?} result {result:?} expires {}",
                done.as_millis(),
                r.completed_by,
                r.expires_at.as_millis()
            )?;
        }
        if r.replays > 0 {
            write!(f, " | replays {}", r.replays)?;
        }
        Ok(())
    }
}
