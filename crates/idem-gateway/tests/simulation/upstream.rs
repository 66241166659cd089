//! The counting upstream: a charge API that is not idempotent at all. Each request it reads
//! whole is one execution, numbered in the order they happen; it remembers, per caller and
//! key, how many executions there were and the first one's answer.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use turmoil::net::TcpListener;

/// Who asked and with which key: the upstream sees the gateway's forwarded `Authorization`
/// and `Idempotency-Key` headers.
pub(crate) type Intent = (String, String);

/// What the upstream did, shared with the checks (the simulation runs on one thread).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Executions so far, of every intent.
    pub(crate) executions: u64,
    /// Per intent: how many executions, and the body of the first one's answer.
    pub(crate) by_intent: BTreeMap<Intent, (u32, Bytes)>,
}

/// Where the upstream listens.
pub(crate) const PORT: u16 = 80;

/// The upstream's software: serves until the simulation ends. An execution waits
/// `delay(n)` (n its number) before answering, so some answers come after the gateway's
/// upstream timeout.
pub(crate) async fn serve(
    ledger: Rc<RefCell<Ledger>>,
    delay: fn(u64) -> Duration,
) -> turmoil::Result {
    let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let ledger = ledger.clone();
        tokio::task::spawn_local(async move {
            let svc = service_fn(move |req| execute(ledger.clone(), delay, req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn execute(
    ledger: Rc<RefCell<Ledger>>,
    delay: fn(u64) -> Duration,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let intent = (header("authorization"), header("idempotency-key"));
    // Only a request read whole is executed: one cut off on the way is not.
    if req.into_body().collect().await.is_err() {
        return Ok(status(StatusCode::BAD_REQUEST));
    }
    let (n, answer) = {
        let mut ledger = ledger.borrow_mut();
        ledger.executions += 1;
        let n = ledger.executions;
        let answer = Bytes::from(format!("{{\"charge\":\"ch_{n}\"}}"));
        let entry = ledger
            .by_intent
            .entry(intent)
            .or_insert((0, answer.clone()));
        entry.0 += 1;
        (n, answer)
    };
    tokio::time::sleep(delay(n)).await;
    let mut resp = Response::new(Full::new(answer));
    *resp.status_mut() = StatusCode::CREATED;
    Ok(resp)
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = code;
    resp
}
