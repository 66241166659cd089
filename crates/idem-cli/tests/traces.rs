//! `idem serve` with traces turned on by `OTEL_*`, end to end: the real binary exports its
//! spans over OTLP/HTTP to a collector in this process, continues the client's trace and hands
//! it to the upstream ([design §13](docs/design.md#13-observability)).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use support::*;

/// An OTLP/HTTP collector that keeps every export request's body.
async fn start_collector() -> (std::net::SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/v1/traces",
            post(
                |State(seen): State<Arc<Mutex<Vec<u8>>>>, body: Bytes| async move {
                    if let Ok(mut seen) = seen.lock() {
                        seen.extend_from_slice(&body);
                    }
                    ""
                },
            ),
        )
        .with_state(received.clone());
    (serve_on_loopback(app).await, received)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_variables_turn_on_spans_that_continue_the_callers_trace_upstream() {
    let (up_addr, _up) = start_upstream().await;
    let (collector, received) = start_collector().await;
    let endpoint = format!("http://{collector}");
    let mut g = start_gateway_env(
        &format!("http://{up_addr}"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "traced-gateway"),
        ],
    );
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let first = charge_with(&g, "traced", &[("traceparent", &caller)], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = charge_with(&g, "traced", &[("traceparent", &caller)], BODY).await;
    assert!(again.replayed());

    // The upstream continues the trace, under the gateway's span, not the caller's.
    let forwarded = first.json()["headers"]["traceparent"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        forwarded.starts_with(&format!("00-{trace_id}-")) && forwarded != caller,
        "the upstream got traceparent {forwarded:?}"
    );

    // SIGTERM flushes the spans still queued before the process exits.
    g.terminate();
    let status = g.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    // The export may still be on its way through the collector's task.
    let mut exported = Vec::new();
    for _ in 0..200 {
        exported = received.lock().map(|r| r.clone()).unwrap_or_default();
        if contains(&exported, "replayed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for want in [
        "traced-gateway",
        "idem POST",
        "idem.outcome",
        "executed",
        "replayed",
        "idem.scope_hash",
        "traced",
    ] {
        assert!(
            contains(&exported, want),
            "the collector got no {want:?} in {} bytes",
            exported.len()
        );
    }
}
