//! The invariants a run must keep ([design §3, §4, §5](docs/design.md)), checked over what the
//! clients were answered and what the upstream did.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::client::{Answer, Outcome};
use crate::upstream::{Intent, Ledger};

/// Problems the gateway documents (design §3), each answered for a reason the simulation can
/// cause: a duplicate in flight, an upstream that could not be reached (nothing sent), and
/// the unknown outcomes (sent, no answer; or an abandoned record under `reject`).
const DOCUMENTED: [(u16, &str); 7] = [
    (409, "in-flight"),
    (409, "outcome-unknown"),
    (502, "upstream-unreachable"),
    (502, "upstream-failed"),
    (504, "upstream-timeout"),
    (502, "response-failed"),
    (503, "store-unavailable"),
];

/// Every broken invariant, in words; empty when the run kept them all.
pub(crate) fn violations(answers: &[Answer], ledger: &Ledger) -> Vec<String> {
    let mut broken = Vec::new();
    // At most one upstream execution per (scope, key) under `reject`.
    for (intent, (executions, _)) in &ledger.by_intent {
        if *executions > 1 {
            broken.push(format!("{intent:?} executed {executions} times upstream"));
        }
    }
    // When a client was first told an intent completed (by when it was received).
    let mut completed_at: BTreeMap<&Intent, u128> = BTreeMap::new();
    for a in answers {
        if let Outcome::Completed { .. } = a.outcome {
            let at = completed_at.entry(&a.intent).or_insert(a.received_ms);
            *at = (*at).min(a.received_ms);
        }
    }
    for a in answers {
        let first = ledger.by_intent.get(&a.intent).map(|(_, body)| body);
        match &a.outcome {
            // Every completed answer is the first execution's result.
            Outcome::Completed { body, .. } => {
                if first != Some(body) {
                    broken.push(format!(
                        "{a:?} answered {body:?}, the first execution's was {first:?}"
                    ));
                }
            }
            Outcome::Problem { status, name } => {
                if !DOCUMENTED.contains(&(*status, name.as_str())) {
                    broken.push(format!("{a:?}: not a documented refusal"));
                }
            }
            Outcome::Unexpected { .. } => broken.push(format!("{a:?}: not a documented answer")),
            Outcome::NoAnswer(_) => {}
        }
        // Nothing answered as completed is later lost: an attempt sent after a client had
        // the result in hand reached the gateway after it was stored, so it gets a replay.
        if let Some(&done) = completed_at.get(&a.intent) {
            let replayed = matches!(a.outcome, Outcome::Completed { .. } | Outcome::NoAnswer(_));
            if a.sent_ms > done && !replayed {
                broken.push(format!(
                    "{a:?}: sent after the intent was answered completed at {done} ms"
                ));
            }
        }
    }
    broken
}

/// What was stored for each intent a client saw completed: the auditor asks for each again
/// once the network is healed and every gateway is up.
pub(crate) fn completed_intents(answers: &[Answer]) -> BTreeMap<Intent, Bytes> {
    answers
        .iter()
        .filter_map(|a| match &a.outcome {
            Outcome::Completed { body, .. } => Some((a.intent.clone(), body.clone())),
            _ => None,
        })
        .collect()
}
