//! Private Redis servers for the tests that need a server of their own: one that can be
//! restarted or filled with other keys, or a Redis Cluster (3 masters, 3 replicas) on
//! loopback ports, each killed when dropped. The shared server on 6379 stays as it is.
//!
//! Each returns `None` (the test [`skip`](crate::skip)s) when `redis-server` or `redis-cli`
//! cannot be run, and under `IDEM_REQUIRE_SERVICES=1` fails instead.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How a private server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing on disk: a store refuses it unless the URL says `durability=volatile`.
    None,
    /// An append-only file fsynced on every write: what a durable store requires.
    AofAlways,
}

/// One `redis-server` on a loopback port, in a directory of its own.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

/// A port on 127.0.0.1 free now, whose cluster bus port (+10000) is free too.
fn free_port_pair() -> u16 {
    for _ in 0..200 {
        let port = 20_000 + rand::random::<u16>() % 30_000;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free pair of loopback ports")
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "idem-{name}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("creating {}: {e}", dir.display());
    }
    dir
}

/// Waits until something listens on `port`; fails early if `child` (the server meant to)
/// has exited.
fn wait_listening(port: u16, mut child: Option<&mut Child>) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            return Err(std::io::Error::other(format!(
                "redis-server on 127.0.0.1:{port} exited at start ({status})"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(std::io::Error::other(format!(
        "redis-server did not listen on 127.0.0.1:{port}"
    )))
}

impl RedisServer {
    fn spawn(port: u16, dir: &Path, args: &[String]) -> std::io::Result<Child> {
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--dir")
            .arg(dir)
            .args(["--save", ""])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// A server on a free pair of ports (the port and its cluster bus, +10,000). A port seen
    /// free can be taken before the server binds it (tests start servers in parallel), and
    /// the server then exits at once: it is started again on another pair, up to 5 times.
    fn launch(name: &str, args: Vec<String>) -> std::io::Result<RedisServer> {
        let mut last = None;
        for _ in 0..5 {
            let port = free_port_pair();
            let dir = scratch_dir(name);
            let child = Self::spawn(port, &dir, &args)?;
            let mut server = RedisServer {
                child: Some(child),
                port,
                dir,
                args: args.clone(),
            };
            match wait_listening(port, server.child.as_mut()) {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("redis-server was not started")))
    }

    /// A server of its own; `None` (skipped) when `redis-server` cannot run.
    pub fn start(test: &str, persistence: Persistence) -> Option<RedisServer> {
        let args = match persistence {
            Persistence::None => vec!["--appendonly".into(), "no".into()],
            Persistence::AofAlways => vec![
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "always".into(),
            ],
        };
        match Self::launch("redis", args) {
            Ok(s) => Some(s),
            Err(e) => {
                crate::skip(test, &format!("cannot run redis-server: {e}"));
                None
            }
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL: what it had not written to its append-only file is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Killed if running, then the same server again on the same files and port.
    pub fn restart(&mut self) {
        self.kill();
        match Self::spawn(self.port, &self.dir, &self.args) {
            Ok(c) => self.child = Some(c),
            Err(e) => panic!("restarting redis-server: {e}"),
        }
        if let Err(e) = wait_listening(self.port, self.child.as_mut()) {
            panic!("{e}");
        }
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns what it printed.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    match Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => panic!("redis-cli: {e}"),
    }
}

fn signal(pid: u32, sig: &str) {
    match Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
    {
        Ok(s) if s.success() => {}
        other => panic!("kill -{sig} {pid}: {other:?}"),
    }
}

/// Writes 16 MB to a key the master on `port` owns (a `{filler}` key: found by asking the
/// node, which answers MOVED for the others).
fn fill(port: u16) {
    let value = "x".repeat(1 << 20);
    let Some(key) = (0..1000)
        .map(|i| format!("filler-{i}"))
        .find(|k| !cli(port, &["set", k, "x"]).contains("MOVED"))
    else {
        panic!("no filler key lands on {port}")
    };
    // In RESP over a socket of its own: 1 MB does not fit on a command line.
    let command = format!(
        "*3\r\n$6\r\nAPPEND\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
        key.len(),
        value.len()
    );
    let sent = TcpStream::connect(("127.0.0.1", port)).and_then(|mut con| {
        for _ in 0..16 {
            con.write_all(command.as_bytes())?;
        }
        // Sixteen integer replies (":<length>\r\n").
        let mut replies = 0;
        let mut buf = [0u8; 1024];
        while replies < 16 {
            let n = con.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::other("closed"));
            }
            replies += buf[..n].iter().filter(|b| **b == b'\n').count();
        }
        Ok(())
    });
    if let Err(e) = sent {
        panic!("filling {port}: {e}");
    }
}

/// A Redis Cluster of three masters, each with one replica, on loopback ports; every node
/// keeps an append-only file fsynced on every write, and a node is judged failed after
/// [`RedisCluster::NODE_TIMEOUT_MS`], when its replica takes over.
#[derive(Debug)]
pub struct RedisCluster {
    /// Masters first (as created), then replicas; which is which changes with a failover.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// How long a master may be silent before its replica is promoted.
    pub const NODE_TIMEOUT_MS: u64 = 1000;

    /// Starts six nodes and joins them; `None` (skipped) when `redis-server` or `redis-cli`
    /// cannot run.
    pub fn start(test: &str) -> Option<RedisCluster> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let args = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-node-timeout".into(),
                Self::NODE_TIMEOUT_MS.to_string(),
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "always".into(),
                // A replica syncs at once (the default waits 5 s for others to share the
                // transfer); until it has, it cannot be promoted.
                "--repl-diskless-sync-delay".into(),
                "0".into(),
                // DEBUG SLEEP, for a replica that lags (fail_over_a_master).
                "--enable-debug-command".into(),
                "local".into(),
            ];
            match RedisServer::launch("redis-cluster", args) {
                Ok(s) => nodes.push(s),
                Err(e) => {
                    crate::skip(test, &format!("cannot run redis-server: {e}"));
                    return None;
                }
            }
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match created {
            Ok(s) if s.success() => {}
            other => {
                crate::skip(test, &format!("redis-cli --cluster create: {other:?}"));
                return None;
            }
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30));
        Some(cluster)
    }

    /// `redis+cluster://` with every node, then `params` (`?prefix=...`).
    pub fn url(&self, params: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}/{params}", hosts.join(","))
    }

    /// Waits until every running node says `cluster_state:ok` and every running replica's
    /// link to its master is up (it holds a copy, and can be promoted), or panics after
    /// `limit`.
    pub fn wait_until_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let running: Vec<&RedisServer> =
                self.nodes.iter().filter(|n| n.child.is_some()).collect();
            let ok = running.iter().all(|n| {
                let replication = n.cli(&["info", "replication"]);
                n.cli(&["cluster", "info"]).contains("cluster_state:ok")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `CLUSTER NODES` as a running node sees it: `(port, flags, id, master id)` of each
    /// node.
    fn nodes_table(&self) -> Vec<(u16, String, String, String)> {
        let any = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no node is running"));
        cli(any, &["cluster", "nodes"])
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                Some((
                    port,
                    (*f.get(2)?).to_owned(),
                    (*f.first()?).to_owned(),
                    (*f.get(3)?).to_owned(),
                ))
            })
            .collect()
    }

    /// `(port, flags)` of each node.
    fn table(&self) -> Vec<(u16, String)> {
        self.nodes_table()
            .into_iter()
            .map(|(port, flags, _, _)| (port, flags))
            .collect()
    }

    /// SIGKILLs a master (one at random), waits until its replica has taken over its slots,
    /// then starts the killed node again on its files, which rejoins as a replica; returns
    /// when the cluster is whole again.
    ///
    /// With a `lag`, the replica falls behind first, as one slowed by its disk, its network
    /// or a pause does: it is stopped (SIGSTOP), the master is given 16 MB to replicate, which
    /// fills the connection's buffers, and for `lag` what the master acknowledges waits in its
    /// own output buffer; then the master is killed and the replica resumed (SIGCONT). What
    /// the master acknowledged in that time is lost with it, unless the writer waited for the
    /// replica.
    pub fn fail_over_a_master(&mut self, lag: Duration) {
        let table = self.nodes_table();
        let masters: Vec<&(u16, String, String, String)> = table
            .iter()
            .filter(|(_, flags, _, _)| flags.contains("master") && !flags.contains("fail"))
            .collect();
        let (victim, _, victim_id, _) = masters[rand::random_range(0..masters.len())].clone();
        let stopped = (!lag.is_zero()).then(|| {
            let replica = table
                .iter()
                .find(|(_, _, _, master)| *master == victim_id)
                .map(|(port, _, _, _)| *port)
                .unwrap_or_else(|| panic!("{victim} has no replica: {table:?}"));
            let pid = self
                .nodes
                .iter()
                .find(|n| n.port == replica)
                .and_then(|n| n.child.as_ref())
                .map(Child::id)
                .unwrap_or_else(|| panic!("the replica on {replica} is not running"));
            signal(pid, "STOP");
            fill(victim);
            std::thread::sleep(lag);
            pid
        });
        let Some(node) = self.nodes.iter_mut().find(|n| n.port == victim) else {
            panic!("the master on {victim} is not one of ours")
        };
        node.kill();
        if let Some(pid) = stopped {
            signal(pid, "CONT");
        }
        // Failed over: the others see it failed, and a replica is master in its place.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let table = self.table();
            let failed = table
                .iter()
                .any(|(p, flags)| *p == victim && flags.contains("fail"));
            let masters = table
                .iter()
                .filter(|(_, flags)| flags.contains("master") && !flags.contains("fail"))
                .count();
            if failed && masters == 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no replica took over from {victim}: {table:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_until_ok(Duration::from_secs(30));
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == victim) {
            node.restart();
        }
        // Back as a replica (then in sync: wait_until_ok).
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .table()
            .iter()
            .any(|(p, flags)| *p == victim && (flags.contains("fail") || !flags.contains("slave")))
        {
            assert!(
                Instant::now() < deadline,
                "{victim} did not rejoin as a replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_until_ok(Duration::from_secs(30));
    }
}
