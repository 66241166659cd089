//! Crash chaos: the real `idem serve` under keyed load, killed with SIGKILL at random moments
//! and restarted on the same store, on SQLite, PostgreSQL (directly and through PgBouncer in
//! transaction mode) and Redis (a private server with
//! `appendonly yes`, `appendfsync always`, which the store accepts without
//! `durability=volatile`) and a Redis Cluster. On Redis, one kill in three is of the Redis
//! server instead, restarted on its AOF: a claim it acknowledged must survive it. On the
//! cluster, it is of a master, whose replica takes over: a claim the store acknowledged must
//! be on the replica. On a private PostgreSQL primary with a synchronous standby, one such
//! kill crashes the primary and promotes the standby, which the gateways follow on a URL
//! naming both.
//!
//! The upstream lives in this process, which is never killed, and notes every execution per
//! key. Clients send each intent with one key and retry across the gateway's deaths until
//! they get a definite answer: the result (executed or replayed) or `outcome-unknown`. At the
//! end, for every key: at most one execution; a result is that execution's, byte for byte,
//! and its record is completed (or, the store's server killed before it stored the result,
//! abandoned, as design §6 says); an unknown outcome's record reads `abandoned` on the admin
//! listener (what `idem inspect` shows); and the key still answers so after the chaos.
//!
//! Each store runs for `IDEM_CHAOS_SECS` seconds (default 20) of kills. These tests are
//! `#[ignore]`d, so `cargo test --workspace` stays fast; `.ci/run` runs them in their own step:
//! `cargo test -p idem-cli --test crash_chaos -- --ignored --test-threads 5`.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use idem_conformance::redis_servers::{Persistence, RedisCluster, RedisServer};
use support::{Gateway, record_of, serve_on_loopback, start_gateway_on};

/// Concurrent clients, each sending one intent after another.
const CLIENTS: usize = 8;
/// How long one intent may take to reach a definite answer: a gateway killed mid-call leaves
/// the key in flight until its lease (2 s in the test configuration) ends, then abandoned.
const INTENT_BOUND: Duration = Duration::from_secs(60);

/// Seconds of kills per store: `IDEM_CHAOS_SECS`, 20 by default.
fn chaos_duration() -> Duration {
    let secs = std::env::var("IDEM_CHAOS_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

/// The upstream's executions: per key, the body of each response it produced.
#[derive(Clone, Default)]
struct Executions(Arc<Mutex<HashMap<String, Vec<String>>>>);

impl Executions {
    fn snapshot(&self) -> HashMap<String, Vec<String>> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// A charge: noted as executed the moment it arrives, answered after a random pause so that
/// kills land between the effect and the stored result as well as elsewhere.
async fn charge(State(ex): State<Executions>, headers: HeaderMap) -> axum::response::Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = {
        let mut map = ex.0.lock().unwrap_or_else(|e| e.into_inner());
        let runs = map.entry(key.clone()).or_default();
        let body =
            serde_json::json!({ "charge_id": format!("ch_{key}_{}", runs.len() + 1) }).to_string();
        runs.push(body.clone());
        body
    };
    tokio::time::sleep(Duration::from_millis(rand::random_range(0..40))).await;
    (
        axum::http::StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

async fn start_counting_upstream() -> (SocketAddr, Executions) {
    let ex = Executions::default();
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .with_state(ex.clone());
    (serve_on_loopback(app).await, ex)
}

/// How an intent ended.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// The result, executed or replayed: its body.
    Result(String),
    /// 409 `outcome-unknown`: the record is abandoned until an operator resolves it.
    Unknown,
}

/// One POST of the intent, or `None` when the gateway could not be reached or died mid-call.
async fn attempt(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    key: &str,
    body: &str,
) -> Option<(u16, String)> {
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body.to_owned())))
        .ok()?;
    let call = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, String::from_utf8_lossy(&bytes).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .ok()
        .flatten()
}

fn problem_name(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    v["type"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("urn:idem:problem:")
        .to_owned()
}

/// Sends one intent until it gets a definite answer, across the gateway's deaths; `Err` with
/// the last thing seen when [`INTENT_BOUND`] passes first.
async fn run_intent(addr: &Mutex<SocketAddr>, key: &str, body: &str) -> Result<Answer, String> {
    let client = support::client();
    let started = Instant::now();
    let mut last = String::from("nothing");
    while started.elapsed() < INTENT_BOUND {
        let at = *addr.lock().unwrap_or_else(|e| e.into_inner());
        match attempt(&client, at, key, body).await {
            Some((201, body)) => return Ok(Answer::Result(body)),
            Some((409, body)) if problem_name(&body) == "outcome-unknown" => {
                return Ok(Answer::Unknown);
            }
            // In flight (the killed gateway's lease has not ended), the store not ready:
            // the answers that say "ask again".
            Some((status, body)) => last = format!("{status} {body}"),
            None => last = "no answer".into(),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(last)
}

/// What a chaos run saw.
#[derive(Debug, Default)]
struct Tally {
    /// Gateways killed.
    kills: u32,
    /// Store servers killed (the private Redis).
    server_kills: u32,
    intents: HashMap<String, Answer>,
}

/// The store under test: how gateways reach it.
struct Chaos<'a> {
    store: &'a str,
    upstream: String,
}

impl Chaos<'_> {
    async fn start(&self) -> Gateway {
        let (upstream, store) = (self.upstream.clone(), self.store.to_owned());
        tokio::task::spawn_blocking(move || start_gateway_on(&upstream, "", &store))
            .await
            .unwrap_or_else(|e| panic!("starting idem serve: {e}"))
    }
}

/// Keyed load from [`CLIENTS`] clients while the gateway on `store` is killed and restarted
/// A store server the chaos crashes now and then, besides the gateways.
trait StoreServer {
    /// Crashes it and brings the store back (the same server on its own files, or a
    /// standby promoted); `false` when it has nothing more to crash.
    fn crash(&mut self) -> bool;
}

/// for [`chaos_duration`], then [`verify`] on the gateway left running. With `server`, one
/// kill in three is of the store's server instead ([`StoreServer::crash`]).
async fn chaos(store: &str, name: &str, mut server: Option<&mut dyn StoreServer>) {
    let (up_addr, executions) = start_counting_upstream().await;
    let setup = Chaos {
        store,
        upstream: format!("http://{up_addr}"),
    };
    let mut gateway = setup.start().await;
    let addr = Arc::new(Mutex::new(gateway.addr));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU32::new(0));
    let answers: Arc<Mutex<HashMap<String, Answer>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let run = format!("{:08x}", rand::random::<u32>());

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (addr, stop, next, answers, failures, run) = (
            addr.clone(),
            stop.clone(),
            next.clone(),
            answers.clone(),
            failures.clone(),
            run.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let key = format!("chaos-{run}-{n}");
                match run_intent(&addr, &key, &intent_body(&key)).await {
                    Ok(answer) => {
                        answers
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key, answer);
                    }
                    Err(last) => failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("{key}: no definite answer; last {last}")),
                }
            }
        }));
    }

    let mut tally = Tally::default();
    let deadline = Instant::now() + chaos_duration();
    // Which kill of every three is the server's: a phase drawn once, not a draw per kill. A
    // server whose crash takes seconds (a cluster's failover) leaves room for few kills, and
    // a draw per kill once made all five of a run the server's, so the gateway was never
    // killed (seen in a clean-clone CI run).
    let server_turn = rand::random_range(0..3u32);
    let mut round = 0u32;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..1000))).await;
        round += 1;
        if let Some(server) = server.as_deref_mut()
            && round % 3 == server_turn
            && tokio::task::block_in_place(|| server.crash())
        {
            tally.server_kills += 1;
            continue;
        }
        // SIGKILL: no shutdown, no flush, no release of what it holds.
        let _ = gateway.child.kill();
        let _ = gateway.child.wait();
        tally.kills += 1;
        gateway = setup.start().await;
        *addr.lock().unwrap_or_else(|e| e.into_inner()) = gateway.addr;
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap_or_else(|e| panic!("client task: {e}"));
    }
    let failures = failures.lock().map(|f| f.clone()).unwrap_or_default();
    assert!(failures.is_empty(), "{name}: {failures:#?}");
    tally.intents = answers.lock().map(|a| a.clone()).unwrap_or_default();
    verify(name, &gateway, &tally, &executions.snapshot()).await;
}

/// The one request body of the intent with this key.
fn intent_body(key: &str) -> String {
    serde_json::json!({ "intent": key }).to_string()
}

/// Every key executed at most once; a result is the execution's and its record holds it; an
/// unknown outcome is an abandoned record; after the chaos each key answers as its record
/// says. The one allowed gap: a result whose completion was lost with the store's server
/// reads as abandoned ([design §6](docs/design.md#6-a-store-failure-fails-closed)).
async fn verify(
    name: &str,
    gateway: &Gateway,
    tally: &Tally,
    executions: &HashMap<String, Vec<String>>,
) {
    let (mut executed, mut unknown, mut unknown_never_ran, mut completions_lost) = (0, 0, 0, 0);
    for (key, runs) in executions {
        assert!(
            runs.len() <= 1,
            "{name}: {key} executed {} times: {runs:?}",
            runs.len()
        );
    }
    let client = support::client();
    for (key, answer) in &tally.intents {
        let runs = executions.get(key).map_or(&[][..], Vec::as_slice);
        let record = record_of(gateway.admin, key).await;
        let state = record.json()["state"].as_str().unwrap_or("").to_owned();
        match answer {
            Answer::Result(body) => {
                executed += 1;
                assert_eq!(
                    runs,
                    std::slice::from_ref(body),
                    "{name}: {key} answered a result that is not its one execution's"
                );
                if state == "abandoned" && tally.server_kills > 0 {
                    completions_lost += 1;
                } else {
                    assert_eq!(state, "completed", "{name}: {key}: {}", record.body);
                }
            }
            Answer::Unknown => {
                unknown += 1;
                unknown_never_ran += usize::from(runs.is_empty());
                assert_eq!(state, "abandoned", "{name}: {key}: {}", record.body);
            }
        }
        // The answer survives the chaos: asked once more, the key answers as its record says.
        let again = attempt(&client, gateway.addr, key, &intent_body(key))
            .await
            .unwrap_or_else(|| panic!("{name}: {key}: the last gateway did not answer"));
        match (answer, state.as_str()) {
            (Answer::Result(body), "completed") => {
                assert_eq!(again, (201, body.clone()), "{name}: {key}");
            }
            _ => assert_eq!(
                (again.0, problem_name(&again.1)),
                (409, "outcome-unknown".into()),
                "{name}: {key}"
            ),
        }
    }
    eprintln!(
        "crash chaos on {name}: {} gateway kills, {} server kills, {} intents: {executed} \
         results ({completions_lost} of them not stored, the server killed), {unknown} unknown \
         outcomes ({unknown_never_ran} never reached the upstream); {} executions",
        tally.kills,
        tally.server_kills,
        tally.intents.len(),
        executions.values().map(Vec::len).sum::<usize>()
    );
    assert!(tally.kills > 0 && executed > 0, "{name}: no chaos happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crash chaos: run by .ci/run's own step"]
async fn sigkill_chaos_on_sqlite() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = format!("sqlite:{}", dir.path().join("idem.db").display());
    chaos(&store, "SQLite", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crash chaos: run by .ci/run's own step"]
async fn sigkill_chaos_on_postgres() {
    let test = "sigkill_chaos_on_postgres";
    if !idem_conformance::server_reachable(test, "PostgreSQL", "127.0.0.1:5432") {
        return;
    }
    let schema = format!("idem_chaos_{:016x}", rand::random::<u64>());
    let store = format!("postgres://postgres@127.0.0.1:5432/test?schema={schema}");
    chaos(&store, "PostgreSQL", None).await;
    match idem_store_postgres::PgStore::connect_url(&store).await {
        Ok(s) => {
            let _ = s.drop_schema().await;
        }
        Err(e) => eprintln!("could not drop {schema}: {e}"),
    }
}

/// The same through a private PgBouncer in transaction mode, which the store finds out by
/// itself: every gateway's connections share its few server connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crash chaos: run by .ci/run's own step"]
async fn sigkill_chaos_on_postgres_through_pgbouncer() {
    let test = "sigkill_chaos_on_postgres_through_pgbouncer";
    let bouncer = match idem_conformance::pgbouncer::PgBouncer::start(
        idem_conformance::pgbouncer::PoolMode::Transaction,
    ) {
        Ok(b) => b,
        Err(why) => return idem_conformance::skip(test, &why),
    };
    let schema = format!("idem_chaos_pgb_{:016x}", rand::random::<u64>());
    let store = format!(
        "postgres://postgres@127.0.0.1:{}/test?schema={schema}",
        bouncer.port
    );
    chaos(&store, "PostgreSQL through PgBouncer", None).await;
    match idem_store_postgres::PgStore::connect_url(&store).await {
        Ok(s) => {
            let _ = s.drop_schema().await;
        }
        Err(e) => eprintln!("could not drop {schema}: {e}"),
    }
}

/// SIGKILL, then the same server again on the same files: what it acknowledged must be in
/// its AOF.
impl StoreServer for RedisServer {
    fn crash(&mut self) -> bool {
        self.restart();
        true
    }
}

/// SIGKILL of a master while its replica lags 200 ms behind; the replica takes over its
/// slots, and the old master comes back as a replica: what the store acknowledged must have
/// reached the replica (the store waits for one on each claim and completion).
impl StoreServer for RedisCluster {
    fn crash(&mut self) -> bool {
        self.fail_over_a_master(Duration::from_millis(200));
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crash chaos: run by .ci/run's own step"]
async fn sigkill_chaos_on_redis_with_aof() {
    let test = "sigkill_chaos_on_redis_with_aof";
    let Some(mut redis) = RedisServer::start(test, Persistence::AofAlways) else {
        return;
    };
    // No durability=volatile: the store refuses a server that could lose a claim.
    let store = format!("{}?prefix=idem-chaos", redis.url());
    chaos(&store, "Redis (AOF, appendfsync always)", Some(&mut redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crash chaos: run by .ci/run's own step"]
async fn sigkill_chaos_on_a_redis_cluster() {
    let test = "sigkill_chaos_on_a_redis_cluster";
    let Some(mut cluster) = tokio::task::block_in_place(|| RedisCluster::start(test)) else {
        return;
    };
    let store = cluster.url("?prefix=idem-chaos");
    chaos(
        &store,
        "Redis Cluster (3 masters, 3 replicas, AOF)",
        Some(&mut cluster),
    )
    .await;
}

/// A private PostgreSQL primary and synchronous standby: the one server crash is of the
/// primary (every process SIGKILLed), and the standby is promoted; the gateways, on a URL
/// naming both, follow it.
struct Failover {
    cluster: idem_conformance::pgcluster::Cluster,
    done: bool,
}

impl StoreServer for Failover {
    fn crash(&mut self) -> bool {
        if self.done {
            return false;
        }
        self.done = true;
        let crashed = self.cluster.crash_primary();
        crashed
            .and_then(|()| self.cluster.promote())
            .unwrap_or_else(|e| panic!("failover: {e}"));
        true
    }
}

/// Crash chaos across a failover: gateways on a multi-host URL, killed at random as above,
/// and the PostgreSQL primary crashed once under them with a synchronous standby promoted.
/// No key may execute twice: every claim a gateway acted on was on the standby. The URL says
/// `durability=volatile` only because gateways restarted after the promotion meet a primary
/// with no standby of its own, which the store otherwise refuses
/// (`crates/idem-store-postgres/tests/failover.rs` checks the refusal and counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "crash chaos: run by .ci/run's own step"]
async fn sigkill_chaos_on_postgres_across_a_failover() {
    use idem_conformance::pgcluster::{Cluster, Replication};
    let test = "sigkill_chaos_on_postgres_across_a_failover";
    let cluster = match tokio::task::block_in_place(|| Cluster::start(Replication::Synchronous)) {
        Ok(c) => c,
        Err(why) => return idem_conformance::skip(test, &why),
    };
    let store = format!("{}&schema=idem_chaos&durability=volatile", cluster.url());
    let mut failover = Failover {
        cluster,
        done: false,
    };
    chaos(
        &store,
        "PostgreSQL across a failover (synchronous standby)",
        Some(&mut failover),
    )
    .await;
    assert!(failover.done, "the primary was never crashed");
}
