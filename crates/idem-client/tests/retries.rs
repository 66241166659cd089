//! The client against a local flaky server that drops connections, hangs, and answers 429
//! with Retry-After, 503, 409, 400 and 422: the server must see the identical key on every
//! attempt, and attempts and waits must follow the policy. Waits are recorded, not slept.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_client::{
    Attempt, CallError, Category, HttpTransport, Intent, RetryPolicy, ToolClient, ToolPolicy,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy)]
enum Act {
    /// Read the request, then close the connection without a word.
    Drop,
    /// Read the request, then say nothing until the client times out.
    Hang,
    /// Answer with this status and, maybe, Retry-After seconds.
    Reply(u16, Option<u64>),
}

/// What the server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    header_key: Option<String>,
    body_key: Option<String>,
}

#[derive(Clone, Default)]
struct Flaky {
    script: Arc<Mutex<VecDeque<Act>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Flaky {
    async fn start(script: &[Act]) -> (SocketAddr, Flaky) {
        let flaky = Flaky::default();
        flaky
            .script
            .lock()
            .map(|mut s| s.extend(script))
            .expect("script lock");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted server");
        let addr = listener.local_addr().expect("scripted server address");
        let f = flaky.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(f.clone().serve(conn));
            }
        });
        (addr, flaky)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    async fn serve(self, mut conn: TcpStream) {
        let mut buf = Vec::new();
        loop {
            // Read one request: headers, then content-length bytes of body.
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    l.strip_prefix(&format!("{name}:"))
                        .map(|v| v.trim().to_owned())
                })
            };
            let len: usize = header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                let mut chunk = [0u8; 4096];
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body: Value =
                serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or_default();
            buf.drain(..head_end + len);
            self.seen
                .lock()
                .map(|mut s| {
                    s.push(Seen {
                        header_key: header("idempotency-key"),
                        body_key: body["idempotency_key"].as_str().map(str::to_owned),
                    })
                })
                .expect("seen lock");
            let act = self
                .script
                .lock()
                .ok()
                .and_then(|mut s| s.pop_front())
                .unwrap_or(Act::Reply(200, None));
            match act {
                Act::Drop => return,
                Act::Hang => {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return;
                }
                Act::Reply(status, retry_after) => {
                    let body = format!(r#"{{"status":{status}}}"#);
                    let ra = retry_after
                        .map(|s| format!("retry-after: {s}\r\n"))
                        .unwrap_or_default();
                    let resp = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{ra}\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

type Log = Arc<Mutex<Vec<Attempt>>>;

fn client(addr: SocketAddr, retry: RetryPolicy) -> (ToolClient<HttpTransport>, Log) {
    let transport = HttpTransport::new(format!("http://{addr}/tools"), Duration::from_millis(300))
        .expect("HTTP transport");
    let log: Log = Arc::default();
    let l = log.clone();
    let c = ToolClient::new(transport)
        .retry_policy(retry)
        .on_attempt(move |a| l.lock().map(|mut v| v.push(a.clone())).unwrap_or_default())
        // Record the waits instead of sleeping through them.
        .sleeper(|_| async {});
    (c, log)
}

fn intent(policy: ToolPolicy) -> Intent {
    Intent {
        scope: "turn_9f3a".into(),
        tool: "charge_card".into(),
        args: json!({"customer": "cus_8g2k", "amount_cents": 4900}),
        ordinal: 0,
        policy,
    }
}

fn generous() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 10,
        base: Duration::from_millis(100),
        cap: Duration::from_secs(1),
        max_total: Duration::from_secs(60),
    }
}

fn attempts(log: &Log) -> Vec<Attempt> {
    log.lock().map(|v| v.clone()).unwrap_or_default()
}

#[tokio::test]
async fn an_effect_sends_the_same_key_through_every_kind_of_failure() {
    let script = [
        Act::Drop,
        Act::Hang,
        Act::Reply(429, Some(2)),
        Act::Reply(503, None),
        Act::Reply(409, Some(1)),
        Act::Reply(200, None),
    ];
    let (addr, server) = Flaky::start(&script).await;
    let (c, log) = client(addr, generous());
    let it = intent(ToolPolicy::effect(Category::Money));
    let want = c.key_for(&it).unwrap().expect("no key");
    assert_eq!(
        want.as_str(),
        "turn_9f3a-charge_card-dmg4hof5wdajf4ppiwf4n53dsjb5peby",
        "the published vector"
    );
    let resp = c.call(&it).await.unwrap();
    assert_eq!(resp.status, 200);

    let seen = server.seen();
    assert_eq!(seen.len(), 6);
    // The header carries the key as an sf-string; the arguments go as given.
    let quoted = format!("\"{}\"", want.as_str());
    for s in &seen {
        assert_eq!(s.header_key.as_deref(), Some(quoted.as_str()), "{seen:?}");
        assert_eq!(s.body_key, None, "{seen:?}");
    }
    let log = attempts(&log);
    assert_eq!(log.len(), 6);
    let p = generous();
    for (i, a) in log.iter().enumerate() {
        assert_eq!(a.number as usize, i + 1);
        assert_eq!(a.key.as_ref(), Some(&want));
        match (i, a.retry_in) {
            (2, Some(d)) => assert!(d >= Duration::from_secs(2), "Retry-After ignored: {d:?}"),
            (4, Some(d)) => assert!(d >= Duration::from_secs(1), "Retry-After ignored: {d:?}"),
            (5, None) => {}
            (_, Some(d)) => assert!(
                d <= p.backoff_bound(a.number),
                "attempt {}: {d:?}",
                a.number
            ),
            (_, None) => panic!("attempt {} was not followed by a retry", a.number),
        }
    }
}

#[tokio::test]
async fn the_bare_header_and_the_key_in_the_arguments_are_the_callers_choice() {
    let (addr, server) = Flaky::start(&[Act::Reply(200, None)]).await;
    let transport = HttpTransport::new(format!("http://{addr}/tools"), Duration::from_millis(300))
        .expect("HTTP transport")
        .bare_key_header();
    let c = ToolClient::new(transport).key_in_args(true);
    let it = intent(ToolPolicy::effect(Category::Money));
    let want = c.key_for(&it).unwrap().expect("no key");
    assert_eq!(c.call(&it).await.unwrap().status, 200);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header_key.as_deref(), Some(want.as_str()));
    assert_eq!(seen[0].body_key.as_deref(), Some(want.as_str()));
}

#[tokio::test]
async fn refusals_end_the_call_at_once() {
    for status in [400u16, 422, 404] {
        let (addr, server) = Flaky::start(&[Act::Reply(status, None)]).await;
        let (c, log) = client(addr, generous());
        match c.call(&intent(ToolPolicy::effect(Category::Money))).await {
            Err(CallError::Refused(r)) => assert_eq!(r.status, status),
            other => panic!("{status}: {other:?}"),
        }
        assert_eq!(server.seen().len(), 1, "{status} was retried");
        assert_eq!(attempts(&log).len(), 1);
    }
}

#[tokio::test]
async fn an_unkeyed_effect_is_not_retried_once_it_may_have_been_sent() {
    let it = intent(ToolPolicy::effect(Category::External));
    for act in [Act::Drop, Act::Hang] {
        let (addr, server) = Flaky::start(&[act]).await;
        let (c, _) = client(addr, generous());
        match c.call_with_key(&it, None).await {
            Err(CallError::OutcomeUnknown(_)) => {}
            other => panic!("{act:?}: {other:?}"),
        }
        assert_eq!(server.seen().len(), 1, "{act:?} was retried without a key");
        assert!(server.seen()[0].header_key.is_none());
    }
    // A 503 without a key: it may have run; not retried. A 429 says it did not: retried.
    let (addr, server) = Flaky::start(&[Act::Reply(503, None)]).await;
    let (c, _) = client(addr, generous());
    assert!(matches!(
        c.call_with_key(&it, None).await,
        Err(CallError::GaveUp { attempts: 1, .. })
    ));
    assert_eq!(server.seen().len(), 1);
    let (addr, server) = Flaky::start(&[Act::Reply(429, Some(1))]).await;
    let (c, _) = client(addr, generous());
    assert!(c.call_with_key(&it, None).await.is_ok());
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn reads_retry_freely_and_carry_no_key() {
    let (addr, server) = Flaky::start(&[
        Act::Drop,
        Act::Hang,
        Act::Reply(500, None),
        Act::Reply(503, None),
    ])
    .await;
    let (c, log) = client(addr, generous());
    let it = Intent {
        tool: "get_balance".into(),
        ..intent(ToolPolicy::read())
    };
    assert_eq!(c.call(&it).await.map(|r| r.status).ok(), Some(200));
    assert_eq!(server.seen().len(), 5);
    assert!(
        server
            .seen()
            .iter()
            .all(|s| s.header_key.is_none() && s.body_key.is_none())
    );
    assert_eq!(attempts(&log).len(), 5);
}

#[tokio::test]
async fn attempts_and_total_time_are_bounded() {
    let (addr, server) = Flaky::start(&[Act::Reply(503, None); 10]).await;
    let retry = RetryPolicy {
        max_attempts: 3,
        ..generous()
    };
    let (c, log) = client(addr, retry);
    match c.call(&intent(ToolPolicy::effect(Category::Money))).await {
        Err(CallError::GaveUp {
            attempts: 3,
            response: Some(r),
            ..
        }) => assert_eq!(r.status, 503),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.seen().len(), 3);
    assert_eq!(attempts(&log).last().and_then(|a| a.retry_in), None);

    // A Retry-After past the total bound ends the call instead of waiting for it.
    let (addr, server) = Flaky::start(&[Act::Reply(429, Some(120))]).await;
    let (c, _) = client(addr, generous());
    assert!(matches!(
        c.call(&intent(ToolPolicy::effect(Category::Money))).await,
        Err(CallError::GaveUp { attempts: 1, .. })
    ));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_retried_even_without_a_key() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let retry = RetryPolicy {
        max_attempts: 4,
        ..generous()
    };
    let (c, log) = client(addr, retry);
    let it = intent(ToolPolicy::effect(Category::Money));
    match c.call_with_key(&it, None).await {
        Err(CallError::GaveUp {
            attempts: 4,
            response: None,
            last,
        }) => assert!(last.contains("not sent"), "{last}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(attempts(&log).len(), 4);
}

#[tokio::test]
async fn an_argument_jcs_cannot_carry_is_an_error_before_anything_is_sent() {
    let (addr, server) = Flaky::start(&[]).await;
    let (c, _) = client(addr, generous());
    let it = Intent {
        args: json!({"order_id": 1_850_026_147_163_422_721u64}),
        ..intent(ToolPolicy::effect(Category::Money))
    };
    assert!(matches!(c.call(&it).await, Err(CallError::Derive(_))));
    assert!(server.seen().is_empty());
}
