//! Serving: the proxy behind the idempotency layer on the main listener, the admin router on
//! its own, a background purge, and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::client::legacy::connect::Connect;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use idem_core::{ListRecords, Store};
use idem_http::IdempotencyLayer;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;
use tower::Layer;

use crate::config::Settings;
use crate::listener::Listener;
use crate::proxy::{ClientAddr, Proxy};
use crate::threads::Threads;

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
///
/// Connections are served on `settings.threads` threads of their own (`src/threads.rs`);
/// the caller's runtime accepts them, serves the admin listener, and runs the purge.
pub async fn serve<St: Store + ListRecords + Clone>(
    settings: Settings,
    store: St,
    metrics: PrometheusHandle,
    on_bound: impl FnOnce(Bound),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    // Before binding: an https:// upstream without CAs to trust is refused at startup. One
    // proxy, so one upstream pool, per serving thread.
    let proxies = (0..settings.threads.max(1))
        .map(|_| Proxy::new(&settings))
        .collect::<Result<Vec<_>>>()?;
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let admin_listener = TcpListener::bind(settings.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", settings.admin_listen))?;
    let builder = connection_builder(&settings);
    let layer = IdempotencyLayer::new(store.clone(), settings.layer.clone());
    let detached = TaskTracker::new();
    let prepare = proxies
        .into_iter()
        .map(|proxy| {
            let (layer, detached) = (layer.clone(), detached.clone());
            // On the serving thread: its own store connection where the store has one to
            // drive (Redis; PostgreSQL's batchers), so a store call does not cross threads;
            // waiters and the completed-record cache stay shared.
            move || async move {
                let store = layer
                    .store()
                    .for_this_runtime()
                    .await
                    .context("cannot open the store")?;
                Ok(proxied(layer.with_store(store).layer(proxy), detached))
            }
        })
        .collect();
    let mut threads = Threads::start(prepare, &builder, settings.shutdown_timeout).await?;
    on_bound(Bound {
        listen: listener.local_addr()?,
        admin: admin_listener.local_addr()?,
    });
    let background = Background::start(&settings, store, metrics, admin_listener, &builder);
    accept_loop(
        "proxy",
        listener,
        settings.max_connections,
        |stream, peer, slot| threads.dispatch(stream, peer, slot),
        shutdown,
    )
    .await;
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    if !threads.drain(&detached).await {
        warn_undrained(settings.shutdown_timeout);
    }
    background.stop().await;
    Ok(())
}

/// The two listeners the gateway accepts connections on.
#[derive(Debug)]
pub struct Listeners<L, A> {
    /// Where clients send the requests to forward.
    pub proxy: L,
    /// Where `/healthz`, `/metrics` and `/keys/{key}` are served.
    pub admin: A,
}

/// [`serve`] on listeners and a proxy made elsewhere, on the caller's runtime alone: what
/// `serve` does once it has bound, for callers that bring their own network (the
/// deterministic simulation in `tests/simulation/` runs the gateway on a simulated one,
/// whose connections cannot move to other threads). `settings.listen`,
/// `settings.admin_listen` and `settings.threads` are not read.
pub async fn serve_on<St, L, A, C>(
    settings: Settings,
    store: St,
    metrics: PrometheusHandle,
    proxy: Proxy<C>,
    listeners: Listeners<L, A>,
    shutdown: impl Future<Output = ()>,
) where
    St: Store + ListRecords + Clone,
    L: Listener,
    A: Listener,
    C: Connect + Clone + Send + Sync + 'static,
{
    let Listeners {
        proxy: listener,
        admin: admin_listener,
    } = listeners;
    let builder = connection_builder(&settings);
    let layer = IdempotencyLayer::new(store.clone(), settings.layer.clone());
    let detached = TaskTracker::new();
    let make_service = proxied(layer.layer(proxy), detached.clone());
    let background = Background::start(&settings, store, metrics, admin_listener, &builder);
    let graceful = GracefulShutdown::new();
    accept_loop(
        "proxy",
        listener,
        settings.max_connections,
        |io, peer, slot| {
            serve_connection("proxy", &builder, &graceful, io, make_service(peer), slot)
        },
        shutdown,
    )
    .await;
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    let drained = tokio::time::timeout(settings.shutdown_timeout, async {
        graceful.shutdown().await;
        // Executions whose clients hung up are not connections any more, but their results
        // are still to be stored.
        detached.close();
        detached.wait().await;
    })
    .await;
    if drained.is_err() {
        warn_undrained(settings.shutdown_timeout);
    }
    background.stop().await;
}

/// What is still under way at the deadline stops with its thread: the request, and on
/// PostgreSQL the thread's claim and completion batches (`Store::for_this_runtime`). Nothing
/// runs twice for it; the keys wait out their leases and read as abandoned.
fn warn_undrained(timeout: Duration) {
    tracing::warn!(
        ?timeout,
        "in-flight requests did not finish in time; their keys will read as abandoned"
    );
}

/// HTTP/1 with the header read timeout, for both listeners.
fn connection_builder(settings: &Settings) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    builder
}

/// What serves a client's connection: `service` (the layer over a proxy), each request run
/// in the connection's task and handed to a task tracked by `detached` if its client hangs up,
/// and told the client's address ([`Detached`]).
fn proxied<S>(
    service: S,
    detached: TaskTracker,
) -> impl Fn(SocketAddr) -> TowerToHyperService<Detached<S>> + Send + 'static
where
    S: Clone + Send + 'static,
{
    move |peer: SocketAddr| {
        TowerToHyperService::new(Detached {
            service: service.clone(),
            peer: ClientAddr::new(peer),
            tasks: detached.clone(),
        })
    }
}

/// What runs beside the proxy listener on the caller's runtime: the admin listener and the
/// background purge.
struct Background {
    admin_stop: tokio::sync::oneshot::Sender<()>,
    admin_task: tokio::task::JoinHandle<()>,
    purge_task: tokio::task::JoinHandle<()>,
}

impl Background {
    fn start<St, A>(
        settings: &Settings,
        store: St,
        metrics: PrometheusHandle,
        admin_listener: A,
        builder: &http1::Builder,
    ) -> Self
    where
        St: Store + ListRecords + Clone,
        A: Listener,
    {
        let admin = crate::admin::router(store.clone(), metrics, settings.admin_token.clone());
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin_task = tokio::spawn({
            let builder = builder.clone();
            let drain = settings.shutdown_timeout;
            async move {
                let graceful = GracefulShutdown::new();
                let stopped = async {
                    let _ = admin_stopped.await;
                };
                accept_loop(
                    "admin",
                    admin_listener,
                    ADMIN_MAX_CONNECTIONS,
                    |io, _peer, slot| {
                        let service = TowerToHyperService::new(admin.clone());
                        serve_connection("admin", &builder, &graceful, io, service, slot);
                    },
                    stopped,
                )
                .await;
                let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
            }
        });
        // Metered like every other store call, so a purge's time and failures are in
        // idem_store_call_seconds / idem_store_errors_total{op="purge"} and its count in
        // idem_purged_records_total, from the one wrapper that counts them.
        let purge_task = tokio::spawn(purge_loop(
            idem_core::store::MeteredStore::new(store),
            settings.purge_interval,
            settings.purge_batch,
        ));
        Background {
            admin_stop,
            admin_task,
            purge_task,
        }
    }

    /// After the proxy listener has drained: stops the admin listener and the purge.
    async fn stop(self) {
        let _ = self.admin_stop.send(());
        let _ = self.admin_task.await;
        self.purge_task.abort();
    }
}

/// Connections the admin listener serves at once; more wait to be accepted.
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// How long the accept loop pauses after `accept` fails (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` until `shutdown` resolves, and gives each to `serve`
/// with its peer's address and its slot. A connection is accepted only while fewer than
/// `max_connections` are open, and holds its slot until it closes: past the cap, new
/// connections wait in the kernel's accept queue (and the client's connect timeout) rather
/// than take file descriptors the served ones need. A failed `accept` is logged and retried
/// after [`ACCEPT_BACKOFF`].
async fn accept_loop<L: Listener>(
    name: &'static str,
    listener: L,
    max_connections: usize,
    mut serve: impl FnMut(L::Io, SocketAddr, OwnedSemaphorePermit),
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut full = false;
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                full = false;
                slot
            }
            Err(_) => {
                if !full {
                    full = true;
                    tracing::warn!(
                        listener = name,
                        max_connections,
                        "connection cap reached: new connections wait until one closes"
                    );
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning;
                    // connections that end meanwhile give their descriptors back.
                    tracing::warn!(listener = name, error = %e, "accept failed; retrying shortly");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        serve(stream, peer, slot);
    }
}

/// Serves one connection on this runtime with `service`, under `graceful`; `held` (the
/// connection cap's slot, and whatever else counts the connection) is dropped when it
/// closes. A connection that does not send a request's headers within the builder's header
/// read timeout is closed, so stalled clients free their slots.
pub(crate) fn serve_connection<I, S, B>(
    name: &'static str,
    builder: &http1::Builder,
    graceful: &GracefulShutdown,
    io: I,
    service: S,
    held: impl Send + 'static,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(listener = name, error = %e, "connection ended with an error");
        }
        drop(held);
    });
}

/// Runs each request so that a client that hangs up does not cancel an execution already
/// under way: the upstream's answer is still stored and a retry with the same key replays it,
/// instead of finding the record abandoned ([design §5](docs/design.md#5-crashes-and-cancellation)).
/// A request runs in its connection's task, and moves to a task of its own only when that
/// connection drops it unfinished ([`Inline`]): most requests finish where they started, with
/// no task to spawn, no wake-up across tasks and no hand-back of the answer. Each request is
/// told the client's address ([`ClientAddr`]).
#[derive(Clone)]
struct Detached<S> {
    service: S,
    /// The client, made once for the connection's requests.
    peer: ClientAddr,
    /// Every request that had to move to a task of its own, so that a shutdown waits for
    /// executions whose clients hung up: their connections are closed, so waiting for
    /// connections alone would drop them with their results unstored, and their keys would
    /// read as outcome unknown.
    tasks: TaskTracker,
}

impl<S, B> tower::Service<http::Request<B>> for Detached<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<idem_http::Body>,
            Error = std::convert::Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<idem_http::Body>;
    type Error = std::convert::Infallible;
    type Future = Inline;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        req.extensions_mut().insert(self.peer.clone());
        Inline {
            run: Some(Box::pin(self.service.call(req))),
            tasks: self.tasks.clone(),
        }
    }
}

/// A request's execution, polled in its connection's task. Dropped before it finished (the
/// client hung up, so hyper dropped the request), it is handed whole to a task of its own on
/// the same thread, tracked by `tasks`, where it runs to its end and its result is stored.
/// A panic in the layer or the proxy answers 500, as a task's would; the record is left to
/// become abandoned.
struct Inline {
    run: Option<Execution>,
    tasks: TaskTracker,
}

/// What the layer answers a request with.
type Answered = Result<http::Response<idem_http::Body>, std::convert::Infallible>;

/// A request's execution under way.
type Execution = std::pin::Pin<Box<dyn Future<Output = Answered> + Send>>;

impl Future for Inline {
    type Output = Answered;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(run) = self.run.as_mut() else {
            return std::task::Poll::Pending;
        };
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.as_mut().poll(cx)));
        let answer = match polled {
            Ok(std::task::Poll::Pending) => return std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(answer)) => answer,
            Err(payload) => {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %why, "a request panicked; answered 500");
                // Its state may be half-changed: dropping it can panic too, which must not
                // take the connection down with it.
                let broken = self.run.take();
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    drop(broken);
                }));
                let mut resp = http::Response::new(idem_http::Body::default());
                *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                return std::task::Poll::Ready(Ok(resp));
            }
        };
        // Finished: nothing to hand on when dropped.
        self.run = None;
        std::task::Poll::Ready(answer)
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        let Some(run) = self.run.take() else {
            return;
        };
        // Within a runtime that is itself being dropped (a serving thread released after the
        // drain's deadline) the task is cancelled at once, as every other task there is; the
        // drain has reported requests still under way by then. Outside any runtime there
        // is nowhere to run it at all.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(async move {
                let _ = run.await;
            });
        } else {
            tracing::warn!(
                "a request whose client hung up was dropped outside a runtime; its key will read as abandoned"
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(run: impl Future<Output = Answered> + Send + 'static, tasks: &TaskTracker) -> Inline {
        Inline {
            run: Some(Box::pin(run)),
            tasks: tasks.clone(),
        }
    }

    #[tokio::test]
    async fn a_request_that_panics_is_answered_500() {
        let tasks = TaskTracker::new();
        let answered = inline(async { panic!("boom") }, &tasks).await;
        let Ok(resp) = answered;
        assert_eq!(resp.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        assert!(tasks.is_empty());
    }

    /// Dropped unfinished (the client hung up), the execution goes on in a tracked task, so
    /// a shutdown that waits for the tracker waits for it; finished, nothing is handed on.
    #[tokio::test]
    async fn an_unfinished_request_dropped_runs_on_in_a_tracked_task() {
        let tasks = TaskTracker::new();
        let (go, gate) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        let mut request = inline(
            async move {
                let _ = gate.await;
                let _ = done_tx.send(());
                Ok(http::Response::new(idem_http::Body::default()))
            },
            &tasks,
        );
        let polled = futures_poll_once(&mut request).await;
        assert!(polled.is_pending());
        drop(request);
        assert_eq!(tasks.len(), 1, "handed to the tracker");
        tasks.close();
        let _ = go.send(());
        tasks.wait().await;
        assert!(done.await.is_ok(), "the execution ran to its end");

        let finished = TaskTracker::new();
        let mut request = inline(
            async { Ok(http::Response::new(idem_http::Body::default())) },
            &finished,
        );
        assert!(futures_poll_once(&mut request).await.is_ready());
        drop(request);
        assert!(finished.is_empty());
    }

    /// Polls `fut` once, from within a task.
    async fn futures_poll_once(fut: &mut Inline) -> std::task::Poll<Answered> {
        std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *fut).poll(cx)))
            .await
    }
}
