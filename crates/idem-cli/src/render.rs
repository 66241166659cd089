//! A record's whole story, for a person (`idem inspect`) or a script (`--json`).

use std::fmt::Write as _;

use idem_core::report::{header_value, printable};
use idem_core::{CompletedBy, Record, RecordState, StoredBody, StoredResponse, Timestamp};

/// Bodies longer than this are summarised in the text form; `--json` always has them whole.
const SHOW_BODY: usize = 2048;

fn relative(t: Timestamp, now: Timestamp) -> String {
    let (d, ago) = if t <= now {
        (now.saturating_since(t), true)
    } else {
        (t.saturating_since(now), false)
    };
    let s = d.as_secs();
    let amount = match s {
        0 => {
            return format!(
                "{} ms {}",
                d.as_millis(),
                if ago { "ago" } else { "from now" }
            );
        }
        1..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d", s / 86_400),
    };
    if ago {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

fn state_line(r: &Record, now: Timestamp) -> String {
    match (r.state(now), r.completed_by) {
        (RecordState::Completed, Some(CompletedBy::Operator)) => {
            "completed (resolved by an operator)".into()
        }
        (RecordState::Completed, _) => "completed".into(),
        (RecordState::InFlight, _) => "in_flight (an executor holds the lease)".into(),
        (RecordState::Abandoned, _) => {
            "abandoned (the lease ended without a result: outcome unknown; settle it with `idem resolve`)"
                .into()
        }
    }
}

/// The text form.
pub(crate) fn text(r: &Record, now: Timestamp) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<12} {value}");
    };
    line("key", r.key.to_string());
    line("scope", r.scope.to_string());
    line("state", state_line(r, now));
    line("fingerprint", r.fingerprint.to_string());
    line(
        "created",
        format!("{} ({})", r.created_at, relative(r.created_at, now)),
    );
    if r.acquired_at != r.created_at {
        line(
            "acquired",
            format!(
                "{} ({}, attempt {})",
                r.acquired_at,
                relative(r.acquired_at, now),
                r.attempts
            ),
        );
    }
    if r.completed_at.is_none() {
        line(
            "lease ends",
            format!(
                "{} ({})",
                r.lease_expires_at,
                relative(r.lease_expires_at, now)
            ),
        );
    }
    if let Some(t) = r.completed_at {
        line("completed", format!("{t} ({})", relative(t, now)));
    }
    if r.expires_at == Timestamp::NEVER {
        line(
            "expires",
            "never: kept until completed or resolved, then for its retention".into(),
        );
    } else {
        line(
            "expires",
            format!("{} ({})", r.expires_at, relative(r.expires_at, now)),
        );
    }
    line("retention", humantime(r.retention));
    line("attempts", r.attempts.to_string());
    line("replays", r.replays.to_string());
    line("token", r.token.to_string());
    if let Some(resp) = &r.response {
        response_text(&mut out, resp);
    }
    out
}

fn humantime(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s % 86_400 == 0 && s > 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        _ => format!("{}ms", d.as_millis()),
    }
}

fn response_text(out: &mut String, resp: &StoredResponse) {
    let _ = writeln!(out, "{:<12} {}", "status", resp.status);
    for (name, value) in &resp.headers {
        let _ = writeln!(out, "{:<12} {name}: {}", "header", header_value(value));
    }
    match &resp.body {
        StoredBody::Full(b) if b.is_empty() => {
            let _ = writeln!(out, "{:<12} (empty)", "body");
        }
        StoredBody::Full(b) => match printable(b) {
            Some(s) if s.len() <= SHOW_BODY => {
                let _ = writeln!(out, "{:<12} {} bytes", "body", b.len());
                for l in s.lines() {
                    let _ = writeln!(out, "  {l}");
                }
            }
            _ => {
                let _ = writeln!(
                    out,
                    "{:<12} {} bytes (use --json for all of it)",
                    "body",
                    b.len()
                );
            }
        },
        StoredBody::Omitted { len, sha256 } => {
            let _ = writeln!(
                out,
                "{:<12} {len} bytes, over the size bound: only its sha256 {} was kept",
                "body",
                hex::encode(sha256)
            );
        }
    }
}
