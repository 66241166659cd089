//! Serving: the proxy behind the idempotency layer on the main listener, the admin router on
//! its own, a background purge, and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use idem_core::Store;
use idem_http::IdempotencyLayer;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};

use crate::config::Settings;
use crate::proxy::{ClientAddr, Proxy};

/// Where the gateway ended up listening (useful with port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The proxy listener.
    pub listen: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
}

/// Binds both listeners, reports where through `on_bound`, and serves until `shutdown`
/// resolves; then stops accepting and gives in-flight requests `shutdown_timeout` to finish.
pub async fn serve<St: Store + Clone>(
    settings: Settings,
    store: St,
    metrics: PrometheusHandle,
    on_bound: impl FnOnce(Bound),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    // Before binding: an https:// upstream without CAs to trust is refused at startup.
    let proxy = Proxy::new(&settings)?;
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let admin_listener = TcpListener::bind(settings.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", settings.admin_listen))?;
    on_bound(Bound {
        listen: listener.local_addr()?,
        admin: admin_listener.local_addr()?,
    });

    let layer = IdempotencyLayer::new(store.clone(), settings.layer.clone());
    let service = layer.layer(proxy);

    let admin = crate::admin::router(store.clone(), metrics, settings.admin_token.clone());
    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(async move {
        let served = axum::serve(admin_listener, admin)
            .with_graceful_shutdown(async {
                let _ = admin_stopped.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin listener failed");
        }
    });
    let purge_task = tokio::spawn(purge_loop(
        store,
        settings.purge_interval,
        settings.purge_batch,
    ));

    let graceful = GracefulShutdown::new();
    let builder = hyper::server::conn::http1::Builder::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = Detached(service.clone()).map_request(move |mut req: http::Request<Incoming>| {
            req.extensions_mut().insert(ClientAddr(peer));
            req
        });
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    let drained = tokio::time::timeout(settings.shutdown_timeout, graceful.shutdown()).await;
    if drained.is_err() {
        tracing::warn!(timeout = ?settings.shutdown_timeout, "in-flight requests did not finish in time; their keys will read as abandoned");
    }
    let _ = admin_stop.send(());
    let _ = admin_task.await;
    purge_task.abort();
    Ok(())
}

/// Runs each request in a task of its own, so a client that hangs up does not cancel an
/// execution already under way: the upstream's answer is still stored and a retry with the
/// same key replays it, instead of finding the record abandoned.
#[derive(Clone)]
struct Detached<S>(S);

impl<S, Req> tower::Service<Req> for Detached<S>
where
    S: tower::Service<
            Req,
            Response = http::Response<idem_http::Body>,
            Error = std::convert::Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<idem_http::Body>;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let task = tokio::spawn(self.0.call(req));
        Box::pin(async move {
            match task.await {
                Ok(answer) => answer,
                Err(e) => {
                    // A panic in the layer or the proxy: the record is left to become abandoned.
                    tracing::error!(error = %e, "request task failed");
                    let mut resp = http::Response::new(idem_http::Body::default());
                    *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    Ok(resp)
                }
            }
        })
    }
}

/// Deletes expired records every `interval`, `batch` per transaction, until none is due.
async fn purge_loop<St: Store>(store: St, interval: Duration, batch: usize) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            match store.purge_expired(batch).await {
                Ok(n) => {
                    metrics::counter!("idem_purged_records_total").increment(n as u64);
                    if n < batch {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purge failed; will try again");
                    break;
                }
            }
        }
    }
}
