//! Bounded resources: clients that open connections and stall are cut off at the header read
//! timeout, connections past the cap wait to be accepted rather than starve the served ones of
//! file descriptors, and a stalled store answers 503 `store-unavailable` at its operation
//! timeout without executing anything ([design §6](docs/design.md#6-a-store-failure-fails-closed)).

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_store_sqlite::SqliteOptions;
use idem_store_sqlite::testing::WriteLock;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection (whatever it sends first, if anything), or
/// `None` if it is still open after `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<()> {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_stall_in_their_headers_are_cut_at_the_timeout() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway_with(
        &format!("http://{up_addr}"),
        |f| f.timeouts.header_read = Some(Duration::from_secs(1)),
        SqliteOptions::default(),
    )
    .await;
    let mut stalled = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(g.addr).await.unwrap();
        s.write_all(b"POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k")
            .await
            .unwrap();
        stalled.push(s);
    }
    // Served meanwhile.
    let r = charge_with(&g, "real", &[], BODY).await;
    assert_eq!(r.status, 201, "{}", r.body);
    // Each is closed by the gateway, long before the test would give up on it.
    for (i, s) in stalled.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(30)).await.is_some(),
            "stalled connection {i} is still open"
        );
    }
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// Past `max_connections`, a new connection waits to be accepted (in the kernel's queue) until
/// a served one closes; then it is served. The choice is to wait, not to refuse: a client's
/// connect timeout bounds the wait, and a refusal would need a descriptor anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_a_request_waits_for_a_free_slot() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway_with(
        &format!("http://{up_addr}"),
        |f| {
            f.limits.max_connections = Some(4);
            // Long enough that the idle connections keep their slots until dropped.
            f.timeouts.header_read = Some(Duration::from_secs(120));
        },
        SqliteOptions::default(),
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(g.addr).await.unwrap());
    }
    let g_addr = g.addr;
    let mut real = tokio::spawn(async move {
        send(
            g_addr,
            "POST",
            "/v1/charges",
            &[("idempotency-key", "capped")],
            BODY,
        )
        .await
    });
    // Not served while the four hold every slot (a wait that could only make a slow machine
    // pass, never fail).
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut real)
            .await
            .is_err(),
        "a fifth connection was served past a cap of four"
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
    drop(idle.pop());
    let r = tokio::time::timeout(Duration::from_secs(30), real)
        .await
        .expect("still waiting after a slot freed")
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// A store whose writes stall (here another connection holds the file's write lock, with a
/// lock wait far longer than the test; in the field also a slow disk or a frozen file system)
/// answers 503 `store-unavailable` at its operation timeout, and nothing executes; once the
/// lock is released, the same key executes once and then replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_sqlite_store_is_a_prompt_503_and_nothing_runs() {
    let (up_addr, up) = start_upstream().await;
    let options = SqliteOptions {
        busy_timeout: Duration::from_secs(120),
        op_timeout: Duration::from_secs(1),
        ..SqliteOptions::default()
    };
    let g = start_gateway_with(&format!("http://{up_addr}"), |_| {}, options).await;
    let lock = WriteLock::hold(g.db_path()).unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        charge_with(&g, "frozen", &[], BODY),
    )
    .await
    .expect("the request waits on the stalled store");
    assert_eq!(
        (r.status, r.problem_type().as_str()),
        (503, "urn:idem:problem:store-unavailable"),
        "{}",
        r.body
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
    drop(lock);
    let first = charge_with(&g, "frozen", &[], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = charge_with(&g, "frozen", &[], BODY).await;
    assert!(again.replayed(), "{}", again.body);
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// Opens a connection, sends `head` (request line and headers, the blank line included) and
/// then one byte of body a second, for longer than any test waits. Resolves to what the
/// gateway wrote back, or `None` if the connection was still open after 60 s.
fn drip(addr: std::net::SocketAddr, head: String) -> tokio::task::JoinHandle<Option<String>> {
    tokio::spawn(async move {
        let stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (mut rd, mut wr) = stream.into_split();
        wr.write_all(head.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            for _ in 0..300 {
                if wr.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut out))
            .await
            .ok()
            .map(|_| String::from_utf8_lossy(&out).into_owned())
    })
}

fn slow_head(path: &str, key: Option<&str>) -> String {
    let key = key.map_or_else(String::new, |k| format!("Idempotency-Key: {k}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{key}Content-Length: 1000\r\n\r\n"
    )
}

/// Clients that send their headers and then a body one byte a second, on a route that needs
/// no key, hold every connection slot only until `body_read`: the bodies streamed upstream
/// are cut off there, the connections closed, and a request waiting for a slot is served.
/// (Before `body_read` only `timeouts.upstream` ended them, and only when the upstream had not
/// answered yet: an upstream that answers early, or is given long, kept pulling the body for
/// as long as the client dripped it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_passthrough_bodies_free_their_slots_at_body_read() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway_with(
        &format!("http://{up_addr}"),
        |f| {
            f.routes.clear();
            f.limits.max_connections = Some(4);
            f.timeouts.header_read = Some(Duration::from_secs(1));
            // A slow upstream is allowed for; a slow client is not.
            f.timeouts.upstream = Some(Duration::from_secs(120));
            f.timeouts.body_read = Some(Duration::from_secs(2));
        },
        SqliteOptions::default(),
    )
    .await;
    let drips: Vec<_> = (0..4)
        .map(|_| drip(g.addr, slow_head("/v1/charges", None)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let probe = tokio::time::timeout(
        Duration::from_secs(30),
        send(g.addr, "GET", "/v1/read", &[], ""),
    )
    .await
    .expect("the slow bodies still hold every slot");
    assert_eq!(probe.status, 201, "{}", probe.body);
    for (i, d) in drips.into_iter().enumerate() {
        assert!(
            d.await.unwrap().is_some(),
            "slow connection {i} is still open"
        );
    }
    // Only the probe reached the upstream's handler: no dripped body was ever complete.
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// A keyed request whose body does not arrive within `body_read` gets 408 `body-timeout` and
/// its connection is closed; nothing was claimed, so the same key then executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_keyed_body_is_a_408_and_the_key_stays_free() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway_with(
        &format!("http://{up_addr}"),
        |f| f.timeouts.body_read = Some(Duration::from_secs(1)),
        SqliteOptions::default(),
    )
    .await;
    let got = drip(g.addr, slow_head("/v1/charges", Some("slow")))
        .await
        .unwrap()
        .expect("the connection of a slow keyed body is still open");
    let raw = Raw { text: got };
    assert_eq!(
        (raw.status(), raw.problem_type().as_str()),
        (408, "urn:idem:problem:body-timeout"),
        "{}",
        raw.text
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
    let first = charge_with(&g, "slow", &[], BODY).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = charge_with(&g, "slow", &[], BODY).await;
    assert!(again.replayed(), "{}", again.body);
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}
