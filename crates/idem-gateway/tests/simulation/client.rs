//! A client of the gateway: runs its intents one after another, each with one key on every
//! attempt, a timeout on each attempt and retries, as an agent's tool client would; and
//! writes down every answer it got.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use turmoil::net::TcpStream;

use crate::upstream::Intent;

/// Where the gateways listen.
pub(crate) const GATEWAY_PORT: u16 = 8080;

/// Attempts per intent before the client gives up on it.
const MAX_ATTEMPTS: u32 = 8;

/// What came back for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A 2xx: the charge, executed now or replayed.
    Completed { body: Bytes, replayed: bool },
    /// A problem document, by its stable name (`in-flight`, `outcome-unknown`, ...).
    Problem { status: u16, name: String },
    /// Anything else: never expected.
    Unexpected { status: u16, body: String },
    /// No answer: the attempt timed out or its connection failed.
    NoAnswer(String),
}

/// One attempt and its outcome, with the simulated times it was sent and answered.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) client: usize,
    pub(crate) intent: Intent,
    pub(crate) gateway: usize,
    pub(crate) sent_ms: u128,
    pub(crate) received_ms: u128,
    pub(crate) outcome: Outcome,
}

/// What one client does.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) client: usize,
    /// The client's `Authorization` header: its tenant, the gateway's scope.
    pub(crate) tenant: String,
    /// The keys of its intents, in order (a key can come again: the same intent later).
    pub(crate) keys: Vec<String>,
    pub(crate) gateways: usize,
    pub(crate) seed: u64,
}

/// The body of the intent with `key`: the same on every attempt, from every client.
pub(crate) fn body_of(key: &str) -> String {
    format!("{{\"order\":\"{key}\",\"amount_cents\":4900}}")
}

fn now_ms() -> u128 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis()
}

/// Runs `plan`, writing every answer to `log`.
pub(crate) async fn run(plan: Plan, log: Rc<RefCell<Vec<Answer>>>) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ (plan.client as u64).wrapping_mul(0x9E37_79B9));
    for key in &plan.keys {
        let intent = (plan.tenant.clone(), key.clone());
        for _ in 0..MAX_ATTEMPTS {
            let gateway = rng.random_range(0..plan.gateways);
            let timeout = Duration::from_millis(rng.random_range(300..6_000));
            let sent_ms = now_ms();
            let outcome = attempt(gateway, &intent, timeout).await;
            let done = match &outcome {
                Outcome::Completed { .. } | Outcome::Unexpected { .. } => true,
                Outcome::Problem { name, .. } => name == "outcome-unknown",
                Outcome::NoAnswer(_) => false,
            };
            log.borrow_mut().push(Answer {
                client: plan.client,
                intent: intent.clone(),
                gateway,
                sent_ms,
                received_ms: now_ms(),
                outcome,
            });
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..1_500))).await;
        }
    }
    Ok(())
}

/// One request to `gateway-{gateway}` on a new connection, bounded by `timeout`; the
/// connection is dropped when it ends, as a client that gave up hangs up.
pub(crate) async fn attempt(gateway: usize, intent: &Intent, timeout: Duration) -> Outcome {
    let (tenant, key) = intent;
    let host = format!("gateway-{gateway}");
    let exchange = async {
        let stream = TcpStream::connect((host.as_str(), GATEWAY_PORT)).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        let _conn = AbortOnDrop(tokio::task::spawn_local(conn));
        let req = Request::post(format!("http://{host}/v1/charges"))
            .header("host", host.as_str())
            .header("authorization", tenant.as_str())
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body_of(key))))
            .map_err(std::io::Error::other)?;
        let answer = async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let replayed = resp.headers().contains_key("idempotent-replayed");
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, replayed, body))
        }
        .await;
        answer.map_err(std::io::Error::other)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Outcome::NoAnswer("timed out".into()),
        Ok(Err(e)) => Outcome::NoAnswer(e.kind().to_string()),
        Ok(Ok((status, replayed, body))) => classify(status, replayed, body),
    }
}

/// Ends a connection's task when the attempt ends, answered or given up.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn classify(status: StatusCode, replayed: bool, body: Bytes) -> Outcome {
    if status.is_success() {
        return Outcome::Completed { body, replayed };
    }
    let name = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|doc| {
            doc.get("type")?
                .as_str()?
                .strip_prefix("urn:idem:problem:")
                .map(str::to_owned)
        });
    match name {
        Some(name) => Outcome::Problem {
            status: status.as_u16(),
            name,
        },
        None => Outcome::Unexpected {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
        },
    }
}
