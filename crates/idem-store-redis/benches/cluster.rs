//! Claims per second on one Redis server against a 3-master Redis Cluster (issue 32), each a
//! private set of servers this benchmark starts with the same settings (fsynced AOF), and the
//! CPU each side spent per claim: the Redis processes' (from /proc) and this process's, the
//! load generator and the store client. On 2 shared cores the load generator and the servers
//! compete, so the rate alone says little about scaling; the servers' CPU per claim does.
//!
//! Rows: one server; the cluster with the store waiting for a replica (`WAIT 1`, the
//! default there) and without (`durability=volatile`); `redis-benchmark` (SET, same
//! concurrency) on each, as the ceiling of what the servers answer.
//!
//! Run: `cargo bench -p idem-store-redis --bench cluster` (`IDEM_BENCH_SECS`, default 5).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_conformance::load::claim_fresh;
use idem_conformance::redis_servers::{Persistence, RedisCluster, RedisServer};
use idem_store_redis::RedisStore;

const CONCURRENCY: usize = 64;

/// User + system CPU seconds of a process, from /proc/PID/stat.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces), closed by ')'.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the name and state.
    (ticks(11) + ticks(12)) / 100.0
}

fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_secs(*p)).sum()
}

struct Row {
    name: String,
    per_sec: f64,
    server_us: f64,
    client_us: f64,
}

fn secs() -> u64 {
    std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// Claim + completion of fresh keys from CONCURRENCY tasks for the run's seconds.
async fn run(name: &str, url: &str, servers: &[u32]) -> Row {
    let store = RedisStore::connect_url(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let (server0, client0, t0) = (
        cpu_of(servers),
        cpu_secs(std::process::id()),
        Instant::now(),
    );
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    claim_fresh(&store, true).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs())).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let n = done.load(Ordering::Relaxed) as f64;
    let elapsed = t0.elapsed().as_secs_f64();
    let row = Row {
        name: name.to_owned(),
        per_sec: n / elapsed,
        server_us: (cpu_of(servers) - server0) / n * 1e6,
        client_us: (cpu_secs(std::process::id()) - client0) / n * 1e6,
    };
    let _ = store.delete_all().await;
    row
}

/// redis-benchmark's SET at the same concurrency, on the server or cluster at `port`.
fn redis_benchmark(name: &str, port: u16, cluster: bool, servers: &[u32]) -> Row {
    let requests = 200_000;
    let server0 = cpu_of(servers);
    let t0 = Instant::now();
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &CONCURRENCY.to_string(), "-n", &requests.to_string()])
        .args(["-t", "set", "-r", "1000000", "-q"]);
    if cluster {
        cmd.arg("--cluster");
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("redis-benchmark: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = f64::from(requests);
    Row {
        name: name.to_owned(),
        per_sec: n / t0.elapsed().as_secs_f64(),
        server_us: (cpu_of(servers) - server0) / n * 1e6,
        client_us: f64::NAN,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let bench = "cluster benchmark";
    let Some(single) = RedisServer::start(bench, Persistence::AofAlways) else {
        return;
    };
    let Some(cluster) = RedisCluster::start(bench) else {
        return;
    };
    let single_pids: Vec<u32> = single.pid().into_iter().collect();
    let cluster_pids: Vec<u32> = cluster.nodes.iter().filter_map(RedisServer::pid).collect();
    let mut rows = vec![rt.block_on(run(
        "one server, AOF always",
        &format!("{}?prefix=idem-bench", single.url()),
        &single_pids,
    ))];
    rows.push(rt.block_on(run(
        "cluster 3+3, AOF always, WAIT 1 (default)",
        &cluster.url("?prefix=idem-bench"),
        &cluster_pids,
    )));
    rows.push(rt.block_on(run(
        "cluster 3+3, AOF always, durability=volatile",
        &cluster.url("?prefix=idem-bench&durability=volatile"),
        &cluster_pids,
    )));
    rows.push(redis_benchmark(
        "redis-benchmark SET, one server",
        single.port,
        false,
        &single_pids,
    ));
    rows.push(redis_benchmark(
        "redis-benchmark SET, cluster",
        cluster.nodes[0].port,
        true,
        &cluster_pids,
    ));
    println!(
        "| {CONCURRENCY} concurrent, {} s | claim+complete/s | Redis CPU µs per claim (all nodes) | this process's CPU µs per claim |",
        secs()
    );
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.0} | {:.1} | {:.1} |",
            r.name, r.per_sec, r.server_us, r.client_us
        );
    }
}
