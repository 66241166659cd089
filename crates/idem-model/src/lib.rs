//! A model check of idem's claim protocol ([design §2](docs/design.md#2-the-records-life) and §11).
//!
//! [`ProtocolModel`] is N executors, one linearizable store holding the record of one
//! (scope, key), a clock that advances in ticks past lease ends and retention ends, and an
//! operator. Executors claim, start the effect, heartbeat (`extend`), complete, release, crash
//! (their caller restarts as a new attempt), and lose replies (the store applied the call, the
//! executor never hears). The operator resolves abandoned records (release, or store a
//! result); the store purges expired records. Under `reject` and `retry`, the checker tries
//! every interleaving within [`Bounds`] and holds the [`properties`] in every state.
//!
//! The store decides nothing itself: every answer and write is from the real transition
//! functions of [`idem_core::machine`] (`claim`, `complete`, `release`, `extend`, `resolve`,
//! `read`), applied as `MemoryStore` applies them ([`store`]). A change to those functions is
//! checked here without touching this crate.
//!
//! # Running it
//! `cargo test -p idem-model` (debug) checks [`Bounds::SMALL`] in seconds; the
//! [`Bounds::FULL`] checks are `#[ignore]`d in debug builds (`cfg_attr(debug_assertions,
//! ignore)`) and run with `cargo test -p idem-model --release`. A failing property panics with
//! a path to it ending at the step that broke it (breadth-first, so a short one), every step's
//! action and the state after it.
//!
//! # What it assumes
//! - The store is linearizable: each call is one atomic step. Backends that are not one
//!   process (PostgreSQL, Redis) are held to the same machine by the conformance suite.
//! - One clock: the store's and the executors' agree. Skew is not modelled.
//! - An executor starts its effect only inside the lease it was told of. One that starts after
//!   its lease ended cannot be stopped by any lease protocol; the effect would have to check the
//!   token itself.
//! - The operator is truthful: it resolves "did not happen" only if no effect ran.
//! - Fencing tokens are a counter ([`idem_core::machine::claim`] takes the token as an input);
//!   an operator's result gets the next one in place of the machine's random token, so every
//!   step is deterministic and a trace replays.
//!
//! See README.md for the mutations the check was shown to catch.

pub mod model;
pub mod properties;
pub mod store;

use std::fmt::Write as _;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

pub use model::{Action, Bounds, Exec, Ghost, ProtocolModel, State};

/// What one exhaustive check found.
#[derive(Debug)]
pub struct Report {
    /// Distinct states explored.
    pub unique_states: usize,
    /// Longest path explored.
    pub max_depth: usize,
    /// The property that failed first (an `always` with a counterexample) and its trace, or
    /// every `sometimes` never reached.
    pub failures: Vec<Failure>,
}

/// A property that failed.
#[derive(Debug)]
pub struct Failure {
    /// The property's name (one of the constants in [`properties`]).
    pub property: &'static str,
    /// Steps from the initial state to the state that broke it; `None` for a `sometimes`
    /// property never reached.
    pub steps: Option<usize>,
    /// The trace, readable.
    pub trace: String,
}

impl Report {
    /// Panics with every failure and its trace, if any.
    pub fn assert_holds(&self) {
        let traces: Vec<&str> = self.failures.iter().map(|f| f.trace.as_str()).collect();
        assert!(
            traces.is_empty(),
            "the protocol broke a property:\n\n{}",
            traces.join("\n")
        );
    }
}

/// Explores every state of `model` breadth-first, on one thread so each run is the same, and
/// judges its properties. It stops at the first batch of states in which one breaks an `always`
/// property, and the trace ends at the step that broke it. Breadth-first makes traces short,
/// though not always the shortest: the checker keeps the last violating path of a batch.
pub fn check(model: ProtocolModel) -> Report {
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let discoveries = checker.discoveries();
    let props = checker.model().properties();
    let mut failures: Vec<Failure> = props
        .iter()
        .filter(|p| p.expectation != Expectation::Sometimes)
        .filter_map(|p| {
            let mut steps = discoveries.get(p.name)?.clone().into_vec();
            // The checker keeps the last violating path of a batch of states, which may run
            // on past the break; the trace ends at the first state that breaks the property.
            if let Some(first) = steps
                .iter()
                .position(|(s, _)| !(p.condition)(checker.model(), s))
            {
                steps.truncate(first + 1);
            }
            Some(Failure {
                property: p.name,
                steps: Some(steps.len().saturating_sub(1)),
                trace: trace(checker.model(), p.name, steps),
            })
        })
        .collect();
    // A search stopped at a failure has not looked everywhere, so only a complete search
    // reports what it never reached.
    if failures.is_empty() {
        failures.extend(
            props
                .iter()
                .filter(|p| p.expectation == Expectation::Sometimes)
                .filter(|p| !discoveries.contains_key(p.name))
                .map(|p| Failure {
                    property: p.name,
                    steps: None,
                    trace: format!("never reached: {}\n", p.name),
                }),
        );
    }
    Report {
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        failures,
    }
}

/// Checks each property of `model` on its own: every property that fails, each with its own
/// trace (used to record what a broken transition breaks; see README.md).
pub fn check_each(model: &ProtocolModel) -> Vec<Failure> {
    model
        .properties()
        .iter()
        .flat_map(|p| {
            let mut one = model.clone();
            one.only = Some(p.name);
            check(one).failures
        })
        .collect()
}

/// A counterexample, one numbered step per line with the state it led to.
fn trace(model: &ProtocolModel, name: &str, steps: Vec<(State, Option<Action>)>) -> String {
    let mut out = format!(
        "FAILED: {name} ({:?}, {} steps)\n",
        model.policy,
        steps.len().saturating_sub(1)
    );
    let mut action = None;
    for (i, (state, next)) in steps.into_iter().enumerate() {
        let what = match action.take() {
            None => "initial".to_string(),
            Some(a) => format!("{a:?}"),
        };
        let _ = writeln!(out, "  {i:>2}. {what}");
        let _ = writeln!(
            out,
            "      now {} | store: {:?} | execs: {:?} | ghost: {:?}",
            state.now, state.store, state.execs, state.ghost
        );
        action = next;
    }
    out
}
