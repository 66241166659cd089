//! The properties the checker holds the protocol to ([design §11](docs/design.md#11-properties-and-where-they-are-checked)).
//!
//! Most are `always` properties over the state; those about a step (a takeover, a refused
//! write, a replay) are judged when the step is taken and kept in the state's [`Ghost`], so a
//! failure's trace ends at the step that broke it. The `sometimes` properties show the check
//! reaches the situations the others are about: a property that holds because its situation
//! never arises proves nothing.
//!
//! [`Ghost`]: crate::model::Ghost

use idem_core::CompletedBy;
use idem_core::store::AbandonedPolicy;
use stateright::{Expectation, Model, Property};

use crate::model::{Exec, ProtocolModel, State};
use crate::store::{OPERATOR_RESULT, result_id};

/// Under `reject`: at most one execution of the effect per key while its record lives.
pub const AT_MOST_ONE_EXECUTION: &str = "reject: at most one execution of the effect per key";
/// No two executions overlap while a lease is live.
pub const NO_OVERLAP: &str = "no two executions overlap while a lease is live";
/// A lease is taken over only once it ended without a result.
pub const TAKEOVER_AFTER_ABANDONMENT: &str = "a claim takes a record over only once abandoned";
/// Every re-execution runs under a takeover of an abandoned lease.
pub const REEXECUTION_AFTER_ABANDONMENT: &str = "every re-execution follows an abandonment";
/// A completed record's result never changes until its retention ends.
pub const RESULT_NEVER_CHANGES: &str = "a completed record's result never changes";
/// An executor's stored result is that of the execution holding the record's token.
pub const RESULT_OF_TOKEN_HOLDER: &str = "a stored result is the current token holder's";
/// A complete, release or extend with a stale token changes nothing.
pub const STALE_TOKEN_CHANGES_NOTHING: &str =
    "a stale token's complete/release/extend changes nothing";
/// A completed record is readable with its result until its retention ends.
pub const NOTHING_COMPLETED_LOST: &str = "nothing completed is lost before its retention ends";
/// A claim inside a completion's retention answers the stored result.
pub const RETRY_GETS_RESULT: &str = "a claim of a completed key answers its result";
/// Reachable: a retrying caller gets the stored result as a replay.
pub const REACH_REPLAY: &str = "reachable: a retrying caller gets the stored result";
/// Reachable: under `retry`, an abandoned lease is taken over.
pub const REACH_TAKEOVER: &str = "reachable: an abandoned lease is taken over";
/// Reachable: an operator stores a result for an abandoned record.
pub const REACH_RESOLVE: &str = "reachable: an operator resolves an abandoned record";

/// The properties checked under `policy`.
pub fn all(policy: AbandonedPolicy) -> Vec<Property<ProtocolModel>> {
    let mut props = vec![
        Property::always(NO_OVERLAP, no_overlap),
        Property::always(TAKEOVER_AFTER_ABANDONMENT, |_, s: &State| {
            !s.ghost.early_takeover
        }),
        Property::always(REEXECUTION_AFTER_ABANDONMENT, |_, s: &State| {
            !s.ghost.reexecution_without_abandonment
        }),
        Property::always(RESULT_NEVER_CHANGES, |_, s: &State| !s.ghost.result_changed),
        Property::always(RESULT_OF_TOKEN_HOLDER, result_of_token_holder),
        Property::always(STALE_TOKEN_CHANGES_NOTHING, |_, s: &State| {
            !s.ghost.stale_write_changed
        }),
        Property::always(NOTHING_COMPLETED_LOST, nothing_completed_lost),
        Property::always(RETRY_GETS_RESULT, |_, s: &State| !s.ghost.wrong_replay),
        Property::sometimes(REACH_REPLAY, |_, s: &State| {
            s.execs
                .iter()
                .any(|e| matches!(e, Exec::Done { replayed: true, .. }))
        }),
        Property::sometimes(REACH_RESOLVE, |_, s: &State| {
            s.ghost.completed.is_some_and(|(r, _)| r == OPERATOR_RESULT)
        }),
    ];
    match policy {
        AbandonedPolicy::Reject => props
            .push(Property::always(AT_MOST_ONE_EXECUTION, |_, s: &State| {
                s.ghost.effects <= 1
            })),
        AbandonedPolicy::Retry => props
            .push(Property::sometimes(REACH_TAKEOVER, |_, s: &State| {
                s.store.raw().is_some_and(|r| r.attempts >= 2)
            })),
    }
    props
}

/// Whether `s` breaks one of the `always` properties `m` checks.
pub fn violated(m: &ProtocolModel, s: &State) -> bool {
    m.properties()
        .iter()
        .any(|p| p.expectation == Expectation::Always && !(p.condition)(m, s))
}

/// At most one executor runs its effect inside a lease it knows to be live. The lease end an
/// executor knows is never later than the store's, so this is the guarantee an executor can
/// act on.
fn no_overlap(_: &ProtocolModel, s: &State) -> bool {
    let live = s.execs.iter().filter(
        |e| matches!(e, Exec::Holding { started: true, lease_end, .. } if *lease_end > s.now),
    );
    live.count() <= 1
}

fn result_of_token_holder(_: &ProtocolModel, s: &State) -> bool {
    match s.store.read(s.now) {
        Some(r) if r.completed_by == Some(CompletedBy::Executor) => {
            r.response.as_ref().and_then(result_id) == Some(r.token.as_u64())
        }
        _ => true,
    }
}

fn nothing_completed_lost(m: &ProtocolModel, s: &State) -> bool {
    let Some((result, completed)) = s.ghost.completed else {
        return true;
    };
    if !m.retained(completed, s.now) {
        return true;
    }
    s.store
        .read(s.now)
        .and_then(|r| r.response)
        .is_some_and(|resp| result_id(&resp) == Some(result))
}
