//! The protocol holds its properties under both abandoned policies: small bounds in every
//! build, the full bounds in release builds (`cargo test -p idem-model --release`).

use idem_core::store::AbandonedPolicy;
use idem_model::{Bounds, ProtocolModel, check};

fn holds(policy: AbandonedPolicy, bounds: Bounds) {
    let report = check(ProtocolModel::new(policy, bounds));
    eprintln!(
        "{policy:?} {bounds:?}: {} states, depth {}",
        report.unique_states, report.max_depth
    );
    report.assert_holds();
}

#[test]
fn reject_holds_within_small_bounds() {
    holds(AbandonedPolicy::Reject, Bounds::SMALL);
}

#[test]
fn retry_holds_within_small_bounds() {
    holds(AbandonedPolicy::Retry, Bounds::SMALL);
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "the full bounds take minutes unoptimised: run with --release"
)]
fn reject_holds_within_full_bounds() {
    holds(AbandonedPolicy::Reject, Bounds::FULL);
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "the full bounds take minutes unoptimised: run with --release"
)]
fn retry_holds_within_full_bounds() {
    holds(AbandonedPolicy::Retry, Bounds::FULL);
}

/// Not a check: prints, for each property under each policy, whether it holds within the small
/// bounds and the length of its counterexample. Run on a mutated copy of machine.rs to
/// see what a broken transition breaks (README.md):
/// `cargo test -p idem-model --test check -- --ignored --nocapture each_property`.
#[test]
#[ignore = "a report for mutation runs, not a check"]
fn each_property() {
    for policy in [AbandonedPolicy::Reject, AbandonedPolicy::Retry] {
        let model = ProtocolModel::new(policy, Bounds::SMALL);
        let failures = idem_model::check_each(&model);
        for f in &failures {
            eprintln!("{policy:?}: FAILS {} ({:?} steps)", f.property, f.steps);
        }
        if let Some(f) = failures.first() {
            eprintln!("{}", f.trace);
        }
        eprintln!("{policy:?}: {} properties fail", failures.len());
    }
}
