//! The floor under `idem serve`'s forwarding path: a reverse proxy built from the same parts
//! (hyper's HTTP/1 server and client, one single-threaded runtime per serving thread,
//! connections handed out by one acceptor) with no idempotency layer, no timeouts and no
//! proxy hygiene beyond dropping the upstream's connection headers.
//! `bench/cpu_per_request.sh` and `bench/gateway_instructions.sh` measure it beside nginx and
//! `idem serve`, so their tables show how much of a request's cost is hyper's, tokio's and the
//! kernel's, and how much idem's. A measuring tool, not a proxy to deploy: it forwards
//! whatever it is sent.
//!
//! Two ways to reach the upstream, the second argument:
//! - `pooled`: hyper-util's pooled client, as `idem serve` uses it. Each pooled connection is
//!   a task of its own, reached over a channel.
//! - `driven`: a pool of hyper's bare connections per thread, each driven by the request that
//!   borrowed it (its response body polls the connection), so no task is woken in between.
//!   It measures what an upstream client of that shape would save before one is built.
//! - `answer`: no upstream at all (UPSTREAM_ADDR is ignored): each request's body is read
//!   whole and the server answers it itself, 201 with the upstream's JSON body. That is the
//!   floor under a replay, which reads the body (to fingerprint it) and answers from memory.
//!
//! ```sh
//! cargo run --release -p idem-gateway --example bare_proxy -- 127.0.0.1:18309 pooled 127.0.0.1:18301 2
//! ```

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, hyper::Error>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, mode, upstream, threads] = args.as_slice() else {
        bail!("usage: bare_proxy LISTEN pooled|driven|answer UPSTREAM_ADDR THREADS");
    };
    let listen: SocketAddr = listen.parse().context("LISTEN")?;
    let upstream: SocketAddr = upstream.parse().context("UPSTREAM_ADDR")?;
    let threads: usize = threads.parse().context("THREADS")?;
    let mode = match mode.as_str() {
        "pooled" => Mode::Pooled,
        "driven" => Mode::Driven,
        "answer" => Mode::Answer,
        other => bail!("unknown mode {other:?}: pooled, driven or answer"),
    };
    let mut senders = Vec::new();
    for i in 0..threads.max(1) {
        let (tx, rx) = mpsc::unbounded_channel::<std::net::TcpStream>();
        senders.push(tx);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("bare-serve-{i}"))
            .spawn(move || runtime.block_on(serve_thread(rx, upstream, mode)))?;
    }
    let acceptor = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    acceptor.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        for n in 0usize.. {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            if senders[n % senders.len()].send(stream.into_std()?).is_err() {
                bail!("a serving thread stopped");
            }
        }
        Ok(())
    })
}

/// How a request is answered: see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pooled,
    Driven,
    Answer,
}

/// The upstream's answer (bench/common.sh's nginx), which `answer` mode sends itself.
const ANSWER: &str = r#"{"charge_id":"ch_1","amount_cents":4900}"#;

/// Serves every connection handed to this thread, forwarding each request to `upstream`.
async fn serve_thread(
    mut accepted: mpsc::UnboundedReceiver<std::net::TcpStream>,
    upstream: SocketAddr,
    mode: Mode,
) {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let pooled: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(http);
    let target: Uri = format!("http://{upstream}/")
        .parse()
        .expect("a socket address makes a URI");
    while let Some(stream) = accepted.recv().await {
        let Ok(stream) = TcpStream::from_std(stream) else {
            continue;
        };
        let pooled = pooled.clone();
        let target = target.clone();
        let service = service_fn(move |mut req: Request<Incoming>| {
            let pooled = pooled.clone();
            let target = target.clone();
            async move {
                if mode == Mode::Answer {
                    let read = req.into_body().collect().await;
                    let (status, body) = match read {
                        Ok(_) => (
                            http::StatusCode::CREATED,
                            Bytes::from_static(ANSWER.as_bytes()),
                        ),
                        Err(e) => (http::StatusCode::BAD_REQUEST, Bytes::from(e.to_string())),
                    };
                    let body = http_body_util::Full::new(body)
                        .map_err(|never| match never {})
                        .boxed_unsync();
                    let mut resp = Response::new(body);
                    *resp.status_mut() = status;
                    resp.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    return Ok::<_, std::convert::Infallible>(resp);
                }
                let mut parts = target.into_parts();
                parts.path_and_query = req.uri().path_and_query().cloned();
                *req.uri_mut() = Uri::from_parts(parts).expect("a path on an authority");
                req.headers_mut().remove(http::header::HOST);
                let resp = if mode == Mode::Driven {
                    // A bare connection sends what it is given: the origin form, and a Host.
                    let host = http::HeaderValue::from_str(&upstream.to_string())
                        .expect("an address is a header value");
                    req.headers_mut().insert(http::header::HOST, host);
                    *req.uri_mut() = req
                        .uri()
                        .path_and_query()
                        .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
                    drive(req, upstream).await
                } else {
                    pooled
                        .request(req)
                        .await
                        .map(|r| r.map(BodyExt::boxed_unsync))
                        .map_err(|e| e.to_string())
                };
                // The upstream's connection headers are its hop's: passed on, nginx's
                // `Connection: close` on every thousandth answer would close the client's
                // connection, a reconnect idem (which strips them) does not pay.
                let resp = resp.map(|mut resp| {
                    resp.headers_mut().remove(http::header::CONNECTION);
                    resp.headers_mut().remove("keep-alive");
                    resp
                });
                Ok::<_, std::convert::Infallible>(resp.unwrap_or_else(|e| {
                    let body = http_body_util::Full::new(Bytes::from(e))
                        .map_err(|never| match never {})
                        .boxed_unsync();
                    let mut resp = Response::new(body);
                    *resp.status_mut() = http::StatusCode::BAD_GATEWAY;
                    resp
                }))
            }
        });
        tokio::spawn(async move {
            let _ = server::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// An upstream connection with the future that drives it.
struct Upstream {
    send: client::SendRequest<Incoming>,
    conn: Pin<Box<client::Connection<TokioIo<TcpStream>, Incoming>>>,
}

thread_local! {
    /// This thread's idle upstream connections.
    static IDLE: RefCell<Vec<Upstream>> = const { RefCell::new(Vec::new()) };
}

/// Sends `req` on an idle connection of this thread's (or a new one), polling the connection
/// from this request's own task until the response body ends.
async fn drive(req: Request<Incoming>, upstream: SocketAddr) -> Result<Response<Body>, String> {
    // An idle connection the upstream closed, or that is not ready for another request, is
    // dropped.
    let mut idle = loop {
        let Some(mut up) = IDLE.with(|idle| idle.borrow_mut().pop()) else {
            break None;
        };
        let ready = poll_fn(|cx| {
            if up.conn.as_mut().poll(cx).is_ready() {
                return Poll::Ready(false);
            }
            up.send.poll_ready(cx).map(|r| r.is_ok())
        })
        .await;
        if ready {
            break Some(up);
        }
    };
    let mut up = match idle.take() {
        Some(up) => up,
        None => {
            let tcp = TcpStream::connect(upstream)
                .await
                .map_err(|e| e.to_string())?;
            tcp.set_nodelay(true).map_err(|e| e.to_string())?;
            let (send, conn) = client::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
            Upstream {
                send,
                conn: Box::pin(conn),
            }
        }
    };
    let mut response = std::pin::pin!(up.send.send_request(req));
    let mut conn_done = false;
    let resp = poll_fn(|cx| {
        if !conn_done && up.conn.as_mut().poll(cx).is_ready() {
            conn_done = true;
        }
        response.as_mut().poll(cx)
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(resp.map(|body| {
        Driven {
            body,
            up: (!conn_done).then_some(up),
        }
        .boxed_unsync()
    }))
}

/// A response body that drives its connection, and gives it back to the thread's pool once
/// the body has ended (a connection whose answer was cut short is dropped).
struct Driven {
    body: Incoming,
    up: Option<Upstream>,
}

impl http_body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        if let Some(up) = self.up.as_mut()
            && up.conn.as_mut().poll(cx).is_ready()
        {
            self.up = None;
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

/// The server drops a body once it has all the bytes its length announced, without polling it
/// for its end: the connection goes back to the pool then, if the body did end.
impl Drop for Driven {
    fn drop(&mut self) {
        if self.body.is_end_stream()
            && let Some(up) = self.up.take()
        {
            IDLE.with(|idle| idle.borrow_mut().push(up));
        }
    }
}
