//! The gateway in this process (`idem_gateway::serve`), a real SQLite file, and a small
//! upstream that counts how often it really executes: what the proxy and the idempotency
//! layer do together, without the `idem` binary. What needs the binary (signals, a process
//! under `ulimit`, the process's metrics, the operator commands) is tested in idem-cli.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_requests_with_one_key_execute_once() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    let Storm { bodies, by_status } = storm(&[g.addr], "storm", 100, "100").await;
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        1,
        "upstream executions; answers: {by_status:?}"
    );
    assert_eq!(bodies.len(), 1);
    // Different principals with the same key are different records.
    for who in ["alice", "bob"] {
        let auth = format!("Bearer {who}");
        let r = charge_with(&g, "shared", &[("authorization", &auth)], BODY).await;
        assert!(!r.replayed());
    }
    assert_eq!(up.0.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_processed_statuses_and_refused_connections_release_the_key() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    for status in ["429", "503"] {
        let key = format!("r{status}");
        assert_eq!(
            charge_with(&g, &key, &[("x-status", status)], BODY)
                .await
                .status
                .to_string(),
            status
        );
        let retry = charge_with(&g, &key, &[], BODY).await;
        assert_eq!(retry.status, 201, "{status} did not release the key");
    }
    assert_eq!(up.0.load(Ordering::SeqCst), 4);

    // An upstream that refuses connections: 502, and nothing is recorded.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let dead_addr = dead.local_addr().unwrap_or_else(|e| panic!("{e}"));
    drop(dead);
    let g = start_gateway(&format!("http://{dead_addr}")).await;
    let r = charge_with(&g, "refused", &[], BODY).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (502, "urn:idem:problem:upstream-unreachable")
    );
    let rec = send(
        g.admin,
        "GET",
        "/keys/refused",
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    assert_eq!(rec.status, 404, "the key was not released: {}", rec.body);
}

/// An upstream that sends its headers and then stalls mid-body is an unknown outcome at the
/// upstream deadline, like one that never answers: the key is not held forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_an_unknown_outcome_at_the_deadline() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    let r = send(
        g.addr,
        "POST",
        "/v1/stall",
        &[("idempotency-key", "stall")],
        BODY,
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.body);
    let retry = send(
        g.addr,
        "POST",
        "/v1/stall",
        &[("idempotency-key", "stall")],
        BODY,
    )
    .await;
    assert_eq!(
        (retry.status, retry.problem_type().as_str()),
        (409, "urn:idem:problem:outcome-unknown")
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// A client that hangs up mid-request does not cancel the execution: the answer is stored,
/// and the retry with the same key replays it instead of finding an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_does_not_abandon_the_execution() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    let hung_up = tokio::time::timeout(
        Duration::from_millis(200),
        charge_with(&g, "hangup", &[("x-sleep-ms", "700")], BODY),
    )
    .await;
    assert!(hung_up.is_err(), "the client was meant to give up first");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let retry = charge_with(&g, "hangup", &[], BODY).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert!(retry.replayed());
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}
