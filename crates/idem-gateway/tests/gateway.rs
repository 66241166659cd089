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
        &[("authorization", "Bearer s3cret-admin-token")],
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

/// A gateway with the scope tests' configuration, `top` (top-level settings) before it.
async fn scope_gateway(top: &str) -> (Gateway, Upstream) {
    let (up_addr, up) = start_upstream().await;
    let config = format!("{top}\n{SCOPE_CONFIG}");
    (
        start_gateway_from(&format!("http://{up_addr}"), &config).await,
        up,
    )
}

/// Issue 13: with the default scope headers, a caller named only by its cookie was in the
/// shared anonymous scope, so bob, reusing alice's key and body, got her response and her
/// `Set-Cookie`. Now `cookie` names a caller: bob executes in his own scope and alice's retry
/// replays her own session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_named_by_its_cookie_never_gets_another_callers_session() {
    let (g, up) = scope_gateway("").await;
    let alice = [
        ("cookie", "s=alice"),
        ("x-set-cookie", "s=alice-2; HttpOnly"),
    ];
    let first = charge_with(&g, "k1", &alice, BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(
        first.headers.get("set-cookie").map(|v| v.as_bytes()),
        Some(&b"s=alice-2; HttpOnly"[..])
    );
    let bob = charge_with(&g, "k1", &[("cookie", "s=bob")], BODY).await;
    assert_eq!(bob.status, 201, "{}", bob.body);
    assert!(!bob.replayed(), "bob got alice's replay: {}", bob.body);
    assert!(
        bob.headers.get("set-cookie").is_none(),
        "bob got alice's session"
    );
    assert_ne!(bob.json()["charge_id"], first.json()["charge_id"]);
    // Alice's retry is hers: her response and her session.
    let again = charge_with(&g, "k1", &[("cookie", "s=alice")], BODY).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(
        again.headers.get("set-cookie"),
        first.headers.get("set-cookie")
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 2);
}

/// An API-key header names a caller by default: two keys with one idempotency key are two
/// records. Before issue 13 both were anonymous and the second replayed the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_with_an_api_key_header_is_its_own_scope() {
    let (g, up) = scope_gateway("").await;
    for (name, a, b) in [("x-api-key", "k-alice", "k-bob"), ("api-key", "a", "b")] {
        let key = format!("by-{name}");
        let first = charge_with(&g, &key, &[(name, a)], BODY).await;
        let other = charge_with(&g, &key, &[(name, b)], BODY).await;
        assert_eq!((first.status, other.status), (201, 201), "{}", other.body);
        assert!(!other.replayed(), "{name}: {b} got {a}'s replay");
        assert!(charge_with(&g, &key, &[(name, a)], BODY).await.replayed());
    }
    assert_eq!(up.0.load(Ordering::SeqCst), 4);
}

/// A keyed request that names no caller is refused by default, before anything is claimed or
/// sent; a keyless one still passes where the route allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_naming_no_caller_is_refused_by_default() {
    let (g, up) = scope_gateway("").await;
    let r = charge_with(&g, "k1", &[], BODY).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (400, "urn:idem:problem:principal-missing"),
        "{}",
        r.body
    );
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.contains("authorization, proxy-authorization, cookie, x-api-key"),
        "{detail}"
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
    let other = send(g.addr, "POST", "/v1/other", &[], BODY).await;
    assert_eq!(other.status, 404, "no key, no scope needed: passed through");
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
    // The same key with a credential executes: the refusal recorded nothing.
    let named = charge_with(&g, "k1", &[("authorization", "Bearer a")], BODY).await;
    assert_eq!(named.status, 201, "{}", named.body);
}

/// Where anonymous callers are allowed they share one scope, so nothing that carries one
/// caller's state is replayed there: the first caller gets its `Set-Cookie`, no replay does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_anonymous_scope_never_replays_a_session() {
    let (g, up) = scope_gateway("anonymous = \"allow\"").await;
    let first = charge_with(&g, "k1", &[("x-set-cookie", "s=first")], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(
        first.headers.get("set-cookie").map(|v| v.as_bytes()),
        Some(&b"s=first"[..])
    );
    let second = charge_with(&g, "k1", &[], BODY).await;
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert!(
        second.headers.get("set-cookie").is_none(),
        "the session was replayed"
    );
    assert_eq!(
        second.headers.get("x-charge"),
        first.headers.get("x-charge")
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// With `scope_cookies`, only the session cookie names the caller: a retry whose other
/// cookies changed (analytics, load balancer) replays instead of executing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_session_cookies_keep_a_retry_in_its_scope() {
    let (g, up) = scope_gateway("scope_cookies = [\"session\"]").await;
    let first = charge_with(&g, "k1", &[("cookie", "_ga=1; session=alice")], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let retry = charge_with(&g, "k1", &[("cookie", "session=alice; _ga=2; lb=x")], BODY).await;
    assert!(retry.replayed(), "{}", retry.body);
    let bob = charge_with(&g, "k1", &[("cookie", "_ga=1; session=bob")], BODY).await;
    assert!(!bob.replayed());
    let none = charge_with(&g, "k1", &[("cookie", "_ga=1")], BODY).await;
    assert_eq!(none.problem_type(), "urn:idem:problem:principal-missing");
    assert_eq!(up.0.load(Ordering::SeqCst), 2);
}
