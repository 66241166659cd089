//! The Grafana dashboard and the Prometheus rules under `ops/` name only metrics idem
//! exports: every `idem_*` name in their expressions must appear in a real exposition of
//! idem's metrics (the engine over a store, rendered by the exporter `idem serve` uses). A
//! renamed metric fails here, not silently on a dashboard. `promtool` checks the rules'
//! syntax and behaviour in `.ci/run`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;

use idem_core::{Key, MemoryStore, Scope, Store};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

fn ops(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../ops")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every metric name the exporter renders after idem registered its counters and timed a
/// store call, with a histogram's series names (`_bucket`, `_sum`, `_count`). Once per
/// process, as `register_metrics` is meant to be called: it resolves the handles a request's
/// path counts through, for the process's one recorder.
fn exported() -> BTreeSet<String> {
    static EXPORTED: OnceLock<BTreeSet<String>> = OnceLock::new();
    EXPORTED.get_or_init(render_once).clone()
}

fn render_once() -> BTreeSet<String> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[0.001, 0.01, 0.1, 1.0])
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        idem_core::outcome::register_metrics();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let store = idem_core::store::MeteredStore::new(MemoryStore::new());
        let key = Key::new("k").expect("key");
        rt.block_on(store.get(&Scope::anonymous(), &key))
            .expect("get");
    });
    handle
        .render()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The `idem_*` names in an expression.
fn names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("idem_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_dashboard_is_json_and_queries_only_exported_metrics() {
    let have = exported();
    assert!(have.contains("idem_store_call_seconds_bucket"), "{have:?}");
    let dash: serde_json::Value =
        serde_json::from_str(&ops("grafana/idem-dashboard.json")).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut queried = 0;
    for p in panels {
        let targets = p["targets"].as_array().expect("every panel has targets");
        for t in targets {
            let expr = t["expr"].as_str().expect("every target has an expr");
            let used = names(expr);
            assert!(!used.is_empty(), "{expr} names no idem metric");
            for n in used {
                assert!(
                    have.contains(&n),
                    "{} queries {n}, which idem does not export",
                    p["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 9);
}

#[test]
fn the_alert_rules_use_only_exported_metrics() {
    let have = exported();
    let rules = ops("prometheus/idem-rules.yml");
    let exprs: Vec<&str> = rules
        .lines()
        .skip_while(|l| !l.contains("groups:"))
        .filter(|l| l.contains("idem_") && !l.trim_start().starts_with('#'))
        .filter(|l| !l.contains("summary:") && !l.contains("description:"))
        .collect();
    assert!(exprs.len() >= 4, "{exprs:?}");
    for line in exprs {
        for n in names(line) {
            assert!(
                have.contains(&n),
                "a rule uses {n}, which idem does not export: {line}"
            );
        }
    }
    for alert in [
        "IdemAbandonedRecordsGrowing",
        "IdemStoreErrors",
        "IdemFailClosed503s",
    ] {
        assert!(rules.contains(&format!("alert: {alert}")), "{alert}");
    }
}

#[test]
fn a_renamed_metric_would_be_caught() {
    let have = exported();
    assert!(!have.contains("idem_request_total"));
    assert_eq!(
        names("rate(idem_x_total[5m]) / idem_y"),
        ["idem_x_total", "idem_y"]
    );
}
