//! Serving connections on one single-threaded runtime per thread (`threads` in the
//! configuration), each with an upstream pool of its own.
//!
//! Why: on a work-stealing runtime a request hops between worker threads (the connection's
//! task, the request's detached task, the pooled upstream connection's task each wake
//! wherever a worker is free), and idle workers spin looking for work. Measured on
//! `idem serve` with the memory store, that cost a third of the gateway's CPU per new key
//! (docs/benchmarks.md, "Issue 16, third pass"). Here a connection is handed to one thread
//! when it is accepted and every task it spawns stays there: the connection, the request's
//! execution (detached into a task of its own only when its client hangs up), its lease
//! heartbeat, and the upstream connection it borrows from that
//! thread's pool. The store's records, the completed-record cache and the connection cap are
//! shared; a store whose connection a task drives gives each thread a connection of its own
//! (`Store::for_this_runtime`, opened by the thread's preparation in `server.rs`).
//!
//! One acceptor (on the caller's runtime) hands each connection to the thread with the
//! fewest open, so load spreads evenly whatever the clients' addresses; `SO_REUSEPORT` would
//! also let a second gateway started by mistake on the same port share it silently.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot, watch};
use tokio_util::task::TaskTracker;

use crate::server::serve_connection;

/// A connection accepted on the caller's runtime, on its way to a serving thread.
struct Accepted {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    /// The connection cap's slot, held until the connection closes.
    slot: OwnedSemaphorePermit,
}

/// One serving thread, as the acceptor sees it.
struct Thread {
    connections: mpsc::UnboundedSender<Accepted>,
    /// Connections handed to it and not yet closed; [`GONE`] once it stopped receiving.
    open: Arc<AtomicUsize>,
    /// Answers once the thread has drained: `true` if every connection finished within the
    /// shutdown timeout.
    drained: oneshot::Receiver<bool>,
    handle: std::thread::JoinHandle<()>,
}

/// The `open` count of a thread that no longer receives connections (its runtime panicked):
/// never the least loaded.
const GONE: usize = usize::MAX;

/// How long a serving thread's runtime may take, once released, to drop what it still runs
/// (a detached execution past the drain, a blocking store read).
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// The serving threads.
pub(crate) struct Threads {
    threads: Vec<Thread>,
    /// Where the search for the least loaded thread starts, so ties rotate.
    next: usize,
    /// Set once every thread has drained. Until then each keeps its runtime running: a shared
    /// store's connection opened from a serving thread is driven by that thread's runtime,
    /// and the other threads may still be using it.
    release: watch::Sender<bool>,
    drain: Duration,
}

impl Threads {
    /// Starts one thread per entry of `prepare`. Each thread first runs its entry on its own
    /// runtime, which makes the services it serves connections with (one per peer), so that
    /// what they open there (a store connection of the thread's own,
    /// [`Store::for_this_runtime`](idem_core::Store::for_this_runtime)) is driven by that
    /// thread. Returns once every thread is ready, or the first preparation's error, with
    /// every thread stopped. When the acceptor stops ([`Threads::drain`]), each thread stops
    /// reading new requests and gives the requests under way `drain` to finish.
    pub(crate) async fn start<P, F, M, S, B>(
        prepare: Vec<P>,
        builder: &http1::Builder,
        drain: Duration,
    ) -> Result<Self>
    where
        P: FnOnce() -> F + Send + 'static,
        F: Future<Output = Result<M>>,
        M: Fn(SocketAddr) -> S,
        S: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
        S::Future: Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (release, released) = watch::channel(false);
        let mut started = Threads {
            threads: Vec::with_capacity(prepare.len()),
            next: 0,
            release,
            drain,
        };
        let mut readiness = Vec::with_capacity(prepare.len());
        // Starts serving thread `i`: its runtime runs `prepare`, says through the returned
        // receiver whether that worked, then serves what it is handed until `drain`, and
        // keeps running until `released`.
        let spawn = |i: usize, prepare: P, mut released: watch::Receiver<bool>| {
            // Built here, so a failure is the caller's error at startup, not a dead thread.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start a serving thread's runtime")?;
            let (connections, accepted) = mpsc::unbounded_channel();
            let (ready, is_ready) = oneshot::channel::<Result<()>>();
            let (done, drained) = oneshot::channel();
            let open = Arc::new(AtomicUsize::new(0));
            let serving = Serving {
                builder: builder.clone(),
                open: open.clone(),
                drain,
            };
            let handle = std::thread::Builder::new()
                .name(format!("idem-serve-{i}"))
                .spawn(move || {
                    runtime.block_on(async {
                        let make_service = match prepare().await {
                            Ok(m) => m,
                            Err(e) => {
                                let _ = ready.send(Err(e));
                                return;
                            }
                        };
                        let _ = ready.send(Ok(()));
                        let finished = serving.run(accepted, make_service).await;
                        let _ = done.send(finished);
                        // An error: the acceptor is gone, so nobody is left to wait for.
                        let _ = released.wait_for(|r| *r).await;
                    });
                    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
                })
                .context("cannot start a serving thread")?;
            let thread = Thread {
                connections,
                open,
                drained,
                handle,
            };
            Ok((thread, is_ready))
        };
        for (i, prepare) in prepare.into_iter().enumerate() {
            match spawn(i, prepare, released.clone()) {
                Ok((thread, is_ready)) => {
                    started.threads.push(thread);
                    readiness.push(is_ready);
                }
                Err(e) => {
                    started.drain(&TaskTracker::new()).await;
                    return Err(e);
                }
            }
        }
        for (i, is_ready) in readiness.into_iter().enumerate() {
            let failed = match is_ready.await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.context(format!("serving thread {i} could not start")),
                Err(_) => anyhow::anyhow!("serving thread {i} stopped while starting"),
            };
            started.drain(&TaskTracker::new()).await;
            return Err(failed);
        }
        Ok(started)
    }

    /// Hands a connection to the thread with the fewest open. A connection that cannot be
    /// moved off the acceptor's runtime, or that no thread is left to take, is closed and
    /// logged.
    pub(crate) fn dispatch(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        slot: OwnedSemaphorePermit,
    ) {
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, %peer, "cannot hand the connection to a serving thread; closed");
                return;
            }
        };
        let mut accepted = Accepted { stream, peer, slot };
        let n = self.threads.len();
        loop {
            let pick = (0..n)
                .map(|i| (self.next + i) % n)
                .min_by_key(|&i| self.threads[i].open.load(Ordering::Relaxed))
                .filter(|&i| self.threads[i].open.load(Ordering::Relaxed) != GONE);
            let Some(pick) = pick else {
                tracing::error!(%peer, "no serving thread is left; connection closed");
                return;
            };
            self.next = (pick + 1) % n;
            let thread = &self.threads[pick];
            thread.open.fetch_add(1, Ordering::Relaxed);
            match thread.connections.send(accepted) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => {
                    // Only a thread whose runtime panicked stops receiving: never again.
                    tracing::error!(
                        thread = pick,
                        "a serving thread is gone; its connections go to the others"
                    );
                    thread.open.store(GONE, Ordering::Relaxed);
                    accepted = back;
                }
            }
        }
    }

    /// Stops handing out connections, lets every thread drain at once, waits for `detached`
    /// (the executions whose clients hung up, moved to tasks of their own) within the same
    /// shutdown timeout, then stops and joins the threads. `false` if some requests were
    /// still under way when the timeout ran out (or a thread could not say).
    pub(crate) async fn drain(self, detached: &TaskTracker) -> bool {
        let Threads {
            threads, release, ..
        } = self;
        let deadline = tokio::time::Instant::now() + self.drain;
        let mut waiting = Vec::with_capacity(threads.len());
        let mut handles = Vec::with_capacity(threads.len());
        for thread in threads {
            drop(thread.connections);
            waiting.push(thread.drained);
            handles.push(thread.handle);
        }
        // Each thread bounds its own drain; the margin only guards against one that cannot
        // answer at all.
        let all = tokio::time::timeout(self.drain + RUNTIME_SHUTDOWN, async {
            let mut all = true;
            for drained in waiting {
                all &= drained.await.unwrap_or(false);
            }
            all
        })
        .await
        .unwrap_or(false);
        // The threads' runtimes still run these until released.
        detached.close();
        let all = tokio::time::timeout_at(deadline, detached.wait())
            .await
            .is_ok()
            && all;
        let _ = release.send(true);
        let joined = tokio::task::spawn_blocking(move || {
            for handle in handles {
                if handle.join().is_err() {
                    tracing::error!("a serving thread panicked");
                }
            }
        });
        let _ = joined.await;
        all
    }
}

/// One of a thread's open connections: the count goes down when it is dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a serving thread runs.
struct Serving {
    builder: http1::Builder,
    open: Arc<AtomicUsize>,
    drain: Duration,
}

impl Serving {
    /// Serves each connection handed over until the acceptor hangs up, then shuts them down
    /// gracefully; `true` if they all finished within the timeout.
    async fn run<M, S, B>(
        self,
        mut accepted: mpsc::UnboundedReceiver<Accepted>,
        make_service: M,
    ) -> bool
    where
        M: Fn(SocketAddr) -> S,
        S: hyper::service::HttpService<Incoming, ResBody = B> + Send + 'static,
        S::Future: Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let graceful = GracefulShutdown::new();
        while let Some(Accepted { stream, peer, slot }) = accepted.recv().await {
            // Counted open until the connection closes, however it ends.
            let held = (slot, Open(self.open.clone()));
            // Registers the socket with this thread's reactor.
            match TcpStream::from_std(stream) {
                Ok(stream) => serve_connection(
                    "proxy",
                    &self.builder,
                    &graceful,
                    stream,
                    make_service(peer),
                    held,
                ),
                Err(e) => tracing::warn!(error = %e, %peer, "cannot serve the connection; closed"),
            }
        }
        tokio::time::timeout(self.drain, graceful.shutdown())
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::convert::Infallible;

    use http_body_util::{BodyExt, Empty, Full};
    use hyper::client::conn::http1 as client;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;
    use tokio::sync::Semaphore;

    use super::*;

    /// Answers with the name of the thread that ran the request, after `delay`; counts the
    /// requests it has begun, so a test can wait until they are under way.
    #[derive(Clone)]
    struct ThreadNamer {
        delay: Duration,
        started: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl hyper::service::Service<http::Request<Incoming>> for ThreadNamer {
        type Response = http::Response<Full<bytes::Bytes>>;
        type Error = Infallible;
        type Future =
            std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn call(&self, _req: http::Request<Incoming>) -> Self::Future {
            let delay = self.delay;
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                let name = std::thread::current().name().unwrap_or("?").to_owned();
                Ok(http::Response::new(Full::new(bytes::Bytes::from(name))))
            })
        }
    }

    struct Harness {
        addr: SocketAddr,
        stop: oneshot::Sender<()>,
        done: tokio::task::JoinHandle<bool>,
        started: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Harness {
        /// Returns once `n` requests have reached the service (not a guess at how long
        /// that takes on a loaded machine).
        async fn until_started(&self, n: usize) {
            while self.started.load(std::sync::atomic::Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// `threads` serving threads behind a loopback acceptor, as `serve` runs them.
    async fn start(threads: usize, delay: Duration, drain: Duration) -> Harness {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let prepare = (0..threads)
            .map(|_| {
                let started = started.clone();
                move || async move {
                    Ok(move |_peer| ThreadNamer {
                        delay,
                        started: started.clone(),
                    })
                }
            })
            .collect();
        let mut serving = Threads::start(prepare, &http1::Builder::new(), drain)
            .await
            .expect("threads start");
        let (stop, mut stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(100));
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let (stream, peer) = accepted.expect("accept");
                        let slot = slots.clone().try_acquire_owned().expect("slot");
                        serving.dispatch(stream, peer, slot);
                    }
                    _ = &mut stopped => break,
                }
            }
            serving.drain(&TaskTracker::new()).await
        });
        Harness {
            addr,
            stop,
            done,
            started,
        }
    }

    async fn connect(addr: SocketAddr) -> client::SendRequest<Empty<bytes::Bytes>> {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (send, conn) = client::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        send
    }

    async fn ask(send: &mut client::SendRequest<Empty<bytes::Bytes>>) -> String {
        let resp = send
            .send_request(http::Request::new(Empty::new()))
            .await
            .expect("answer");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8(body.to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn connections_spread_evenly_and_stay_on_their_thread() {
        let h = start(3, Duration::ZERO, Duration::from_secs(5)).await;
        let mut per_thread = BTreeMap::<String, usize>::new();
        let mut conns = Vec::new();
        for _ in 0..6 {
            let mut send = connect(h.addr).await;
            let first = ask(&mut send).await;
            // Every request on a connection runs on the thread it was handed to.
            for _ in 0..3 {
                assert_eq!(ask(&mut send).await, first);
            }
            *per_thread.entry(first).or_default() += 1;
            conns.push(send);
        }
        let expected: BTreeMap<String, usize> =
            (0..3).map(|i| (format!("idem-serve-{i}"), 2)).collect();
        assert_eq!(per_thread, expected);
        drop(conns);
        let _ = h.stop.send(());
        assert!(h.done.await.expect("acceptor"));
    }

    #[tokio::test]
    async fn each_thread_prepares_on_its_own_runtime_and_a_failure_stops_them_all() {
        // What a thread prepares is made on that thread (a store connection it will drive).
        let (seen, mut names) = mpsc::unbounded_channel();
        let prepare = (0..3)
            .map(|_| {
                let seen = seen.clone();
                move || async move {
                    let name = std::thread::current().name().map(str::to_owned);
                    let _ = seen.send(name);
                    Ok(|_peer| ThreadNamer {
                        delay: Duration::ZERO,
                        started: Arc::default(),
                    })
                }
            })
            .collect::<Vec<_>>();
        let threads = Threads::start(prepare, &http1::Builder::new(), Duration::from_secs(1))
            .await
            .expect("threads start");
        let mut prepared = Vec::new();
        for _ in 0..3 {
            prepared.push(names.recv().await.flatten().expect("a named thread"));
        }
        prepared.sort();
        assert_eq!(prepared, ["idem-serve-0", "idem-serve-1", "idem-serve-2"]);
        assert!(threads.drain(&TaskTracker::new()).await);

        // One thread cannot prepare (its store is down): start fails with its error, and
        // the threads that did start are stopped and joined before it returns.
        // Each thread's services hold `alive` until the thread ends.
        let alive = Arc::new(());
        let prepare = (0..3)
            .map(|i| {
                let alive = alive.clone();
                move || async move {
                    if i == 1 {
                        anyhow::bail!("the store is down");
                    }
                    Ok(move |_peer| {
                        let _held = &alive;
                        ThreadNamer {
                            delay: Duration::ZERO,
                            started: Arc::default(),
                        }
                    })
                }
            })
            .collect::<Vec<_>>();
        let began = std::time::Instant::now();
        let Err(e) = Threads::start(prepare, &http1::Builder::new(), Duration::from_secs(5)).await
        else {
            panic!("a thread that cannot prepare fails the start");
        };
        assert_eq!(
            format!("{e:#}"),
            "serving thread 1 could not start: the store is down"
        );
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "no drain to wait out"
        );
        assert_eq!(Arc::strong_count(&alive), 1, "every thread has ended");
    }

    #[tokio::test]
    async fn shutdown_lets_requests_under_way_finish_within_the_timeout() {
        let h = start(2, Duration::from_millis(300), Duration::from_secs(5)).await;
        let mut send = connect(h.addr).await;
        let answer = tokio::spawn(async move { ask(&mut send).await });
        h.until_started(1).await;
        let _ = h.stop.send(());
        assert!(answer.await.expect("request").starts_with("idem-serve-"));
        assert!(h.done.await.expect("acceptor"), "drained in time");

        // Requests that outlive the timeout on every thread: the threads drain at once, so
        // shutdown takes the timeout, not the timeout once per thread (4 × 500 ms); and the
        // drain says it ran out.
        let h = start(4, Duration::from_secs(10), Duration::from_millis(500)).await;
        let mut pending = Vec::new();
        for _ in 0..4 {
            let mut send = connect(h.addr).await;
            pending.push(tokio::spawn(async move { ask(&mut send).await }));
        }
        h.until_started(4).await;
        let began = std::time::Instant::now();
        let _ = h.stop.send(());
        assert!(!h.done.await.expect("acceptor"), "reported as not drained");
        let took = began.elapsed();
        assert!(
            took < Duration::from_millis(1_500),
            "shutdown took {took:?}"
        );
        for request in pending {
            assert!(request.await.is_err(), "cut off, not answered");
        }
    }
}
