//! A record's timeline, derived from the fields the store keeps. A store keeps the state of
//! a record, not a log of it, so some events are known only by their count or their last
//! instance; the timeline says which, rather than inventing times.

use idem_core::{CompletedBy, Record, RecordState, Timestamp};

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// When, if the store kept the time.
    pub(crate) at: Option<Timestamp>,
    /// What happened, in plain words.
    pub(crate) what: String,
}

fn at(t: Timestamp, what: impl Into<String>) -> Event {
    Event {
        at: Some(t),
        what: what.into(),
    }
}

fn untimed(what: impl Into<String>) -> Event {
    Event {
        at: None,
        what: what.into(),
    }
}

/// The events of `r` as seen at `now`, oldest first; untimed ones last.
pub(crate) fn events(r: &Record, now: Timestamp) -> Vec<Event> {
    let mut out = vec![at(r.created_at, "claimed: first lease granted (attempt 1)")];
    if r.attempts > 1 {
        out.push(at(
            r.acquired_at,
            format!(
                "lease taken over after an abandoned attempt (attempt {}; earlier takeovers' times are not recorded)",
                r.attempts
            ),
        ));
    }
    match r.state(now) {
        RecordState::InFlight => out.push(at(
            r.lease_expires_at,
            "lease runs until (heartbeats move this; they are not recorded one by one)",
        )),
        RecordState::Abandoned => out.push(at(
            r.lease_expires_at,
            "lease ended without a completion: abandoned, outcome unknown (the last heartbeat had moved the end here)",
        )),
        RecordState::Completed => {}
    }
    if let Some(done) = r.completed_at {
        let by = match r.completed_by {
            Some(CompletedBy::Operator) => "resolved by an operator: result stored",
            _ => "completed by the executor: result stored",
        };
        out.push(at(done, by));
        if r.expires_at != Timestamp::NEVER {
            out.push(at(r.expires_at, "retention ends: the record is forgotten"));
        }
    }
    if r.replays > 0 {
        out.push(untimed(format!(
            "replayed {} time{} (each replay's time is not recorded)",
            r.replays,
            if r.replays == 1 { "" } else { "s" }
        )));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idem_core::{FencingToken, Fingerprint, Key, Scope, StoredResponse};

    use super::*;

    fn record() -> Record {
        let t = Timestamp::from_millis(1_000_000);
        Record {
            scope: Scope::anonymous(),
            key: Key::new("k").expect("key"),
            fingerprint: Fingerprint::http("POST", "/", None, b""),
            token: FencingToken::from_u64(1),
            created_at: t,
            acquired_at: t,
            lease_expires_at: t.saturating_add(Duration::from_secs(30)),
            completed_at: None,
            completed_by: None,
            expires_at: Timestamp::NEVER,
            retention: Duration::from_secs(60),
            attempts: 1,
            replays: 0,
            response: None,
        }
    }

    #[test]
    fn an_abandoned_record_says_its_lease_ended() {
        let r = record();
        let later = r.lease_expires_at;
        let e = events(&r, later);
        assert_eq!(e.len(), 2);
        assert!(e[1].what.contains("abandoned"), "{e:?}");
        assert_eq!(e[1].at, Some(r.lease_expires_at));
        let running = events(&r, r.created_at);
        assert!(running[1].what.contains("runs until"), "{running:?}");
    }

    #[test]
    fn takeovers_completion_and_replays_appear_with_what_is_not_recorded() {
        let mut r = record();
        r.attempts = 3;
        r.acquired_at = r.created_at.saturating_add(Duration::from_secs(40));
        r.completed_at = Some(r.acquired_at.saturating_add(Duration::from_secs(1)));
        r.completed_by = Some(CompletedBy::Operator);
        r.expires_at = r.acquired_at.saturating_add(Duration::from_secs(61));
        r.replays = 2;
        r.response = Some(StoredResponse::new(200, "ok"));
        let e = events(&r, r.acquired_at);
        let what: Vec<&str> = e.iter().map(|e| e.what.as_str()).collect();
        assert!(what[1].contains("attempt 3") && what[1].contains("not recorded"));
        assert!(what[2].contains("operator"));
        assert!(what[3].contains("retention"));
        assert_eq!(
            what[4],
            "replayed 2 times (each replay's time is not recorded)"
        );
        assert_eq!(e[4].at, None);
    }
}
