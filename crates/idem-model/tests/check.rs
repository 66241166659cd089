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
