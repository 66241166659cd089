//! A lossy link: a proxy that, for a share of calls, lets the request through and loses the
//! response on the way back, after the far side acted on it (the seed's "timeout on the way
//! back"). Some calls are reset before they are forwarded, and every call is delayed a little.
//! Seeded, so a run repeats.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;

/// What the link did with one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Forwarded, and the answer delivered.
    Delivered {
        /// The far side's status.
        status: u16,
        /// The far side's body.
        body: String,
        /// Whether it was a replay (`Idempotent-Replayed: true`).
        replayed: bool,
    },
    /// Forwarded; the far side answered; the answer was lost on the way back.
    Lost {
        /// The far side's status.
        status: u16,
        /// The far side's body.
        body: String,
    },
    /// The connection was reset before anything was forwarded.
    Reset,
}

/// One call through the link.
#[derive(Debug, Clone)]
pub struct Event {
    /// The `Idempotency-Key` the call carried, if any.
    pub key: Option<String>,
    /// What happened.
    pub fate: Fate,
}

/// The link's log, in call order.
pub type Log = Arc<Mutex<Vec<Event>>>;

struct Link {
    target: Uri,
    loss: f64,
    rng: Mutex<StdRng>,
    client: Client<HttpConnector, Full<Bytes>>,
    log: Log,
}

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the link dropped the connection")
    }
}

impl std::error::Error for Dropped {}

impl Link {
    fn record(&self, key: Option<String>, fate: Fate) {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Event { key, fate });
    }

    async fn call(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Dropped> {
        let (reset, lose, delay_us) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            (
                rng.random_bool(self.loss / 4.0),
                rng.random_bool(self.loss),
                rng.random_range(0..2000u64),
            )
        };
        tokio::time::sleep(Duration::from_micros(delay_us)).await;
        let key = req
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| k.trim_matches('"').to_owned());
        if reset {
            self.record(key, Fate::Reset);
            return Err(Dropped);
        }
        let (mut parts, body) = req.into_parts();
        let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        parts.uri = format!("{}{pq}", self.target.to_string().trim_end_matches('/'))
            .parse()
            .map_err(|_| Dropped)?;
        parts.headers.remove(http::header::HOST);
        let resp = self
            .client
            .request(Request::from_parts(parts, Full::new(body)))
            .await
            .map_err(|_| Dropped)?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
        let status = parts.status.as_u16();
        let text = String::from_utf8_lossy(&body).into_owned();
        if lose {
            // The far side acted and answered; the caller never hears it.
            self.record(key, Fate::Lost { status, body: text });
            return Err(Dropped);
        }
        let replayed = parts
            .headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        self.record(
            key,
            Fate::Delivered {
                status,
                body: text,
                replayed,
            },
        );
        Ok(Response::from_parts(parts, Full::new(body)))
    }
}

/// Starts a link on `listener` to `target`, losing responses with probability `loss`.
pub fn start(listener: TcpListener, target: SocketAddr, loss: f64, seed: u64) -> Result<Log> {
    let log = Log::default();
    let link = Arc::new(Link {
        target: format!("http://{target}").parse()?,
        loss: loss.clamp(0.0, 1.0),
        rng: Mutex::new(StdRng::seed_from_u64(seed)),
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        log: log.clone(),
    });
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let link = link.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let link = link.clone();
                    async move { link.call(req).await }
                });
                // An error from the service closes the connection with no answer: the loss.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
        Ok::<(), Infallible>(())
    });
    Ok(log)
}
