//! The record's state machine ([design §2](docs/design.md#2-the-records-life) and
//! [§3](docs/design.md#3-what-a-request-with-a-key-gets)), as pure functions.
//!
//! Each function takes what the store holds for (scope, key) and the time, and says what to
//! answer and what to write. A backend that can hold (scope, key) exclusively for a moment (a
//! mutex for memory, a write transaction for SQLite) applies them directly, so the rules exist
//! once. Backends that must decide inside the server (PostgreSQL's single statement, Redis's
//! Lua) mirror them and are held to them by the conformance suite.
//!
//! ```text
//!             claim (atomic)                complete(token)
//!   absent ------------------> in_flight ------------------> completed --(retention ends)-->
//! absent
//!                                |  | release(token)
//!                                |  +--------------------------------------------------> absent
//!                                | lease ends without complete
//!                                +--> abandoned --(resolve / takeover under Retry)-->
//! ```
//!
//! Retention counts from completion ([design §2](docs/design.md#2-the-records-life)). A record that
//! is not completed, in flight or abandoned, never expires: an unknown outcome stays visible until
//! an operator resolves it or, under the `retry` policy, a retry takes it over
//! ([design §5](docs/design.md#5-unknown-outcomes)). Letting it expire would turn "unknown" into
//! "absent" and re-execute under `reject`.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::record::{CompletedBy, FencingToken, Record, RecordState, StoredResponse};
use crate::store::{AbandonedPolicy, Claim, ClaimRequest, Lease, Resolution, Stale, StoreError};

/// What a backend must do to apply a transition.
// A `Write` lives for one transition and is consumed at once; boxing the record would add an
// allocation to every write for no saving.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Nothing changes.
    Nothing,
    /// Store this record in place of whatever is there.
    Put(Record),
    /// Only the replay counter moved: a backend may apply it without rewriting the record.
    CountReplay,
    /// Delete the record.
    Delete,
}

/// A record that exists and has not expired at `now`; expired records are absent.
fn live(existing: Option<&Record>, now: Timestamp) -> Option<&Record> {
    existing.filter(|r| !r.is_expired(now))
}

/// Decides a claim. `token` is the fresh token to grant if the claim acquires.
pub fn claim(
    existing: Option<&Record>,
    req: &ClaimRequest,
    now: Timestamp,
    token: FencingToken,
) -> (Claim, Write) {
    let Some(rec) = live(existing, now) else {
        let lease_expires_at = now.saturating_add(req.lease);
        let record = Record {
            scope: req.scope.clone(),
            key: req.key.clone(),
            fingerprint: req.fingerprint,
            token,
            created_at: now,
            acquired_at: now,
            lease_expires_at,
            completed_at: None,
            completed_by: None,
            expires_at: Timestamp::NEVER,
            retention: req.retention,
            attempts: 1,
            replays: 0,
            response: None,
        };
        let lease = Lease {
            token,
            expires_at: lease_expires_at,
            attempt: 1,
        };
        return (Claim::Acquired(lease), Write::Put(record));
    };
    if rec.fingerprint != req.fingerprint {
        return (Claim::Mismatch(rec.clone()), Write::Nothing);
    }
    match rec.state(now) {
        RecordState::Completed => {
            let mut replayed = rec.clone();
            replayed.replays = replayed.replays.saturating_add(1);
            (Claim::Completed(replayed), Write::CountReplay)
        }
        RecordState::InFlight => (Claim::InFlight(rec.clone()), Write::Nothing),
        RecordState::Abandoned => match req.on_abandoned {
            AbandonedPolicy::Reject => (Claim::Abandoned(rec.clone()), Write::Nothing),
            AbandonedPolicy::Retry => {
                let mut taken = rec.clone();
                taken.token = token;
                taken.acquired_at = now;
                taken.lease_expires_at = now.saturating_add(req.lease);
                taken.retention = req.retention;
                taken.attempts = taken.attempts.saturating_add(1);
                let lease = Lease {
                    token,
                    expires_at: taken.lease_expires_at,
                    attempt: taken.attempts,
                };
                (Claim::Acquired(lease), Write::Put(taken))
            }
        },
    }
}

/// The record a fenced call may act on: live, not completed, holding `token`. A lease that
/// ended without a takeover still belongs to its holder: a late completion is accepted, since
/// it turns an unknown outcome into a known one.
fn fenced(
    existing: Option<&Record>,
    token: FencingToken,
    now: Timestamp,
) -> Result<&Record, StoreError> {
    let rec = live(existing, now).ok_or(StoreError::Stale(Stale::Absent))?;
    if rec.token != token {
        return Err(StoreError::Stale(Stale::Superseded));
    }
    if rec.completed_at.is_some() {
        return Err(StoreError::Stale(Stale::Completed));
    }
    Ok(rec)
}

fn completed(rec: &Record, response: StoredResponse, now: Timestamp, by: CompletedBy) -> Record {
    let mut done = rec.clone();
    done.completed_at = Some(now);
    done.completed_by = Some(by);
    done.expires_at = now.saturating_add(rec.retention);
    done.response = Some(response);
    done
}

/// Decides `complete`.
pub fn complete(
    existing: Option<&Record>,
    token: FencingToken,
    response: StoredResponse,
    now: Timestamp,
) -> Result<Record, StoreError> {
    let rec = fenced(existing, token, now)?;
    Ok(completed(rec, response, now, CompletedBy::Executor))
}

/// Decides `release`: on success the backend deletes the record.
pub fn release(
    existing: Option<&Record>,
    token: FencingToken,
    now: Timestamp,
) -> Result<(), StoreError> {
    fenced(existing, token, now).map(|_| ())
}

/// Decides `extend`: the record with its lease (and so its retention) moved.
pub fn extend(
    existing: Option<&Record>,
    token: FencingToken,
    lease: Duration,
    now: Timestamp,
) -> Result<Record, StoreError> {
    let mut rec = fenced(existing, token, now)?.clone();
    rec.lease_expires_at = now.saturating_add(lease);
    Ok(rec)
}

/// Decides `resolve`: `Write::Put` of the completed record, or `Write::Delete`.
pub fn resolve(
    existing: Option<&Record>,
    resolution: Resolution,
    now: Timestamp,
) -> Result<(Option<Record>, Write), StoreError> {
    let rec = live(existing, now).ok_or(StoreError::NotFound)?;
    match rec.state(now) {
        RecordState::Abandoned => {}
        state => return Err(StoreError::NotAbandoned { state }),
    }
    Ok(match resolution {
        Resolution::Release => (None, Write::Delete),
        Resolution::Complete(response) => {
            let mut done = completed(rec, response, now, CompletedBy::Operator);
            // The abandoned executor's token must not complete over the operator's decision.
            done.token = FencingToken::random();
            (Some(done.clone()), Write::Put(done))
        }
    })
}

/// `get`: the record unless expired.
pub fn read(existing: Option<Record>, now: Timestamp) -> Option<Record> {
    existing.filter(|r| !r.is_expired(now))
}
