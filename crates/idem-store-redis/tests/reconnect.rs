//! A connection that sat idle while its server restarted: the first read on it still
//! answers (a read is repeated once on the reconnected connection), so an operator's lookup
//! does not fail because no request had used that connection since. Runs a private
//! `redis-server` on a free port; skips without one unless IDEM_REQUIRE_SERVICES=1.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_core::{Key, Scope, Store};
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

#[tokio::test]
async fn a_read_on_a_connection_idle_through_a_restart_answers() {
    let test = "a_read_on_a_connection_idle_through_a_restart_answers";
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let server = match Server::start(port) {
        Ok(s) => s,
        Err(e) => {
            idem_conformance::skip(test, &format!("cannot run redis-server: {e}"));
            return;
        }
    };
    let mut opts = RedisOptions::from_url(&format!("redis://127.0.0.1:{port}")).expect("url");
    opts.durability = Durability::Volatile;
    let store = RedisStore::connect(opts).await.expect("connect");
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
