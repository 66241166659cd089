//! Connections that go silent: the server stops answering on every open connection and on
//! new ones, the sockets staying open (its host gone without a word, packets dropped); then
//! the network heals for new connections while the old ones stay silent for good (a NAT or
//! a firewall that forgot them). Every operation fails closed at the operation timeout, and
//! the store recovers on new connections by the batch bound: the connections whose
//! operations got no answer are closed, not pooled, and a batch on one gives its batcher's
//! slot back. Without that, TCP would give up on them minutes to hours later. The server is
//! reached through a relay in this process that can silence what it carries. A read its
//! caller dropped while silent closes its connection too. Real server; a schema of its
//! own. Skips without PostgreSQL unless IDEM_REQUIRE_SERVICES=1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoreError,
    StoredResponse,
};
use idem_store_postgres::{PgOptions, PgStore};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const PG: &str = "127.0.0.1:5432";
const OP_TIMEOUT: Duration = Duration::from_millis(500);

/// A TCP relay that can go silent: its open connections, and those made while it is
/// silent, keep both sockets open and pass nothing either way, for good. Once healed, new
/// connections pass again.
struct Relay {
    addr: SocketAddr,
    /// Silences the connections opened since the last [`Relay::silence`].
    silence: Arc<Mutex<watch::Sender<bool>>>,
    silent: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay bind");
        let addr = listener.local_addr().expect("relay address");
        let silence = Arc::new(Mutex::new(watch::channel(false).0));
        let silent = Arc::new(AtomicBool::new(false));
        let (current, now_silent) = (silence.clone(), silent.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut silenced = current
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .subscribe();
                let born_silent = now_silent.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    if born_silent {
                        // Accepted, held open (`client` lives on), and never answered.
                        match std::future::pending::<Infallible>().await {}
                    }
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = async { let _ = silenced.wait_for(|s| *s).await; } => {
                            // Holds both sockets open, and never reads or writes again.
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Relay {
            addr,
            silence,
            silent,
            accept,
        }
    }

    /// Every connection open now, and every one made until [`Relay::heal`], is silent for
    /// good.
    fn silence(&self) {
        self.silent.store(true, Ordering::SeqCst);
        let mut current = self.silence.lock().unwrap_or_else(|e| e.into_inner());
        let _ = current.send(true);
        *current = watch::channel(false).0;
    }

    /// New connections pass again; the silenced ones stay silent.
    fn heal(&self) {
        self.silent.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn request(key: &str) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: Key::new(key).expect("key"),
        fingerprint: Fingerprint::from_bytes([3; 32]),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// Claims and completes `key`: `Ok(true)` once kept.
async fn run_once(store: &PgStore, key: &str) -> Result<bool, StoreError> {
    let req = request(key);
    let (scope, key) = (req.scope.clone(), req.key.clone());
    match store.claim(req).await? {
        Claim::Acquired(lease) => {
            let done = StoredResponse::new(201, "{}");
            store.complete(&scope, &key, lease.token, done).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A store of its own schema, reached through a new relay, with the operation timeout
/// [`OP_TIMEOUT`] and what `tune` sets; `None` (the test skips) without PostgreSQL.
async fn through_a_relay(
    test: &str,
    tune: impl FnOnce(&mut PgOptions),
) -> Option<(Relay, PgStore)> {
    if !idem_conformance::server_reachable(test, "PostgreSQL", PG) {
        return None;
    }
    let relay = Relay::start(PG.parse().expect("address")).await;
    let mut opts =
        PgOptions::from_url(&format!("postgres://postgres@{}/test", relay.addr)).expect("url");
    opts.schema = format!("idem_silent_{:016x}", rand::random::<u64>());
    opts.op_timeout = OP_TIMEOUT;
    tune(&mut opts);
    let store = PgStore::connect(opts).await.expect("connect");
    Some((relay, store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_connections_went_silent_fails_closed_then_recovers_on_new_ones() {
    let test = "a_store_whose_connections_went_silent_fails_closed_then_recovers_on_new_ones";
    // One batch at a time per lane, so one batch on a silent connection holds its lane
    // whole (with two, as by default, two such batches would).
    let Some((relay, store)) = through_a_relay(test, |opts| opts.batches_in_flight = 1).await
    else {
        return;
    };
    // Every pool has a connection open: the shared one (a read), and both batchers'.
    assert!(run_once(&store, "before").await.expect("before"));
    assert!(
        store
            .get(&Scope::anonymous(), &Key::new("before").expect("key"))
            .await
            .expect("read")
            .is_some()
    );

    relay.silence();
    // A claim's batch holds the claim batcher's one slot on its silent connection; a read
    // waits on its own. Each fails closed at the operation timeout.
    let started = Instant::now();
    let during = futures_join(&store).await;
    for (what, r) in &during {
        assert!(
            matches!(r, Err(e) if e.is_unavailable()),
            "{what} while silent: {r:?}"
        );
    }
    assert!(
        // Each caller gives up at the operation timeout, not at the batch bound (5x).
        started.elapsed() < OP_TIMEOUT * 3,
        "failing closed took {:?}",
        started.elapsed()
    );

    // Claims once more while silent: the store's batches and reads keep failing closed.
    for (what, r) in futures_join(&store).await {
        assert!(
            matches!(&r, Err(e) if e.is_unavailable()),
            "{what} while still silent: {r:?}"
        );
    }

    relay.heal();
    // New connections work: the store must be back by the batch bound (five operation
    // timeouts), not when TCP keepalive gives up on the silent ones.
    let deadline = Instant::now() + OP_TIMEOUT * 5 + Duration::from_secs(10);
    let recovered = loop {
        let answer = run_once(&store, &format!("after-{}", rand::random::<u32>())).await;
        if matches!(answer, Ok(true)) {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "no claim was kept through new connections; the last answer: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "silenced; every operation failed closed; a new key was kept again {:?} later",
        recovered - started
    );
    let read = store
        .get(&Scope::anonymous(), &Key::new("before").expect("key"))
        .await;
    assert!(
        matches!(&read, Ok(Some(_))),
        "a read after recovery: {read:?}"
    );
    store.drop_schema().await.expect("drop schema");
}

/// A read whose caller leaves first (a client gone, a deadline of its own) while its
/// connection is silent: the connection is closed as the read is dropped, not returned to
/// the pool, where the next read would find it and wait out its own operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_dropped_by_its_caller_on_a_silent_connection_does_not_pool_it() {
    let test = "a_read_dropped_by_its_caller_on_a_silent_connection_does_not_pool_it";
    let Some((relay, store)) = through_a_relay(test, |_| {}).await else {
        return;
    };
    let (scope, key) = (Scope::anonymous(), Key::new("before").expect("key"));
    assert!(run_once(&store, "before").await.expect("before"));
    // The shared pool's one open connection, idle again after this read.
    assert!(store.get(&scope, &key).await.expect("read").is_some());

    relay.silence();
    let left = tokio::time::timeout(OP_TIMEOUT / 5, store.get(&scope, &key)).await;
    assert!(left.is_err(), "the caller was to leave first: {left:?}");
    relay.heal();

    let started = Instant::now();
    let read = store.get(&scope, &key).await;
    assert!(
        matches!(&read, Ok(Some(_))),
        "the next read, on a new connection: {read:?}"
    );
    assert!(
        started.elapsed() < OP_TIMEOUT,
        "the next read waited {:?}: it was handed the silent connection",
        started.elapsed()
    );
    store.drop_schema().await.expect("drop schema");
}

/// Two claims and a read at once, while the relay is silent.
async fn futures_join(store: &PgStore) -> Vec<(&'static str, Result<(), StoreError>)> {
    let (scope, key) = (Scope::anonymous(), Key::new("before").expect("key"));
    let (a, b, c) = tokio::join!(
        store.claim(request("silent-1")),
        store.claim(request("silent-2")),
        store.get(&scope, &key),
    );
    vec![
        ("a claim", a.map(|_| ())),
        ("another claim", b.map(|_| ())),
        ("a read", c.map(|_| ())),
    ]
}
