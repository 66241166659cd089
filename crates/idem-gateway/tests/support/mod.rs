//! The gateway in this process: `idem_gateway::serve` on loopback port 0, on a SQLite file in
//! a temporary directory, configured from the same TOML text as the binary in idem-cli's
//! end-to-end tests; and (in `traffic`) the counting upstream and the client they share.
// Each test binary uses part of this.
#![allow(dead_code, unreachable_pub)]
use std::net::SocketAddr;
use std::sync::Arc;

use idem_gateway::{Bound, FileConfig, Overrides, Settings};
use idem_store_sqlite::{SqliteOptions, SqliteStore};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

mod traffic;
pub use traffic::*;

/// A gateway serving in a task of the test's runtime; dropping it shuts it down.
pub struct Gateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    /// Where its SQLite file is: another gateway started in it shares the store.
    pub dir: Arc<tempfile::TempDir>,
}

impl Listens for Gateway {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Shutdown would wait for in-flight requests; a finished test has none it needs.
        self.task.abort();
    }
}

/// Starts a gateway in front of `upstream` (`http://host:port`).
pub async fn start_gateway(upstream: &str) -> Gateway {
    start_gateway_with(upstream, |_| {}, SqliteOptions::default()).await
}

/// Starts a gateway in front of `upstream`, configured by `config` (TOML text).
pub async fn start_gateway_from(upstream: &str, config: &str) -> Gateway {
    let dir = Arc::new(tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")));
    start_configured(dir, upstream, config, |_| {}, SqliteOptions::default()).await
}

/// Starts a gateway in front of `upstream`, its [`CONFIG`] changed by `tune` and its SQLite
/// store (at [`Gateway::db_path`]) opened with `options`.
pub async fn start_gateway_with(
    upstream: &str,
    tune: impl FnOnce(&mut FileConfig),
    options: SqliteOptions,
) -> Gateway {
    let dir = Arc::new(tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")));
    start_configured(dir, upstream, CONFIG, tune, options).await
}

/// Starts a gateway on the SQLite file in `dir`, in front of `upstream`, configured by
/// `config` (TOML text): several gateways on one store.
pub async fn start_gateway_in(
    dir: Arc<tempfile::TempDir>,
    upstream: &str,
    config: &str,
) -> Gateway {
    start_configured(dir, upstream, config, |_| {}, SqliteOptions::default()).await
}

async fn start_configured(
    dir: Arc<tempfile::TempDir>,
    upstream: &str,
    config: &str,
    tune: impl FnOnce(&mut FileConfig),
    options: SqliteOptions,
) -> Gateway {
    let db = dir.path().join("idem.db");
    let mut file = FileConfig::parse(config).unwrap_or_else(|e| panic!("{e:#}"));
    tune(&mut file);
    // The binary reads the token from the variable CONFIG names; setting a variable in a
    // test process is unsafe, so here the token is given directly.
    file.admin.token_env = None;
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut settings = Settings::resolve(
        file,
        Overrides {
            listen: Some(loopback),
            admin_listen: Some(loopback),
            upstream: Some(upstream.to_owned()),
            store: Some(format!("sqlite:{}", db.display())),
            ..Overrides::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    settings.admin_token = Some(ADMIN_TOKEN.to_owned());
    let store = SqliteStore::open_with(&db, options).unwrap_or_else(|e| panic!("{e}"));
    // Not installed: the metrics recorder is global, and this process runs many gateways.
    let metrics = PrometheusBuilder::new().build_recorder().handle();
    let (bound_tx, bound_rx) = oneshot::channel::<Bound>();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(idem_gateway::serve(
        settings,
        store,
        metrics,
        move |b| {
            let _ = bound_tx.send(b);
        },
        async {
            let _ = stopped.await;
        },
    ));
    let bound = match bound_rx.await {
        Ok(b) => b,
        Err(_) => panic!("the gateway did not start: {:?}", task.await),
    };
    Gateway {
        addr: bound.listen,
        admin: bound.admin,
        stop: Some(stop),
        task,
        dir,
    }
}

impl Gateway {
    /// The gateway's SQLite file.
    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("idem.db")
    }
}
