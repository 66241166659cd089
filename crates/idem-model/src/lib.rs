//! A model check of idem's claim protocol ([design §2](../../docs/design.md) and §11).
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
//! the shortest path to it (breadth-first search), every step's action and the state after it.
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

use stateright::{Checker, Expectation, Model};

pub use model::{Action, Bounds, Exec, Ghost, ProtocolModel, State};

/// What one exhaustive check found.
#[derive(Debug)]
pub struct Report {
    /// Distinct states explored.
    pub unique_states: usize,
    /// Longest path explored.
    pub max_depth: usize,
    /// One line per property that failed (an `always` with a counterexample, a `sometimes`
    /// never reached), each followed by its trace.
    pub failures: Vec<String>,
}

impl Report {
    /// Panics with every failure and its trace, if any.
    pub fn assert_holds(&self) {
        assert!(
            self.failures.is_empty(),
            "{} propert{} failed:\n\n{}",
            self.failures.len(),
            if self.failures.len() == 1 { "y" } else { "ies" },
            self.failures.join("\n")
        );
    }
}

/// Explores every state of `model` breadth-first (so each counterexample is a shortest one) and
/// judges its properties.
pub fn check(model: ProtocolModel) -> Report {
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    let discoveries = checker.discoveries();
    let mut failures = Vec::new();
    for p in checker.model().properties() {
        let found = discoveries.get(p.name);
        match (p.expectation, found) {
            (Expectation::Always | Expectation::Eventually, Some(path)) => {
                failures.push(trace(checker.model(), p.name, path.clone()));
            }
            (Expectation::Sometimes, None) => {
                failures.push(format!("never reached: {}\n", p.name));
            }
            _ => {}
        }
    }
    Report {
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        failures,
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A counterexample, one numbered step per line with the state it led to.
fn trace(model: &ProtocolModel, name: &str, path: stateright::Path<State, Action>) -> String {
    let steps = path.into_vec();
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
