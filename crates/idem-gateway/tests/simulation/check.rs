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

#[cfg(test)]
mod tests {
    use super::*;

    fn intent() -> Intent {
        ("Bearer tenant-0".into(), "order-0".into())
    }

    fn answer(sent_ms: u128, received_ms: u128, outcome: Outcome) -> Answer {
        Answer {
            client: 0,
            intent: intent(),
            gateway: 0,
            sent_ms,
            received_ms,
            outcome,
        }
    }

    fn ledger(executions: u32, first: &'static str) -> Ledger {
        Ledger {
            executions: u64::from(executions),
            by_intent: BTreeMap::from([(
                intent(),
                (executions, Bytes::from_static(first.as_bytes())),
            )]),
        }
    }

    fn completed(body: &'static str) -> Outcome {
        Outcome::Completed {
            body: Bytes::from_static(body.as_bytes()),
            replayed: true,
        }
    }

    fn problem(status: u16, name: &str) -> Outcome {
        Outcome::Problem {
            status,
            name: name.into(),
        }
    }

    #[test]
    fn a_run_that_kept_the_invariants_has_no_violations() {
        let answers = [
            answer(0, 10, problem(504, "upstream-timeout")),
            answer(20, 30, completed("ch_1")),
            answer(40, 50, completed("ch_1")),
        ];
        assert_eq!(
            violations(&answers, &ledger(1, "ch_1")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_broken_invariant_is_reported() {
        let twice = violations(&[], &ledger(2, "ch_1"));
        assert!(twice[0].contains("executed 2 times"), "{twice:?}");
        let other = violations(&[answer(0, 10, completed("ch_2"))], &ledger(1, "ch_1"));
        assert!(other[0].contains("the first execution's was"), "{other:?}");
        let undocumented = violations(
            &[answer(0, 10, problem(422, "key-reused"))],
            &ledger(1, "ch_1"),
        );
        assert!(
            undocumented[0].contains("not a documented refusal"),
            "{undocumented:?}"
        );
        let lost = [
            answer(0, 10, completed("ch_1")),
            answer(20, 30, problem(409, "outcome-unknown")),
        ];
        let lost = violations(&lost, &ledger(1, "ch_1"));
        assert!(
            lost[0].contains("sent after the intent was answered completed"),
            "{lost:?}"
        );
    }

    #[test]
    fn an_answer_in_flight_before_the_completion_reached_a_client_is_not_a_loss() {
        // Sent at 5 ms, before any client held the result (10 ms): the gateway may have
        // answered it while the first execution was still running.
        let answers = [
            answer(0, 10, completed("ch_1")),
            answer(5, 40, problem(409, "in-flight")),
        ];
        assert_eq!(
            violations(&answers, &ledger(1, "ch_1")),
            Vec::<String>::new()
        );
    }
}
