//! The bodies of the cases, each generic over the backend and named for the rule it checks.
//!
//! A case here is `pub` but its module is private: it reaches the backends only through the
//! list in `__conformance_cases!` (`cases.rs`), which re-exports it from `cases` and expands
//! its `#[test]`s. A case left off that list is dead code, and dead code is an error here.
#![deny(dead_code)]

use std::sync::{Arc, Barrier};
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, CompletedBy, FencingToken, Key, Record, RecordState, Resolution, Scope,
    Stale, Store, StoreError, StoredBody, StoredResponse, Timestamp,
};

use crate::{Cx, LEASE, RETENTION, fp, key, response};

// Cases kept in their own modules, listed like the ones here.
pub use super::listing::records_are_listed_abandoned_first_and_filtered;

fn acquired(c: Result<Claim, StoreError>) -> idem_core::Lease {
    match c {
        Ok(Claim::Acquired(l)) => l,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn record<S: Store>(cx: &Cx<S>, k: &Key) -> Record {
    match cx.store.get(&cx.scope, k).await {
        Ok(Some(r)) => r,
        other => panic!("expected a record for {k}, got {other:?}"),
    }
}

fn assert_stale<T: std::fmt::Debug>(r: Result<T, StoreError>, want: Stale) {
    match r {
        Err(StoreError::Stale(s)) if s == want => {}
        other => panic!("expected Stale({want:?}), got {other:?}"),
    }
}

/// The record once its replay counter reads `n`, waiting up to two seconds for counts that a
/// backend applies after answering.
async fn eventually_replays<S: Store>(cx: &Cx<S>, k: &Key, n: u32) -> Record {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let r = record(cx, k).await;
        if r.replays == n || std::time::Instant::now() > deadline {
            assert_eq!(r.replays, n, "replay counter");
            return r;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ms(d: Duration) -> Duration {
    d + Duration::from_millis(1)
}

/// `get` of a key never claimed is `None`, not an error.
pub async fn get_of_absent_key_is_none<S: Store>(cx: Cx<S>) {
    let got = cx.store.get(&cx.scope, &key("never")).await;
    assert!(matches!(got, Ok(None)), "{got:?}");
}

/// absent -> in_flight: the lease, the token and every timestamp and counter are as claimed.
pub async fn claim_of_absent_key_acquires_a_durable_lease<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let t0 = cx.now();
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    assert_eq!(lease.attempt, 1);
    assert_eq!(lease.expires_at, t0.saturating_add(LEASE));
    let r = record(&cx, &k).await;
    assert_eq!(r.scope, cx.scope);
    assert_eq!(r.key, k);
    assert_eq!(r.fingerprint, fp(1));
    assert_eq!(r.token, lease.token);
    assert_eq!(r.state(cx.now()), RecordState::InFlight);
    assert_eq!(r.created_at, t0);
    assert_eq!(r.acquired_at, t0);
    assert_eq!(r.lease_expires_at, lease.expires_at);
    assert_eq!(
        r.expires_at,
        Timestamp::NEVER,
        "only completion starts retention"
    );
    assert_eq!(r.retention, RETENTION);
    assert_eq!((r.attempts, r.replays), (1, 0));
    assert_eq!(
        (r.completed_at, r.completed_by, r.response),
        (None, None, None)
    );
}

/// in_flight + same fingerprint -> InFlight (409 or wait, above the store); nothing changes.
pub async fn claim_while_in_flight_answers_in_flight<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    let before = record(&cx, &k).await;
    cx.clock.advance(LEASE - Duration::from_millis(1));
    match cx.store.claim(cx.req(&k, fp(1))).await {
        Ok(Claim::InFlight(r)) => {
            assert_eq!(r.token, lease.token);
            assert_eq!(r.lease_expires_at, lease.expires_at);
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    assert_eq!(record(&cx, &k).await, before);
}

/// Any state + other fingerprint -> Mismatch (422 `key-reused`); nothing executes or changes.
pub async fn other_fingerprint_is_a_mismatch_in_every_state<S: Store>(cx: Cx<S>) {
    let in_flight = key("in-flight");
    let completed = key("completed");
    let abandoned = key("abandoned");
    acquired(cx.store.claim(cx.req(&in_flight, fp(1))).await);
    let l = acquired(cx.store.claim(cx.req(&completed, fp(1))).await);
    if let Err(e) = cx
        .store
        .complete(&cx.scope, &completed, l.token, response("c"))
        .await
    {
        panic!("complete: {e}");
    }
    let mut abandoned_req = cx.req(&abandoned, fp(1));
    abandoned_req.lease = Duration::from_secs(1);
    acquired(cx.store.claim(abandoned_req).await);
    cx.clock.advance(Duration::from_secs(2));
    for k in [&in_flight, &completed, &abandoned] {
        let before = record(&cx, k).await;
        let mut req = cx.req(k, fp(2));
        // Even a policy that would take an abandoned record over must not do so for another
        // request.
        req.on_abandoned = AbandonedPolicy::Retry;
        match cx.store.claim(req).await {
            Ok(Claim::Mismatch(r)) => assert_eq!(r.fingerprint, fp(1), "{k}"),
            other => panic!("{k}: expected Mismatch, got {other:?}"),
        }
        assert_eq!(
            record(&cx, k).await,
            before,
            "{k}: a mismatch changed the record"
        );
    }
}

/// in_flight -> completed; completed + same fingerprint -> the stored result, counted.
pub async fn complete_then_claim_replays_and_counts<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(Duration::from_secs(5));
    let t_done = cx.now();
    let done = match cx
        .store
        .complete(&cx.scope, &k, lease.token, response("ch_1"))
        .await
    {
        Ok(r) => r,
        Err(e) => panic!("complete: {e}"),
    };
    assert_eq!(done.state(cx.now()), RecordState::Completed);
    assert_eq!(done.completed_at, Some(t_done));
    assert_eq!(done.completed_by, Some(CompletedBy::Executor));
    assert_eq!(done.expires_at, t_done.saturating_add(RETENTION));
    assert_eq!(done.response, Some(response("ch_1")));
    for _ in 0..3 {
        match cx.store.claim(cx.req(&k, fp(1))).await {
            Ok(Claim::Completed(r)) => {
                assert_eq!(r.response, Some(response("ch_1")));
                assert!(r.replays >= 1, "a replay must count itself");
                assert_eq!(r.attempts, 1);
            }
            other => panic!("expected Completed, got {other:?}"),
        }
    }
    // A backend may count replays after answering (SQLite does, so replays cost no fsync), but
    // must not lose a count.
    let r = eventually_replays(&cx, &k, 3).await;
    assert_eq!(r.completed_at, Some(t_done));
    assert_eq!(
        r.expires_at,
        t_done.saturating_add(RETENTION),
        "a replay must not extend retention"
    );
}

/// Status, header order, binary values and bodies (full and omitted) come back byte for byte.
pub async fn stored_responses_round_trip_exactly<S: Store>(cx: Cx<S>) {
    let full = StoredResponse {
        status: 500,
        headers: vec![
            ("content-type".into(), b"application/octet-stream".to_vec()),
            ("x-b".into(), vec![0, 255, 10, 13]),
            ("x-a".into(), b"".to_vec()),
            ("x-b".into(), b"second".to_vec()),
        ],
        body: StoredBody::Full((0..=255u8).cycle().take(70_000).collect()),
    };
    let omitted = StoredResponse {
        status: 200,
        headers: vec![],
        body: StoredBody::Omitted {
            len: 123_456_789,
            sha256: [0xab; 32],
        },
    };
    let empty = StoredResponse::new(204, Vec::new());
    for (i, resp) in [full, omitted, empty].into_iter().enumerate() {
        let k = key(&format!("r{i}"));
        let l = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
        if let Err(e) = cx
            .store
            .complete(&cx.scope, &k, l.token, resp.clone())
            .await
        {
            panic!("complete: {e}");
        }
        match cx.store.claim(cx.req(&k, fp(1))).await {
            Ok(Claim::Completed(r)) => assert_eq!(r.response, Some(resp)),
            other => panic!("expected Completed, got {other:?}"),
        }
    }
}

/// in_flight -> abandoned when the lease ends; a claim under `Reject` reports it, unchanged.
pub async fn lease_end_without_completion_is_abandoned<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(LEASE);
    let r = record(&cx, &k).await;
    assert_eq!(r.state(cx.now()), RecordState::Abandoned);
    match cx.store.claim(cx.req(&k, fp(1))).await {
        Ok(Claim::Abandoned(a)) => assert_eq!(a, r),
        other => panic!("expected Abandoned, got {other:?}"),
    }
    assert_eq!(record(&cx, &k).await, r);
}

/// abandoned -> in_flight under `Retry`: a new token, attempts + 1; the old token is fenced.
pub async fn abandoned_under_retry_is_taken_over_and_fences_the_old_token<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let t0 = cx.now();
    let first = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(ms(LEASE));
    let mut req = cx.req(&k, fp(1));
    req.on_abandoned = AbandonedPolicy::Retry;
    let t1 = cx.now();
    let second = acquired(cx.store.claim(req).await);
    assert_ne!(second.token, first.token);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.expires_at, t1.saturating_add(LEASE));
    let r = record(&cx, &k).await;
    assert_eq!((r.created_at, r.acquired_at, r.attempts), (t0, t1, 2));
    assert_eq!(r.state(cx.now()), RecordState::InFlight);

    assert_stale(
        cx.store
            .complete(&cx.scope, &k, first.token, response("old"))
            .await,
        Stale::Superseded,
    );
    assert_stale(
        cx.store.release(&cx.scope, &k, first.token).await,
        Stale::Superseded,
    );
    assert_stale(
        cx.store.extend(&cx.scope, &k, first.token, LEASE).await,
        Stale::Superseded,
    );
    assert_eq!(record(&cx, &k).await, r, "a stale token changed the record");

    match cx
        .store
        .complete(&cx.scope, &k, second.token, response("new"))
        .await
    {
        Ok(done) => assert_eq!(done.response, Some(response("new"))),
        Err(e) => panic!("complete with the current token: {e}"),
    }
}

/// A lease that ended with nobody taking over still belongs to its holder: its completion turns
/// an unknown outcome into a known one.
pub async fn late_completion_with_the_current_token_is_accepted<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(LEASE * 2);
    assert_eq!(
        record(&cx, &k).await.state(cx.now()),
        RecordState::Abandoned
    );
    match cx
        .store
        .complete(&cx.scope, &k, lease.token, response("late"))
        .await
    {
        Ok(r) => assert_eq!(r.state(cx.now()), RecordState::Completed),
        Err(e) => panic!("late completion refused: {e}"),
    }
    assert!(matches!(
        cx.store.claim(cx.req(&k, fp(1))).await,
        Ok(Claim::Completed(_))
    ));
}

/// in_flight -> absent by release: the next claim starts a fresh record.
pub async fn release_makes_the_key_absent<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let first = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    if let Err(e) = cx.store.release(&cx.scope, &k, first.token).await {
        panic!("release: {e}");
    }
    assert!(matches!(cx.store.get(&cx.scope, &k).await, Ok(None)));
    // Released means "nothing happened": even another request may now use the key.
    let second = acquired(cx.store.claim(cx.req(&k, fp(2))).await);
    assert_eq!(second.attempt, 1);
    assert_ne!(second.token, first.token);
    assert_stale(
        cx.store.release(&cx.scope, &k, first.token).await,
        Stale::Superseded,
    );
}

/// complete, release and extend with a token that is not current are refused and change nothing.
pub async fn stale_tokens_are_refused_and_change_nothing<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    let forged = FencingToken::from_u64(lease.token.as_u64() ^ 1);
    let before = record(&cx, &k).await;
    assert_stale(
        cx.store
            .complete(&cx.scope, &k, forged, response("x"))
            .await,
        Stale::Superseded,
    );
    assert_stale(
        cx.store.release(&cx.scope, &k, forged).await,
        Stale::Superseded,
    );
    assert_stale(
        cx.store.extend(&cx.scope, &k, forged, LEASE * 10).await,
        Stale::Superseded,
    );
    assert_eq!(record(&cx, &k).await, before);

    if let Err(e) = cx
        .store
        .complete(&cx.scope, &k, lease.token, response("ok"))
        .await
    {
        panic!("complete: {e}");
    }
    let done = record(&cx, &k).await;
    assert_stale(
        cx.store
            .complete(&cx.scope, &k, lease.token, response("again"))
            .await,
        Stale::Completed,
    );
    assert_stale(
        cx.store.release(&cx.scope, &k, lease.token).await,
        Stale::Completed,
    );
    assert_stale(
        cx.store.extend(&cx.scope, &k, lease.token, LEASE).await,
        Stale::Completed,
    );
    assert_eq!(record(&cx, &k).await, done);

    let absent = key("absent");
    assert_stale(
        cx.store
            .complete(&cx.scope, &absent, lease.token, response("x"))
            .await,
        Stale::Absent,
    );
    assert_stale(
        cx.store.release(&cx.scope, &absent, lease.token).await,
        Stale::Absent,
    );
    assert_stale(
        cx.store
            .extend(&cx.scope, &absent, lease.token, LEASE)
            .await,
        Stale::Absent,
    );
    assert!(matches!(cx.store.get(&cx.scope, &absent).await, Ok(None)));
}

/// extend is the heartbeat: the lease (and the record's retention) move to now + lease.
pub async fn extend_moves_the_lease<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(Duration::from_secs(20));
    let until = match cx.store.extend(&cx.scope, &k, lease.token, LEASE).await {
        Ok(t) => t,
        Err(e) => panic!("extend: {e}"),
    };
    assert_eq!(until, cx.now().saturating_add(LEASE));
    cx.clock.advance(Duration::from_secs(20)); // past the first lease, within the second
    let r = record(&cx, &k).await;
    assert_eq!(r.lease_expires_at, until);
    assert_eq!(r.expires_at, Timestamp::NEVER);
    assert_eq!(r.state(cx.now()), RecordState::InFlight);
    assert!(matches!(
        cx.store.claim(cx.req(&k, fp(1))).await,
        Ok(Claim::InFlight(_))
    ));
}

/// completed -> absent when retention ends: read as absent before any purge, and the key is
/// free again, even for another request.
pub async fn completed_record_expires_after_retention<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    if let Err(e) = cx
        .store
        .complete(&cx.scope, &k, lease.token, response("x"))
        .await
    {
        panic!("complete: {e}");
    }
    cx.clock.advance(RETENTION - Duration::from_millis(1));
    assert!(matches!(cx.store.get(&cx.scope, &k).await, Ok(Some(_))));
    cx.clock.advance(Duration::from_millis(1));
    assert!(
        matches!(cx.store.get(&cx.scope, &k).await, Ok(None)),
        "expired record still read"
    );
    assert_stale(
        cx.store
            .complete(&cx.scope, &k, lease.token, response("y"))
            .await,
        Stale::Absent,
    );
    let again = acquired(cx.store.claim(cx.req(&k, fp(2))).await);
    assert_eq!(again.attempt, 1);
    let r = record(&cx, &k).await;
    assert_eq!((r.fingerprint, r.replays, r.response), (fp(2), 0, None));
}

/// An abandoned record is kept until it is resolved or taken over: retention counts from
/// completion, and an unknown outcome that silently expired would re-execute under `reject`.
pub async fn abandoned_record_is_kept_until_resolved<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(LEASE + RETENTION * 10);
    let r = record(&cx, &k).await;
    assert_eq!(r.state(cx.now()), RecordState::Abandoned);
    assert_eq!(cx.store.purge_expired(100).await.ok(), Some(0));
    assert!(matches!(
        cx.store.claim(cx.req(&k, fp(1))).await,
        Ok(Claim::Abandoned(_))
    ));
    assert!(matches!(
        cx.store.resolve(&cx.scope, &k, Resolution::Release).await,
        Ok(None)
    ));
    acquired(cx.store.claim(cx.req(&k, fp(1))).await);
}

/// A stale token is refused by an abandoned record too: an executor that stalled through an
/// operator's release and another executor's crash must not complete over that record.
pub async fn stale_token_is_refused_by_an_abandoned_record<S: Store>(cx: Cx<S>) {
    let k = key("k1");
    let a = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    cx.clock.advance(LEASE);
    assert!(matches!(
        cx.store.resolve(&cx.scope, &k, Resolution::Release).await,
        Ok(None)
    ));
    let b = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    assert_ne!(a.token, b.token);
    cx.clock.advance(LEASE);
    let before = record(&cx, &k).await;
    assert_eq!(before.state(cx.now()), RecordState::Abandoned);
    assert_stale(
        cx.store
            .complete(&cx.scope, &k, a.token, response("zombie"))
            .await,
        Stale::Superseded,
    );
    assert_stale(
        cx.store.extend(&cx.scope, &k, a.token, LEASE).await,
        Stale::Superseded,
    );
    assert_stale(
        cx.store.release(&cx.scope, &k, a.token).await,
        Stale::Superseded,
    );
    assert_eq!(
        record(&cx, &k).await,
        before,
        "a stale token changed an abandoned record"
    );
}

/// purge_expired deletes at most `limit` per call, only expired records, until none is left.
pub async fn purge_deletes_only_expired_records_in_bounded_batches<S: Store>(cx: Cx<S>) {
    let short = Duration::from_secs(60);
    for i in 0..25 {
        let k = key(&format!("short{i}"));
        let mut req = cx.req(&k, fp(1));
        req.retention = short;
        let l = acquired(cx.store.claim(req).await);
        if let Err(e) = cx
            .store
            .complete(&cx.scope, &k, l.token, response("s"))
            .await
        {
            panic!("complete: {e}");
        }
    }
    for i in 0..5 {
        let k = key(&format!("long{i}"));
        let l = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
        if let Err(e) = cx
            .store
            .complete(&cx.scope, &k, l.token, response("l"))
            .await
        {
            panic!("complete: {e}");
        }
    }
    let in_flight = key("in-flight");
    acquired(cx.store.claim(cx.req(&in_flight, fp(1))).await);
    assert_eq!(
        cx.store.purge_expired(100).await.ok(),
        Some(0),
        "nothing is due yet"
    );
    cx.clock.advance(short);
    let mut batches = Vec::new();
    loop {
        match cx.store.purge_expired(10).await {
            Ok(0) => break,
            Ok(n) => batches.push(n),
            Err(e) => panic!("purge: {e}"),
        }
        assert!(batches.len() <= 3, "purge does not end: {batches:?}");
    }
    assert_eq!(batches, vec![10, 10, 5]);
    for i in 0..25 {
        assert!(matches!(
            cx.store.get(&cx.scope, &key(&format!("short{i}"))).await,
            Ok(None)
        ));
    }
    for i in 0..5 {
        assert!(matches!(
            cx.store.get(&cx.scope, &key(&format!("long{i}"))).await,
            Ok(Some(_))
        ));
    }
    assert_eq!(
        record(&cx, &in_flight).await.state(cx.now()),
        RecordState::Abandoned
    );
    cx.clock.advance(RETENTION + LEASE);
    // The completed records go; the abandoned one stays for an operator.
    assert_eq!(cx.store.purge_expired(100).await.ok(), Some(5));
    assert_eq!(
        record(&cx, &in_flight).await.state(cx.now()),
        RecordState::Abandoned
    );
}

/// resolve settles abandoned records only: release forgets the key; a stored result replays
/// and fences the abandoned executor out.
pub async fn resolve_settles_only_abandoned_records<S: Store>(cx: Cx<S>) {
    let absent = key("absent");
    assert!(matches!(
        cx.store
            .resolve(&cx.scope, &absent, Resolution::Release)
            .await,
        Err(StoreError::NotFound)
    ));
    let k = key("k1");
    let lease = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    match cx.store.resolve(&cx.scope, &k, Resolution::Release).await {
        Err(StoreError::NotAbandoned {
            state: RecordState::InFlight,
        }) => {}
        other => panic!("resolving an in-flight record: {other:?}"),
    }
    cx.clock.advance(LEASE);
    match cx
        .store
        .resolve(&cx.scope, &k, Resolution::Complete(response("settled")))
        .await
    {
        Ok(Some(r)) => {
            assert_eq!(r.completed_by, Some(CompletedBy::Operator));
            assert_eq!(r.completed_at, Some(cx.now()));
        }
        other => panic!("resolve complete: {other:?}"),
    }
    assert!(
        cx.store
            .complete(&cx.scope, &k, lease.token, response("late"))
            .await
            .is_err()
    );
    match cx.store.claim(cx.req(&k, fp(1))).await {
        Ok(Claim::Completed(r)) => assert_eq!(r.response, Some(response("settled"))),
        other => panic!("expected the operator's result, got {other:?}"),
    }
    match cx.store.resolve(&cx.scope, &k, Resolution::Release).await {
        Err(StoreError::NotAbandoned {
            state: RecordState::Completed,
        }) => {}
        other => panic!("resolving a completed record: {other:?}"),
    }

    let k2 = key("k2");
    let lease2 = acquired(cx.store.claim(cx.req(&k2, fp(1))).await);
    cx.clock.advance(LEASE);
    assert!(matches!(
        cx.store.resolve(&cx.scope, &k2, Resolution::Release).await,
        Ok(None)
    ));
    assert!(matches!(cx.store.get(&cx.scope, &k2).await, Ok(None)));
    assert_stale(
        cx.store
            .complete(&cx.scope, &k2, lease2.token, response("late"))
            .await,
        Stale::Absent,
    );
}

/// Same key, other scope: another record; a stored result never crosses scopes.
pub async fn scopes_never_meet<S: Store>(cx: Cx<S>) {
    let k = key("shared-key");
    let other = match Scope::new(format!("{}-other", cx.scope)) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let mine = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
    let mut req = cx.req(&k, fp(2));
    req.scope = other.clone();
    let theirs = acquired(cx.store.claim(req.clone()).await);
    assert_ne!(mine.token, theirs.token);
    if let Err(e) = cx
        .store
        .complete(&cx.scope, &k, mine.token, response("mine"))
        .await
    {
        panic!("complete: {e}");
    }
    assert!(matches!(cx.store.claim(req).await, Ok(Claim::InFlight(_))));
    assert_stale(
        cx.store
            .complete(&other, &k, mine.token, response("x"))
            .await,
        Stale::Superseded,
    );
    match cx.store.get(&other, &k).await {
        Ok(Some(r)) => assert_eq!((r.fingerprint, r.response), (fp(2), None)),
        other => panic!("{other:?}"),
    }
}

/// Keys with quotes, backslashes, SQL wildcards and the maximum lengths survive storage.
pub async fn extreme_keys_and_scopes_are_stored_exactly<S: Store>(cx: Cx<S>) {
    let long_key = "k".repeat(idem_core::key::MAX_KEY_LEN);
    let names = [
        r#"a"b\c'd"#,
        "%_*?[]{}",
        "--;DROP_TABLE_x;'",
        long_key.as_str(),
        "~",
    ];
    for name in names {
        let k = key(name);
        let l = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
        assert_eq!(record(&cx, &k).await.key.as_str(), name);
        if let Err(e) = cx
            .store
            .complete(&cx.scope, &k, l.token, response(name))
            .await
        {
            panic!("complete {name:?}: {e}");
        }
    }
    for name in names {
        match cx.store.claim(cx.req(&key(name), fp(1))).await {
            Ok(Claim::Completed(r)) => assert_eq!(r.response, Some(response(name))),
            other => panic!("{name:?}: {other:?}"),
        }
    }
    // A wildcard key must not match its neighbours.
    assert!(matches!(cx.store.get(&cx.scope, &key("%")).await, Ok(None)));
    let long_scope = match Scope::new(format!(
        "{}{}",
        cx.scope,
        "s".repeat(idem_core::scope::MAX_SCOPE_LEN - cx.scope.as_str().len())
    )) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let mut req = cx.req(&key("k"), fp(1));
    req.scope = long_scope.clone();
    acquired(cx.store.claim(req).await);
    assert!(matches!(
        cx.store.get(&long_scope, &key("k")).await,
        Ok(Some(_))
    ));
}

/// Runs `f(i)` on `n` OS threads released together by a barrier; returns their results.
fn race<S: Store, T: Send + 'static>(
    cx: &Cx<S>,
    n: usize,
    f: impl Fn(usize, &S) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + '_>>
    + Send
    + Sync
    + 'static,
) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, f, store, handle) = (
                barrier.clone(),
                f.clone(),
                cx.store.clone(),
                cx.handle.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                handle.block_on(f(i, &store))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| match t.join() {
            Ok(v) => v,
            Err(_) => panic!("a racing thread panicked"),
        })
        .collect()
}

fn count_acquired(results: &[Result<Claim, StoreError>]) -> usize {
    for r in results {
        if let Err(e) = r {
            panic!("a racing claim failed: {e}");
        }
    }
    results
        .iter()
        .filter(|r| matches!(r, Ok(Claim::Acquired(_))))
        .count()
}

/// 64 threads claim one key at once: exactly one acquires, the rest see it in flight.
pub async fn race_64_threads_one_key_exactly_one_acquires<S: Store>(cx: Cx<S>) {
    for round in 0..10 {
        let req = cx.req(&key(&format!("race{round}")), fp(1));
        let results = race(&cx, 64, move |_, store| {
            let req = req.clone();
            Box::pin(async move { store.claim(req).await })
        });
        assert_eq!(count_acquired(&results), 1, "round {round}: {results:?}");
        let in_flight = results
            .iter()
            .filter(|r| matches!(r, Ok(Claim::InFlight(_))))
            .count();
        assert_eq!(in_flight, 63, "round {round}");
    }
}

/// 64 threads take over one abandoned record at once under `Retry`: exactly one acquires.
pub async fn race_64_threads_takeover_of_abandoned_exactly_one_acquires<S: Store>(cx: Cx<S>) {
    for round in 0..5 {
        let k = key(&format!("abandoned{round}"));
        let first = acquired(cx.store.claim(cx.req(&k, fp(1))).await);
        cx.clock.advance(ms(LEASE));
        let mut req = cx.req(&k, fp(1));
        req.on_abandoned = AbandonedPolicy::Retry;
        let results = race(&cx, 64, move |_, store| {
            let req = req.clone();
            Box::pin(async move { store.claim(req).await })
        });
        assert_eq!(count_acquired(&results), 1, "round {round}");
        let r = record(&cx, &k).await;
        assert_eq!(r.attempts, 2);
        assert_ne!(r.token, first.token);
    }
}

/// Threads race over many keys, each winner completes: every key executes exactly once and
/// ends with its winner's result.
pub async fn race_threads_over_many_keys_each_executes_once<S: Store>(cx: Cx<S>) {
    const KEYS: usize = 40;
    const THREADS: usize = 32;
    let scope = cx.scope.clone();
    let base = cx.req(&key("x"), fp(1));
    let wins: Vec<Vec<usize>> = race(&cx, THREADS, move |t, store| {
        let (scope, base) = (scope.clone(), base.clone());
        Box::pin(async move {
            let mut won = Vec::new();
            for j in 0..KEYS {
                // Each thread walks the keys from its own offset, so threads meet on every key.
                let i = (j + t * 7) % KEYS;
                let mut req = base.clone();
                req.key = key(&format!("many{i}"));
                match store.claim(req).await {
                    Ok(Claim::Acquired(l)) => {
                        let body = format!("key {i} by thread {t}");
                        if let Err(e) = store
                            .complete(&scope, &key(&format!("many{i}")), l.token, response(&body))
                            .await
                        {
                            panic!("complete: {e}");
                        }
                        won.push(i);
                    }
                    Ok(Claim::InFlight(_) | Claim::Completed(_)) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            won
        })
    });
    let mut winners = vec![Vec::new(); KEYS];
    for (t, keys) in wins.iter().enumerate() {
        for &i in keys {
            winners[i].push(t);
        }
    }
    for (i, w) in winners.iter().enumerate() {
        assert_eq!(w.len(), 1, "key {i} acquired by threads {w:?}");
        let r = record(&cx, &key(&format!("many{i}"))).await;
        assert_eq!(
            r.response,
            Some(response(&format!("key {i} by thread {}", w[0])))
        );
    }
}
