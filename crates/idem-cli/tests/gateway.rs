//! `idem serve` end to end: the real binary on loopback, a real SQLite file, and a small
//! upstream in this process that counts how often it really executes.
//!
//! Only what needs the binary is here: the process's metrics output (the recorder is global
//! per process), SIGTERM, a process under `ulimit`, and the operator commands run against the
//! gateway's store. What the proxy and the layer do on their own is tested in process by
//! `cargo test -p idem-gateway`.

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_table_through_the_real_gateway() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");

    // Nothing stored: execute once; the key passes through to the upstream.
    let first = charge_with(&g, "k1", &[], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.json()["headers"]["idempotency-key"], "k1");
    // Completed, same request: the stored status, body and kept headers, byte for byte.
    let again = charge_with(
        &g,
        "k1",
        &[],
        r#"{ "amount_cents": 4900, "customer_id": "cus_8g2k" }"#,
    )
    .await;
    assert!(again.replayed());
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(again.headers.get("x-charge"), first.headers.get("x-charge"));
    assert_eq!(
        again.headers.get("content-type"),
        first.headers.get("content-type")
    );
    // Other request, same key: 422.
    let other = charge_with(
        &g,
        "k1",
        &[],
        r#"{"customer_id":"cus_8g2k","amount_cents":1}"#,
    )
    .await;
    assert_eq!(
        (other.status, other.problem_type().as_str()),
        (422, "urn:idem:problem:key-reused")
    );
    // In flight: 409 with Retry-After.
    let slow = spawn_slow_charge(&g, "k2", 500);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let dup = charge_with(&g, "k2", &[], BODY).await;
    assert_eq!(
        (dup.status, dup.problem_type().as_str()),
        (409, "urn:idem:problem:in-flight")
    );
    assert!(dup.headers.contains_key("retry-after"));
    assert_eq!(slow.await.map(|r| r.status).ok(), Some(201));
    // Missing, malformed, too long, non-ASCII keys; oversized bodies.
    let missing = send(g.addr, "POST", "/v1/charges", &[], BODY).await;
    assert_eq!(
        (missing.status, missing.problem_type().as_str()),
        (400, "urn:idem:problem:key-missing")
    );
    let long = "k".repeat(256);
    for bad in ["", "a b", long.as_str()] {
        let r = charge_with(&g, bad, &[], BODY).await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (400, "urn:idem:problem:key-invalid"),
            "{bad:?}"
        );
    }
    let r = send(
        g.addr,
        "POST",
        "/v1/charges",
        &[("idempotency-key", "caf\u{e9}")],
        BODY,
    )
    .await;
    assert_eq!(r.status, 400);
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(5000));
    let r = charge_with(&g, "k3", &[], &big).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (413, "urn:idem:problem:body-too-large")
    );
    // Reads pass through untouched.
    assert_eq!(
        send(g.addr, "GET", "/v1/read", &[("idempotency-key", "k1")], "")
            .await
            .status,
        201
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 3, "upstream executions");

    // Hop-by-hop headers are dropped; X-Forwarded-* are added.
    let r = charge_with(
        &g,
        "k4",
        &[
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("host", "shop.example"),
        ],
        BODY,
    )
    .await;
    let seen = &r.json()["headers"];
    assert!(seen.get("x-hop").is_none(), "{seen}");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "shop.example");

    // The admin listener: token required; the record as `idem inspect --json` shows it.
    let unauthorised = send(g.admin, "GET", "/keys/k1", &[], "").await;
    assert_eq!(unauthorised.status, 401);
    let rec = send(
        g.admin,
        "GET",
        "/keys/k1",
        &[("authorization", "Bearer s3cret-admin-token")],
        "",
    )
    .await;
    assert_eq!(rec.status, 200, "{}", rec.body);
    assert_eq!(rec.json()["state"], "completed");
    assert_eq!(rec.json()["response"]["status"], 201);
    let metrics = send(
        g.admin,
        "GET",
        "/metrics",
        &[("authorization", "Bearer s3cret-admin-token")],
        "",
    )
    .await;
    for want in [
        r#"idem_requests_total{outcome="executed"} 3"#,
        r#"idem_requests_total{outcome="replayed"} 1"#,
        r#"idem_requests_total{outcome="mismatch"} 1"#,
        r#"idem_requests_total{outcome="conflict"} 1"#,
        r#"idem_requests_total{outcome="missing"} 1"#,
        r#"idem_requests_total{outcome="invalid"} 5"#,
        "idem_store_call_seconds_bucket",
        // Registered at zero, so an alert on them sees a value before the first event.
        "\nidem_completions_lost_total 0",
        r#"idem_store_errors_total{op="complete"} 0"#,
        r#"idem_requests_total{outcome="not_sent"} 0"#,
        // The completed-record cache answered the replay and the mismatch (design §9, §13).
        "\nidem_cache_hits_total 2",
        "\nidem_cache_misses_total ",
        // The background purge is a metered store call like the engine's.
        r#"idem_store_call_seconds_count{op="purge"}"#,
    ] {
        assert!(
            metrics.body.contains(want),
            "metrics lack {want}:\n{}",
            metrics.body
        );
    }
    assert_eq!(send(g.admin, "GET", "/healthz", &[], "").await.status, 200);
}

fn idem(args: &[&str], db: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .arg("--store")
        .arg(format!("sqlite:{}", db.display()))
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The state `idem inspect --json` reports for `key` in scope `anonymous`, or what it printed
/// instead.
fn record_state(key: &str, db: &Path) -> String {
    let out = idem(&["inspect", key, "--json"], db);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["state"]
        .as_str()
        .map_or_else(|| format!("{out:?}"), str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_is_an_unknown_outcome_until_an_operator_resolves_it() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}"), "");
    let auth = ("authorization", "Bearer agent-7");
    let r = charge_with(&g, "slowpoke", &[("x-sleep-ms", "2500"), auth], BODY).await;
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (504, "urn:idem:problem:upstream-timeout")
    );
    let retry = charge_with(&g, "slowpoke", &[auth], BODY).await;
    assert_eq!(
        (retry.status, retry.problem_type().as_str()),
        (409, "urn:idem:problem:outcome-unknown")
    );
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        1,
        "the unknown outcome was retried"
    );

    // The record is the caller's, not the anonymous scope's: named, that scope has none; not
    // named, the key is looked for in every scope and found in the caller's.
    let anonymous = idem(&["inspect", "slowpoke", "--scope", "anonymous"], &g.db);
    assert!(!anonymous.status.success());
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("--principal"),
        "{anonymous:?}"
    );
    let anywhere = idem(&["inspect", "slowpoke"], &g.db);
    assert!(anywhere.status.success(), "{anywhere:?}");
    assert!(
        String::from_utf8_lossy(&anywhere.stderr).contains("in scope \"p:"),
        "{anywhere:?}"
    );
    let principal = "authorization: Bearer agent-7";
    let inspect = idem(&["inspect", "slowpoke", "--principal", principal], &g.db);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("abandoned"), "{inspect:?}");
    assert!(
        text.contains("never"),
        "an abandoned record does not expire: {text}"
    );
    let body = g.db.with_file_name("resolved.json");
    std::fs::write(&body, r#"{"charge_id":"ch_1","resolved":true}"#)
        .unwrap_or_else(|e| panic!("{e}"));
    let body_arg = body.display().to_string();
    let resolved = idem(
        &[
            "resolve",
            "slowpoke",
            "--principal",
            principal,
            "--status",
            "201",
            "--body",
            &body_arg,
            "--header",
            "content-type: application/json",
        ],
        &g.db,
    );
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    let replay = charge_with(&g, "slowpoke", &[auth], BODY).await;
    assert!(replay.replayed());
    assert_eq!(
        (replay.status, replay.body.as_str()),
        (201, r#"{"charge_id":"ch_1","resolved":true}"#)
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests() {
    let (up_addr, up) = start_upstream().await;
    let mut g = start_gateway(&format!("http://{up_addr}"), "");
    let in_flight = spawn_slow_charge(&g, "drain", 700);
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.terminate();
    let r = in_flight.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 201, "the in-flight request was cut: {}", r.body);
    let status = g.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
    // The result was stored before the gateway exited.
    assert_eq!(record_state("drain", &g.db), "completed");
}

/// A client that hangs up does not cancel its execution, and a SIGTERM that comes after does
/// not either: the gateway waits for it as for a request whose client still waits, and
/// stores its result, so a retry replays it instead of finding the outcome unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_executions_whose_clients_hung_up() {
    let (up_addr, up) = start_upstream().await;
    let mut g = start_gateway(&format!("http://{up_addr}"), "");
    let left = spawn_slow_charge(&g, "left", 1_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client hangs up: its connection closes, its execution goes on.
    left.abort();
    let _ = left.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    g.terminate();
    let status = g.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
    assert_eq!(
        record_state("left", &g.db),
        "completed",
        "the execution's result was not stored before exit"
    );
}

/// The store's disk fills up under the gateway: requests it cannot record get 503
/// `store-unavailable`, and the upstream never executes a request that got one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_write_fails_closed() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway_limited(&format!("http://{up_addr}"), "", Some(64));
    let (mut created, mut unavailable) = (0, 0);
    // Small requests, many keys: the claims themselves must grow the file.
    for i in 0..400 {
        let r = charge_with(&g, &format!("full-{i}"), &[], BODY).await;
        match r.status {
            201 => created += 1,
            503 => {
                assert_eq!(r.problem_type(), "urn:idem:problem:store-unavailable");
                unavailable += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    assert!(
        unavailable > 0,
        "the disk never filled up ({created} created); raise the request count"
    );
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        created,
        "the upstream executed a request the store could not record ({created} created, {unavailable} refused)"
    );
}

/// `idem inspect --principal` hashes a caller's headers as the gateway does, whatever the
/// order they are given in: the default scope headers (here an API key and a cookie), or the
/// gateway's own `scope_headers` and `scope_cookies` read from its file with `--config`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_principal_finds_the_record_of_a_caller_named_by_cookie_and_api_key() {
    let (up_addr, _up) = start_upstream().await;
    let g = start_gateway_with(&format!("http://{up_addr}"), SCOPE_CONFIG);
    let caller = [("x-api-key", "k-7"), ("cookie", "s=abc")];
    let r = charge_with(&g, "by-key", &caller, BODY).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let state = |out: &std::process::Output| -> String {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        v["state"].as_str().map_or(err, str::to_owned)
    };
    let found = idem(
        &[
            "inspect",
            "by-key",
            "--json",
            "--principal",
            "cookie: s=abc",
            "--principal",
            "x-api-key: k-7",
        ],
        &g.db,
    );
    assert_eq!(state(&found), "completed");
    // Only part of the caller's headers is another caller.
    let partial = idem(
        &["inspect", "by-key", "--principal", "x-api-key: k-7"],
        &g.db,
    );
    assert!(!partial.status.success());
    // A header the gateway does not hash is named, not silently hashed.
    let foreign = idem(&["inspect", "by-key", "--principal", "x-tenant: 1"], &g.db);
    assert!(
        String::from_utf8_lossy(&foreign.stderr).contains("not one of the scope headers"),
        "{foreign:?}"
    );

    let g = start_gateway_with(
        &format!("http://{up_addr}"),
        &format!("scope_cookies = [\"session\"]\n{SCOPE_CONFIG}"),
    );
    let r = charge_with(&g, "by-session", &[("cookie", "_ga=1; session=s1")], BODY).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let config = g.db.with_file_name("idem.toml");
    let config = config.display().to_string();
    let with_file = idem(
        &[
            "inspect",
            "by-session",
            "--json",
            "--config",
            &config,
            "--principal",
            "cookie: session=s1; _ga=2",
        ],
        &g.db,
    );
    assert_eq!(state(&with_file), "completed");
    let with_flag = idem(
        &[
            "inspect",
            "by-session",
            "--json",
            "--scope-cookie",
            "session",
            "--principal",
            "cookie: session=s1",
        ],
        &g.db,
    );
    assert_eq!(state(&with_flag), "completed");
}

/// `--upstream-ca` reaches the configuration: a CA file that cannot be read stops `idem serve`
/// at startup, named, before it listens.
#[test]
fn an_unreadable_upstream_ca_file_stops_serve_at_startup() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let missing = dir.path().join("missing-ca.pem");
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--upstream", "https://localhost:1", "--upstream-ca"])
        .arg(&missing)
        .arg("--store")
        .arg(format!("sqlite:{}", dir.path().join("idem.db").display()))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot read the upstream CA file {}",
            missing.display()
        )),
        "{stderr}"
    );
}
