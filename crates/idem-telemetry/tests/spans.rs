//! The spans of keyed requests and tool calls as an OpenTelemetry collector receives them: the
//! front ends' span ([`idem_core::span::request`]) around the real engine, and `idem mcp`'s
//! own call path, through the layer the `idem` binary installs, into the SDK's in-memory
//! exporter.

use std::future::Future;

use idem_core::span::{Call, request, scope_hash};
use idem_core::{Effect, Engine, Fingerprint, Key, MemoryStore, Policy, Scope, StoredResponse};
use idem_telemetry::export::Traces;
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// Runs `work` on a runtime of this thread with the exporting layer installed, and answers
/// the spans it finished.
fn exported<F: Future<Output = ()>>(work: impl FnOnce() -> F) -> Vec<SpanData> {
    let exporter = InMemorySpanExporter::default();
    let traces = Traces::new(SdkTracerProvider::builder().with_simple_exporter(exporter.clone()));
    let subscriber = tracing_subscriber::registry().with(traces.layer());
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(work());
    });
    // The simple processor exports each span as it ends; shutting down would clear them.
    let spans = exporter.get_finished_spans().expect("the exported spans");
    traces.shutdown();
    spans
}

fn attribute<'a>(span: &'a SpanData, name: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == name)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, name: &str) -> Option<String> {
    attribute(span, name).map(Value::to_string)
}

fn ok(status: u16) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![],
        body: idem_core::StoredBody::Full(b"{\"charge\":\"ch_1\"}".to_vec().into()),
    }
}

async fn tool_call(engine: &Engine<MemoryStore>, scope: &Scope, key: &str, effect: Effect) {
    let span = request(Call::Tool {
        name: "charge_card",
        call_id: Some("call_7"),
    });
    let key = Key::new(key).expect("a valid key");
    let fingerprint = Fingerprint::json_call("charge_card", &serde_json::json!({"amount": 4900}));
    let answer = engine
        .run(
            scope.clone(),
            key,
            fingerprint,
            &Policy::default(),
            move || async move { (effect, ()) },
        )
        .instrument(span)
        .await;
    assert!(answer.is_ok(), "the memory store never fails");
}

#[test]
fn tool_calls_carry_the_gen_ai_attributes_and_their_outcome() {
    let scope = Scope::from_principal([b"authorization".as_slice(), b"Bearer sk_live_secret"]);
    let spans = exported(|| async {
        let engine = Engine::new(MemoryStore::new());
        tool_call(&engine, &scope, "k-charge", Effect::Done(ok(200))).await;
        tool_call(&engine, &scope, "k-charge", Effect::Done(ok(200))).await;
        tool_call(&engine, &scope, "k-lost", Effect::Unknown).await;
        tool_call(&engine, &scope, "k-lost", Effect::Done(ok(200))).await;
    });
    let outcomes: Vec<_> = spans.iter().map(|s| text(s, "idem.outcome")).collect();
    assert_eq!(
        outcomes,
        ["executed", "replayed", "unknown", "unknown"].map(|o| Some(o.to_owned()))
    );
    let keys: Vec<_> = spans.iter().map(|s| text(s, "idem.key")).collect();
    assert_eq!(
        keys,
        ["k-charge", "k-charge", "k-lost", "k-lost"].map(|k| Some(k.to_owned()))
    );
    for span in &spans {
        assert_eq!(span.name, "execute_tool charge_card");
        assert_eq!(
            text(span, "gen_ai.operation.name").as_deref(),
            Some("execute_tool")
        );
        assert_eq!(
            text(span, "gen_ai.tool.name").as_deref(),
            Some("charge_card")
        );
        assert_eq!(text(span, "gen_ai.tool.call.id").as_deref(), Some("call_7"));
        assert_eq!(text(span, "idem.scope_hash"), Some(scope_hash(&scope)));
        for kv in &span.attributes {
            let value = kv.value.to_string();
            assert!(
                !value.contains("sk_live_secret") && !value.contains(scope.as_str()),
                "{} carries the credential or the scope label: {value}",
                kv.key
            );
        }
    }
    // The warning about the unknown outcome is an event of its span.
    assert!(
        spans[2]
            .events
            .iter()
            .any(|e| e.name.contains("outcome unknown")),
        "events of the unknown outcome's span: {:?}",
        spans[2].events
    );
}

#[test]
fn keyed_http_requests_name_their_method_and_continue_the_callers_trace() {
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut incoming = http::HeaderMap::new();
    incoming.insert(
        "traceparent",
        http::HeaderValue::from_str(&format!("00-{caller_trace}-00f067aa0ba902b7-01"))
            .expect("a header value"),
    );
    let mut upstream = http::HeaderMap::new();
    let spans = exported(|| async {
        let engine = Engine::new(MemoryStore::new());
        let span = request(Call::Http { method: "POST" });
        idem_telemetry::continue_remote(&span, &incoming);
        let fingerprint = Fingerprint::http("POST", "/v1/charges", None, b"{}");
        let key = Key::new("k-http").expect("a valid key");
        let scope = Scope::anonymous();
        let upstream = &mut upstream;
        let answer = engine
            .run(
                scope,
                key,
                fingerprint,
                &Policy::default(),
                move || async move {
                    // The forwarded request, as the gateway builds it inside the effect.
                    idem_telemetry::inject(upstream);
                    (Effect::Done(ok(201)), ())
                },
            )
            .instrument(span)
            .await;
        assert!(answer.is_ok());
    });
    let [span] = spans.as_slice() else {
        panic!("one span, got {spans:?}");
    };
    assert_eq!(span.name, "idem POST");
    assert_eq!(text(span, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(text(span, "idem.outcome").as_deref(), Some("executed"));
    assert_eq!(span.span_context.trace_id().to_string(), caller_trace);
    assert_eq!(span.parent_span_id.to_string(), "00f067aa0ba902b7");
    let sent = upstream
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert_eq!(
        sent,
        format!("00-{caller_trace}-{}-01", span.span_context.span_id())
    );
}

#[test]
fn the_mcp_proxys_tool_calls_are_execute_tool_spans() {
    use idem_mcp::{Forwarded, Guard, ToolPolicy};
    let scope = Scope::new("mcp").expect("a scope");
    let spans = exported(|| async {
        let guard = Guard::new(MemoryStore::new());
        for (key, answer) in [("m-1", true), ("m-1", true), ("m-2", false)] {
            let reply = guard
                .call(
                    "send_email",
                    scope.clone(),
                    Key::new(key).expect("a valid key"),
                    Fingerprint::json_call("send_email", &serde_json::json!({"to": "a@b.c"})),
                    &ToolPolicy::default(),
                    move || async move {
                        if answer {
                            let done = serde_json::json!({"content": [], "isError": false});
                            Forwarded::Result(idem_mcp::call::raw(&done))
                        } else {
                            Forwarded::Lost("no answer".to_owned())
                        }
                    },
                )
                .await;
            assert!(reply.is_ok(), "{reply:?}");
        }
    });
    let outcomes: Vec<_> = spans.iter().map(|s| text(s, "idem.outcome")).collect();
    assert_eq!(
        outcomes,
        ["executed", "replayed", "unknown"].map(|o| Some(o.to_owned()))
    );
    for span in &spans {
        assert_eq!(span.name, "execute_tool send_email");
        assert_eq!(
            text(span, "gen_ai.tool.name").as_deref(),
            Some("send_email")
        );
        assert_eq!(text(span, "idem.scope_hash"), Some(scope_hash(&scope)));
    }
}
