//! A server that restarted: a connection that sat idle through it, and the scripts it lost.
//! On RESP3 (idem's default) the
//! connection manager hears the server close it and reconnects at once, so even a write
//! on it succeeds afterwards; on RESP2 (`protocol=resp2`, for servers before Redis 6) it
//! learns only when a call fails, and a read is then repeated once. A script the server no
//! longer holds (`NOSCRIPT`) is loaded again and its call sent once more. Runs a private
//! `redis-server` on a free port; skips without one unless IDEM_REQUIRE_SERVICES=1.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_core::{AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store};
use idem_store_redis::{Durability, RedisOptions, RedisStore};

/// A throwaway server without persistence; killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(port: u16) -> std::io::Result<Server> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let server = Server { child, port };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(std::io::Error::other("redis-server did not come up"))
    }

    fn restart(mut self) -> Server {
        let _ = self.child.kill();
        let _ = self.child.wait();
        Server::start(self.port).unwrap_or_else(|e| panic!("restarting redis-server: {e}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A private server and a store connected to it with `url_params`; `None` to skip.
async fn connected(test: &str, url_params: &str) -> Option<(Server, RedisStore)> {
    let port = free_port();
    let server = match Server::start(port) {
        Ok(s) => s,
        Err(e) => {
            idem_conformance::skip(test, &format!("cannot run redis-server: {e}"));
            return None;
        }
    };
    let url = format!("redis://127.0.0.1:{port}/{url_params}");
    let mut opts = RedisOptions::from_url(&url).expect("url");
    opts.durability = Durability::Volatile;
    let store = RedisStore::connect(opts).await.expect("connect");
    Some((server, store))
}

fn claim_request(key: &Key) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes([3; 32]),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(60),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_resp3_a_write_on_a_connection_idle_through_a_restart_succeeds() {
    let test = "on_resp3_a_write_on_a_connection_idle_through_a_restart_succeeds";
    let Some((server, store)) = connected(test, "").await else {
        return;
    };
    let key = Key::new("idle-w1").expect("key");
    assert_eq!(
        store.get(&Scope::anonymous(), &key).await.expect("get"),
        None
    );

    // The runtime keeps running through the restart and a moment of idleness after it, as
    // a serving thread's does.
    let _server = tokio::task::spawn_blocking(|| server.restart())
        .await
        .expect("restart");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A claim is never repeated by the store; it succeeds because the connection was
    // already replaced when the server closed it.
    let claim = store
        .claim(claim_request(&key))
        .await
        .expect("the first write after the restart");
    assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
}

#[tokio::test]
async fn on_resp2_a_read_on_a_connection_idle_through_a_restart_is_repeated() {
    let test = "on_resp2_a_read_on_a_connection_idle_through_a_restart_is_repeated";
    let Some((server, store)) = connected(test, "?protocol=resp2").await else {
        return;
    };
    let key = Key::new("idle-k1").expect("key");
    assert_eq!(
        store.get(&Scope::anonymous(), &key).await.expect("get"),
        None
    );

    let _server = server.restart();
    assert_eq!(
        store
            .get(&Scope::anonymous(), &key)
            .await
            .expect("the first read after the restart"),
        None
    );
}

/// Each script the store calls is sent by its hash; a server that lost them (a restart, a
/// replica promoted before it ran them, `SCRIPT FLUSH`) answers `NOSCRIPT`, and the store loads
/// the script and sends the call again. The fingerprint is all spaces and zeros: the complete
/// script's one-string reply puts it last because its bytes may hold the separator.
#[tokio::test]
async fn scripts_the_server_lost_are_loaded_again() {
    let test = "scripts_the_server_lost_are_loaded_again";
    let Some((server, store)) = connected(test, "").await else {
        return;
    };
    let flush = || {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).expect("client");
        let mut con = client.get_connection().expect("connection");
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query::<()>(&mut con)
            .expect("SCRIPT FLUSH");
    };
    let key = Key::new("flushed-1").expect("key");
    let mut fingerprint = [b' '; 32];
    fingerprint[..8].fill(0);
    let mut request = claim_request(&key);
    request.fingerprint = Fingerprint::from_bytes(fingerprint);

    flush();
    let Claim::Acquired(lease) = store.claim(request.clone()).await.expect("claim") else {
        panic!("a fresh key is acquired");
    };
    flush();
    let completed = store
        .complete(
            &Scope::anonymous(),
            &key,
            lease.token,
            idem_conformance::response("charged"),
        )
        .await
        .expect("complete");
    assert_eq!(completed.fingerprint, request.fingerprint);
    assert_eq!(completed.attempts, 1);
    flush();
    let read = store
        .get(&Scope::anonymous(), &key)
        .await
        .expect("get")
        .expect("the record");
    assert!(read.completed_at.is_some(), "{read:?}");
    assert_eq!(read, completed);
}
