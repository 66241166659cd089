//! `idem serve`: the gateway sidecar.

use anyhow::{Context, Result};
use idem_gateway::{Bound, FileConfig, Overrides, Settings};
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::cli::ServeArgs;

pub(crate) async fn run(args: ServeArgs) -> Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let overrides = Overrides {
        listen: args.listen,
        upstream: args.upstream,
        upstream_ca: args.upstream_ca,
        store: args.store,
        admin_listen: args.admin_listen,
        threads: args.threads,
    };
    // The store URL was checked (and its default taken) while resolving the settings.
    let settings = Settings::resolve(file, overrides)?;
    let url = settings.store.clone();
    let store = url
        .open()
        .await
        .with_context(|| format!("cannot open the store {url}"))?;
    let metrics = install_metrics()?;
    let upstream = settings.upstream.clone();
    let announce = move |b: Bound| {
        println!(
            "idem serve: listening on {}; admin on {}; upstream {upstream}; store {url}",
            b.listen, b.admin
        );
    };
    idem_gateway::serve(settings, store, metrics, announce, shutdown_signal()).await
}

/// Installs the Prometheus recorder the engine's and the stores' metrics go to (`idem serve`
/// and `idem mcp` alike), and returns the handle its `/metrics` page renders.
pub(crate) fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            &[
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
                0.1, 0.25, 1.0,
            ],
        )
        .context("metrics buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")
        .inspect(|_| idem_core::outcome::register_metrics())
}

/// SIGTERM or Ctrl-C.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
