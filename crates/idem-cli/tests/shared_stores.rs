//! Many gateways over one shared store, end to end: two real `idem serve` processes on one
//! PostgreSQL (and again on one Redis) in front of one counting upstream, and the store
//! going away and coming back underneath them.
//!
//! The gateways reach the store through a relay in this process, so a test can cut the
//! store off (every connection reset, new ones refused) without stopping the server other
//! tests use. PostgreSQL is run directly and again through a private PgBouncer in transaction
//! and in session mode. Without a server (or pgbouncer) these tests skip, unless
//! IDEM_REQUIRE_SERVICES=1.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_conformance::pgbouncer::{PgBouncer, PoolMode};
use support::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP relay to the store that can be cut and restored.
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay bind");
        let addr = listener.local_addr().expect("relay address");
        let up = Arc::new(AtomicBool::new(true));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (up2, links2) = (up.clone(), links.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    // Down: the connection is closed at once, as by a server that is going away.
                    drop(client);
                    continue;
                }
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                links2.lock().unwrap_or_else(|e| e.into_inner()).push(link);
            }
        });
        Relay {
            addr,
            up,
            links,
            accept,
        }
    }

    /// The store goes away: open connections are cut, new ones reset.
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for link in self
            .links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            link.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// The server at `addr`, or `None` when the test skips (see `server_reachable`).
fn server(test: &str, name: &str, addr: &str) -> Option<SocketAddr> {
    idem_conformance::server_reachable(test, name, addr)
        .then(|| addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}")))
}

/// Two gateways on `store`, one upstream: one key raced from both executes once, replays
/// come from either, a store outage is 503 with no upstream call (but a replay the gateway
/// has cached), and service resumes.
async fn two_gateways_one_store(store: &str) {
    let (up_addr, up) = start_upstream().await;
    let upstream = format!("http://{up_addr}");
    let a = start_gateway_on(&upstream, "", store);
    let b = start_gateway_on(&upstream, "", store);

    // 200 concurrent requests with one key, split across both gateways.
    let Storm { bodies, by_status } = storm(&[a.addr, b.addr], "storm", 200, "300").await;
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        1,
        "upstream executions; answers: {by_status:?}"
    );
    assert_eq!(bodies.len(), 1, "every 201 is the same charge");

    // Replays are served by either instance, byte for byte.
    let first = charge_with(&a, "storm", &[], BODY).await;
    let second = charge_with(&b, "storm", &[], BODY).await;
    assert!(first.replayed() && second.replayed());
    assert_eq!(first.body, second.body);
    assert!(bodies.contains(&first.body));
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

async fn outage_fails_closed_and_recovers(store: &str, relay: &Relay) {
    let (up_addr, up) = start_upstream().await;
    let upstream = format!("http://{up_addr}");
    let a = start_gateway_on(&upstream, "", store);
    let b = start_gateway_on(&upstream, "", store);
    let ok = charge_with(&a, "before", &[], BODY).await;
    assert_eq!(ok.status, 201, "{}", ok.body);

    relay.cut();
    // A completed record the gateway holds in its cache replays without the store: nothing
    // runs. Everything else fails closed, a replay the other gateway never saw included.
    let cached = charge_with(&a, "before", &[], BODY).await;
    assert!(cached.replayed(), "{}", cached.body);
    assert_eq!(cached.body, ok.body);
    for (g, key) in [(&a, "during-a"), (&b, "during-b"), (&b, "before")] {
        let r = charge_with(g, key, &[], BODY).await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (503, "urn:idem:problem:store-unavailable"),
            "{key}: {}",
            r.body
        );
    }
    assert_eq!(
        up.0.load(Ordering::SeqCst),
        1,
        "nothing ran while the store was away"
    );

    relay.restore();
    // Each gateway's store client reconnects on its own schedule.
    let r = until_served(&b, "after").await;
    assert_eq!(r.status, 201, "service did not resume: {}", r.body);
    let again = until_served(&a, "after").await;
    assert!(again.replayed(), "{} {}", again.status, again.body);
    assert_eq!(again.body, r.body);
    let before = charge_with(&b, "before", &[], BODY).await;
    assert!(
        before.replayed(),
        "a record from before the outage is still there"
    );
    assert_eq!(up.0.load(Ordering::SeqCst), 2);
}

/// Sends `key` through `gateway` until the answer is not 503 (or 20 s pass): the store is
/// back, and this gateway has reconnected to it.
async fn until_served(gateway: &Gateway, key: &str) -> Got {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = charge_with(gateway, key, &[], BODY).await;
        if r.status != 503 || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{:016x}", rand::random::<u64>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_postgres() {
    let Some(pg) = server("two_gateways_on_postgres", "PostgreSQL", "127.0.0.1:5432") else {
        return;
    };
    let relay = Relay::start(pg).await;
    let schema = unique("idem_e2e_");
    let store = format!("postgres://postgres@{}/test?schema={schema}", relay.addr);
    two_gateways_one_store(&store).await;
    outage_fails_closed_and_recovers(&store, &relay).await;
    let direct = format!("postgres://postgres@{pg}/test?schema={schema}");
    match idem_store_postgres::PgStore::connect_url(&direct).await {
        Ok(s) => {
            let _ = s.drop_schema().await;
        }
        Err(e) => eprintln!("could not drop {schema}: {e}"),
    }
}

/// The same through a private PgBouncer (the relay between the gateways and it) in `mode`:
/// in transaction mode the store finds the pooler out by itself; in session mode the URL
/// says `pooler=transaction`.
async fn two_gateways_through_pgbouncer(test: &str, mode: PoolMode, params: &str) {
    let bouncer = match PgBouncer::start(mode) {
        Ok(b) => b,
        Err(why) => return idem_conformance::skip(test, &why),
    };
    let Some(pg) = server(test, "PostgreSQL", "127.0.0.1:5432") else {
        return;
    };
    let bounced = format!("127.0.0.1:{}", bouncer.port);
    let relay = Relay::start(bounced.parse().unwrap_or_else(|e| panic!("{e}"))).await;
    let schema = unique("idem_e2e_pgb_");
    let store = format!(
        "postgres://postgres@{}/test?schema={schema}{params}",
        relay.addr
    );
    two_gateways_one_store(&store).await;
    outage_fails_closed_and_recovers(&store, &relay).await;
    let direct = format!("postgres://postgres@{pg}/test?schema={schema}");
    match idem_store_postgres::PgStore::connect_url(&direct).await {
        Ok(s) => {
            let _ = s.drop_schema().await;
        }
        Err(e) => eprintln!("could not drop {schema}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_postgres_through_pgbouncer_in_transaction_mode() {
    two_gateways_through_pgbouncer(
        "two_gateways_on_postgres_through_pgbouncer_in_transaction_mode",
        PoolMode::Transaction,
        "",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_postgres_through_pgbouncer_in_session_mode() {
    two_gateways_through_pgbouncer(
        "two_gateways_on_postgres_through_pgbouncer_in_session_mode",
        PoolMode::Session,
        "&pooler=transaction",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_redis() {
    let Some(redis) = server("two_gateways_on_redis", "Redis", "127.0.0.1:6379") else {
        return;
    };
    let relay = Relay::start(redis).await;
    let prefix = unique("idem-e2e-");
    // The test server runs without persistence, which idem refuses unless told.
    let store = format!(
        "redis://{}/?prefix={prefix}&durability=volatile",
        relay.addr
    );
    two_gateways_one_store(&store).await;
    outage_fails_closed_and_recovers(&store, &relay).await;
    let direct = format!("redis://{redis}/?prefix={prefix}&durability=volatile");
    match idem_store_redis::RedisStore::connect_url(&direct).await {
        Ok(s) => {
            let _ = s.delete_all().await;
        }
        Err(e) => eprintln!("could not delete keys under {prefix}: {e}"),
    }
}

/// The same race on a Redis Cluster (three masters with a replica each, every node with an
/// fsynced AOF): both gateways connect with one `redis+cluster://` URL, and the durable
/// store waits for a replica on each claim and completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_a_redis_cluster() {
    let test = "two_gateways_on_a_redis_cluster";
    let Some(cluster) = tokio::task::spawn_blocking(move || {
        idem_conformance::redis_servers::RedisCluster::start(test)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}")) else {
        return;
    };
    let prefix = unique("idem-e2e-");
    two_gateways_one_store(&cluster.url(&format!("?prefix={prefix}"))).await;
    drop(cluster);
}
