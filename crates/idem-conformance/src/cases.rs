//! The cases. Each is generic over the backend and names the rule it checks.
//!
//! [`conformance_suite!`](crate::conformance_suite) expands one `#[test]` per case listed here,
//! for one backend. The list below is the only one: it re-exports each case into this module
//! and expands the tests, and a case written but not listed does not compile (its module denies
//! dead code), so no case exists without running on every backend.

mod listing;
mod rules;

crate::__conformance_cases!(reexport);

/// The one list of conformance cases, and what is expanded from it: `reexport` (in this
/// module) re-exports each case from its private module, `tests $harness` (through
/// [`conformance_suite!`](crate::conformance_suite)) expands one `#[test]` per case.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    (@each [reexport] $($case:ident,)*) => {
        pub use self::rules::{$($case),*};
    };
    (@each [tests $harness:expr] $($case:ident,)*) => {
        $(
            #[test]
            fn $case() {
                $crate::run(&$harness, stringify!($case), $crate::cases::$case);
            }
        )*
    };
    (@each [sequence $harness:expr] $($case:ident,)*) => {
        $(
            $crate::run(&$harness, stringify!($case), $crate::cases::$case);
        )*
    };
    ($($how:tt)*) => {
        $crate::__conformance_cases! { @each [$($how)*]
            get_of_absent_key_is_none,
            claim_of_absent_key_acquires_a_durable_lease,
            claim_while_in_flight_answers_in_flight,
            other_fingerprint_is_a_mismatch_in_every_state,
            complete_then_claim_replays_and_counts,
            stored_responses_round_trip_exactly,
            lease_end_without_completion_is_abandoned,
            abandoned_under_retry_is_taken_over_and_fences_the_old_token,
            late_completion_with_the_current_token_is_accepted,
            release_makes_the_key_absent,
            stale_tokens_are_refused_and_change_nothing,
            extend_moves_the_lease,
            completed_record_expires_after_retention,
            abandoned_record_is_kept_until_resolved,
            stale_token_is_refused_by_an_abandoned_record,
            purge_deletes_only_expired_records_in_bounded_batches,
            resolve_settles_only_abandoned_records,
            scopes_never_meet,
            extreme_keys_and_scopes_are_stored_exactly,
            race_64_threads_one_key_exactly_one_acquires,
            race_64_threads_takeover_of_abandoned_exactly_one_acquires,
            race_threads_over_many_keys_each_executes_once,
            records_are_listed_abandoned_first_and_filtered,
        }
    };
}
