//! Blocking calls on Redis, whose round trips the calling thread makes over a connection lent
//! to it for each claim and each completion (src/driven.rs): one execution among racing
//! threads, no connection held per call under way, a lease kept while no lent connection
//! runs under a long function, and calls that succeed after the server restarted under idle
//! connections; the same for the HTTP core's requests. Each test runs a private
//! `redis-server`; skipped without one unless IDEM_REQUIRE_SERVICES=1.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use idem_conformance::redis_servers::{Persistence, RedisServer};
use idem_embed::http::{Admitted, Begun, HttpFront, config_of};
use idem_embed::{PriorKind, Saved, Started, Store, ToolPolicy};
use serde_json::json;

mod support;
use support::{policy, returned};

/// A private server that keeps every write on disk (so a record outlives a restart), and a
/// store on it.
fn server(test: &str) -> Option<(RedisServer, Store)> {
    let server = RedisServer::start(test, Persistence::AofAlways)?;
    let store = Store::open(&server.url()).expect("opens");
    Some((server, store))
}

fn begin(store: &Store, key: &str, policy: &ToolPolicy) -> Started {
    store
        .begin(key, "charge", &json!({"amount": 1}), None, policy)
        .expect("the store answers")
}

/// Sixteen threads start one key at once: one runs it, each other waits for its result and
/// replays it. Each thread draws its own handle from the pool, so the claims race over
/// sixteen connections, and the waiters are woken across them.
#[test]
fn racing_threads_run_a_key_once_and_the_rest_replay_it() {
    let test = "racing_threads_run_a_key_once_and_the_rest_replay_it";
    let Some((_server, store)) = server(test) else {
        return;
    };
    for round in 0..5 {
        let key = format!("race-{round}");
        let start = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (store, key, start) = (store.clone(), key.clone(), start.clone());
                std::thread::spawn(move || {
                    let policy = policy(
                        Duration::from_secs(5),
                        Some(Duration::from_secs(10)),
                        "reject",
                    );
                    start.wait();
                    match begin(&store, &key, &policy) {
                        Started::Execute(ticket) => {
                            std::thread::sleep(Duration::from_millis(20));
                            let saved = ticket
                                .finish(returned(r#"{"ran":true}"#))
                                .expect("finishes");
                            assert_eq!(saved, Saved::Stored);
                            None
                        }
                        Started::Prior(p) => Some(p),
                    }
                })
            })
            .collect();
        let answers: Vec<_> = threads
            .into_iter()
            .map(|t| t.join().expect("no thread panicked"))
            .collect();
        let priors: Vec<_> = answers.iter().flatten().collect();
        assert_eq!(
            priors.len(),
            15,
            "round {round}: exactly one thread ran the key"
        );
        for p in priors {
            assert_eq!(p.kind, PriorKind::Replayed, "round {round}: {p:?}");
            assert_eq!(p.body.as_deref(), Some(br#"{"ran":true}"#.as_slice()));
        }
    }
}

/// Forty calls under way at once from one thread (each claimed, none finished yet) hold no
/// connection each: a handle is lent for a claim and for a completion, not across the
/// function, so the server sees the store's shared connection and the one handle this thread
/// used (its claims went over a connection of its own), not forty, and not one.
#[test]
fn calls_under_way_hold_no_connection_each() {
    let test = "calls_under_way_hold_no_connection_each";
    let Some((server, store)) = server(test) else {
        return;
    };
    let policy = policy(Duration::from_secs(30), None, "reject");
    let tickets: Vec<_> = (0..40)
        .map(|i| match begin(&store, &format!("open-{i}"), &policy) {
            Started::Execute(t) => t,
            Started::Prior(p) => panic!("a new key runs: {p:?}"),
        })
        .collect();
    // redis-cli's own, the store's shared connection, and this thread's.
    let clients = server.cli(&["client", "list"]).lines().count();
    assert_eq!(clients, 3, "connections with 40 calls under way");
    for t in tickets {
        assert_eq!(t.finish(returned("1")).expect("finishes"), Saved::Stored);
    }
}

/// No connection runs while the function does, for three leases: the heartbeat,
/// on the shared runtime, keeps the key, so a duplicate meanwhile finds it in flight (under
/// `retry`, a lapsed lease would let it take the key over), and the result is stored.
#[test]
fn the_lease_is_kept_while_the_function_outlives_it() {
    let test = "the_lease_is_kept_while_the_function_outlives_it";
    let Some((_server, store)) = server(test) else {
        return;
    };
    let lease = Duration::from_secs(1);
    let Started::Execute(ticket) = begin(&store, "long", &policy(lease, None, "retry")) else {
        panic!("the first call runs");
    };
    for _ in 0..3 {
        std::thread::sleep(lease);
        match begin(&store, "long", &policy(lease, None, "retry")) {
            Started::Prior(p) => assert_eq!(p.kind, PriorKind::InFlight, "{p:?}"),
            Started::Execute(_) => panic!("a duplicate took the key over from a live function"),
        }
    }
    assert_eq!(
        ticket.finish(returned("1")).expect("finishes"),
        Saved::Stored
    );
    let Started::Prior(p) = begin(&store, "long", &policy(lease, None, "retry")) else {
        panic!("a replay");
    };
    assert_eq!((p.kind, p.attempts), (PriorKind::Replayed, 1));
}

/// The server restarts while the pool's connections sit idle: between two calls, and inside a
/// call, between its claim and its completion. The next claim still succeeds, as on a
/// connection the shared runtime drives (idem-store-redis's tests/reconnect.rs): a claim is
/// never repeated, so it must not meet the dead connection (without the pool's settling
/// turns, it does, and this fails). The completion succeeds too (the engine would also
/// repeat it while the store is unavailable, fenced by its token).
#[test]
fn calls_succeed_after_the_server_restarted_under_an_idle_connection() {
    let test = "calls_succeed_after_the_server_restarted_under_an_idle_connection";
    let Some((mut server, store)) = server(test) else {
        return;
    };
    let policy = policy(Duration::from_secs(5), None, "reject");
    for round in 0..3 {
        let Started::Execute(ticket) = begin(&store, &format!("before-{round}"), &policy) else {
            panic!("a new key runs");
        };
        assert_eq!(
            ticket.finish(returned("1")).expect("finishes"),
            Saved::Stored
        );

        server.restart();
        std::thread::sleep(Duration::from_millis(200));
        let Started::Execute(ticket) = begin(&store, &format!("after-{round}"), &policy) else {
            panic!("a new key runs after the restart");
        };

        server.restart();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            ticket.finish(returned("2")).expect("finishes"),
            Saved::Stored,
            "round {round}: the completion after a restart under the call"
        );
    }
}

/// A keyed request through the HTTP core, its handler counting runs: racing threads run it
/// once and the rest replay it; a request claimed before a restart stores its response after
/// it; and the first request after a restart runs (it fails without the pool's settling).
#[test]
fn http_requests_run_once_and_finish_across_a_restart() {
    let test = "http_requests_run_once_and_finish_across_a_restart";
    let Some((mut server, _store)) = server(test) else {
        return;
    };
    let config = "anonymous = \"allow\"\n[[routes]]\nmethod = \"POST\"\npath = \"/v1/charges\"\nwait = \"10s\"\n";
    let (config, _) = config_of(Some(config), None).expect("a valid configuration");
    let front = Arc::new(HttpFront::new(config, &server.url()).expect("opens"));
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let request = |front: &HttpFront, key: &str, pause: &mut dyn FnMut()| {
        let headers = [
            ("idempotency-key".to_owned(), key.as_bytes().to_vec()),
            ("content-type".to_owned(), b"application/json".to_vec()),
        ];
        let Admitted::Keyed(keyed) = front.admit("POST", "/v1/charges", &headers) else {
            panic!("a keyed request");
        };
        match front.begin(keyed, br#"{"amount":1}"#) {
            Begun::Execute(exe) => {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                pause();
                let json = [("content-type".to_owned(), b"application/json".to_vec())];
                exe.finish(201, &json, br#"{"id":"ch_1"}"#.to_vec())
            }
            Begun::Reply(reply) => reply,
        }
    };

    let start = Arc::new(Barrier::new(8));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (front, start) = (front.clone(), start.clone());
            let request = &request;
            s.spawn(move || {
                start.wait();
                let reply = request(&front, "http-race", &mut || {
                    std::thread::sleep(Duration::from_millis(20));
                });
                assert_eq!(
                    (reply.status, reply.body.as_slice()),
                    (201, &br#"{"id":"ch_1"}"#[..])
                );
            });
        }
    });
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one run among eight"
    );

    let reply = request(&front, "http-restart", &mut || {
        server.restart();
        std::thread::sleep(Duration::from_millis(200));
    });
    assert_eq!(reply.status, 201, "{reply:?}");
    let replayed = request(&front, "http-restart", &mut || {
        panic!("a replay runs nothing")
    });
    assert_eq!(
        replayed.body, br#"{"id":"ch_1"}"#,
        "the response stored after the restart"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);

    // A claim is not repeated by the engine, as a completion is: it must not meet the
    // connection the restart closed while its handle sat idle in the pool.
    server.restart();
    std::thread::sleep(Duration::from_millis(200));
    let after = request(&front, "http-after", &mut || {});
    assert_eq!(
        after.status, 201,
        "the first request after a restart: {after:?}"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
}
