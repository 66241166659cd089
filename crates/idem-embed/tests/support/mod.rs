//! What the blocking-halves tests share: a tool's policy and a function's returned result.

use std::time::Duration;

use idem_embed::{Report, ToolPolicy};

/// A tool's policy with an hour's retention and results up to 1 MiB.
pub(crate) fn policy(lease: Duration, wait: Option<Duration>, on_abandoned: &str) -> ToolPolicy {
    ToolPolicy::new(
        lease,
        Duration::from_secs(3600),
        wait,
        on_abandoned,
        1 << 20,
    )
    .expect("a valid policy")
}

/// What a function that returned `body` (JSON text) reports.
pub(crate) fn returned(body: &str) -> Report {
    Report::Result {
        status: idem_embed::call::RETURNED,
        body: body.as_bytes().to_vec(),
        media_type: "application/json".into(),
    }
}
