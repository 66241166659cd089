//! Whether the deployment keeps what it acknowledged: read once at connect, from every node.
//!
//! An acknowledged claim can be lost three ways, and a retry then runs the effect again:
//! a restart without an fsynced append-only file, an eviction, and a failover to a replica
//! that had not yet received it (Redis replicates asynchronously). The first two are
//! settings of each node, named in the refusal. The third is closed by the store itself: on
//! a deployment with replicas it sends `WAIT 1` after each claim and each completion, and
//! acknowledges only what a replica holds too ([design §6](docs/design.md#6-a-store-failure-fails-closed)).

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

use crate::connection::Connection;
use crate::options::Server;

/// What [`assess`] found.
#[derive(Debug, Default)]
pub(crate) struct Assessment {
    /// What lets a node lose an acknowledged claim or evict a record, each naming the node
    /// and the setting to change.
    pub(crate) shortfalls: Vec<String>,
    /// Some master has a replica: a failover can promote it, so a claim must reach it before
    /// it is acknowledged.
    pub(crate) replicated: bool,
}

type Settings = HashMap<String, String>;

fn config_get() -> redis::Cmd {
    let mut config = redis::cmd("CONFIG");
    config
        .arg("GET")
        .arg("appendonly")
        .arg("appendfsync")
        .arg("maxmemory")
        .arg("maxmemory-policy");
    config
}

/// One node's settings as `CONFIG GET` answered them.
fn parse_settings(answer: Value) -> Result<Settings, String> {
    match answer {
        Value::ServerError(e) => Err(e.to_string()),
        // A map on RESP3, pairs in an array on RESP2: read as a map either way.
        v => redis::from_redis_value::<Settings>(v).map_err(|e| e.to_string()),
    }
}

/// Reads the persistence, eviction and replication of every master (the one server, or
/// each master of a cluster), and the persistence of each of their replicas, which a
/// failover promotes. A replica is reached at the address its master reports, with the
/// URL's credentials.
pub(crate) async fn assess(con: &mut Connection, server: &Server, timeout: Duration) -> Assessment {
    let read = async {
        let masters = con.on_every_node(config_get()).await?;
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let replication = con.on_every_node(info).await?;
        // The cluster client may answer from replicas too, once it knows them: each node
        // once, a replica labelled as such.
        let infos: Vec<(String, String)> = replication
            .into_iter()
            .map(|(node, answer)| {
                (
                    node,
                    redis::from_redis_value::<String>(answer).unwrap_or_default(),
                )
            })
            .collect();
        let is_replica = |node: &str| {
            infos
                .iter()
                .any(|(n, info)| n == node && info.lines().any(|l| l.trim() == "role:slave"))
        };
        let label = |node: String| {
            if is_replica(&node) {
                format!("{node} (a replica)")
            } else {
                node
            }
        };
        let mut seen: Vec<String> = masters.iter().map(|(node, _)| node.clone()).collect();
        let mut nodes: Vec<(String, Result<Settings, String>)> = masters
            .into_iter()
            .map(|(node, answer)| (label(node), parse_settings(answer)))
            .collect();
        let mut replicated = false;
        for (_, text) in &infos {
            let replicas = replicas(text);
            replicated |= !replicas.is_empty();
            for (host, port) in replicas {
                let addr = format!("{host}:{port}");
                if seen.contains(&addr) {
                    continue;
                }
                let settings = replica_settings(server, &host, port).await;
                nodes.push((format!("{addr} (a replica)"), settings));
                seen.push(addr);
            }
        }
        Ok::<_, redis::RedisError>((nodes, replicated))
    };
    let (nodes, replicated) = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => return unreadable(&e.to_string()),
        Err(_) => return unreadable("timed out"),
    };
    let many = nodes.len() > 1;
    let mut found = Assessment {
        shortfalls: Vec::new(),
        replicated,
    };
    // Each shortfall once, with the nodes that have it.
    let mut by_text: Vec<(String, Vec<String>)> = Vec::new();
    for (node, settings) in nodes {
        for s in shortfalls(&settings) {
            match by_text.iter_mut().find(|(t, _)| *t == s) {
                Some((_, on)) => on.push(node.clone()),
                None => by_text.push((s, vec![node.clone()])),
            }
        }
    }
    for (text, on) in by_text {
        found.shortfalls.push(if many {
            format!("on {}: {text}", on.join(", "))
        } else {
            text
        });
    }
    found
}

/// `CONFIG GET` on one replica, over a connection of its own.
async fn replica_settings(server: &Server, host: &str, port: u16) -> Result<Settings, String> {
    let template = match server {
        Server::Single(url) => url,
        Server::Cluster(nodes) => nodes.first().ok_or("no node")?,
    };
    let info = redis::Client::open(template.as_str())
        .map_err(|e| e.to_string())?
        .get_connection_info()
        .clone()
        .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port));
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let answer: Value = config_get()
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?;
    parse_settings(answer)
}

fn unreadable(e: &str) -> Assessment {
    Assessment {
        shortfalls: shortfalls(&Err(e.to_owned())),
        replicated: false,
    }
}

/// The replicas (`host`, `port`) a master reports in `INFO replication`
/// (`slave0:ip=127.0.0.1,port=7004,state=online,...`); none from a replica.
fn replicas(info: &str) -> Vec<(String, u16)> {
    let is_master = info.lines().any(|l| l.trim() == "role:master");
    if !is_master {
        return Vec::new();
    }
    info.lines()
        .filter_map(|l| {
            let (name, fields) = l.trim().split_once(':')?;
            let n = name.strip_prefix("slave")?;
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let field = |f: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            };
            Some((field("ip")?.to_owned(), field("port")?.parse().ok()?))
        })
        .collect()
}

/// What in one node's settings lets an acknowledged claim be lost or a record be evicted,
/// each naming the setting to change; empty when none does. Settings that could not be read
/// are a shortfall too: idem cannot tell.
fn shortfalls(settings: &Result<Settings, String>) -> Vec<String> {
    let settings = match settings {
        Ok(s) => s,
        Err(e) => {
            return vec![format!(
                "the server's persistence settings cannot be read (CONFIG GET: {e}), so idem \
                 cannot tell whether an acknowledged claim survives a crash (let idem's user \
                 run CONFIG GET and INFO, on a server with appendonly yes and appendfsync always)"
            )];
        }
    };
    let get = |k: &str| settings.get(k).map_or("not reported", String::as_str);
    let mut found = Vec::new();
    if get("appendonly") != "yes" {
        found.push(format!(
            "appendonly is {}: claims and results are lost if Redis restarts, and a retry then \
             runs again (set appendonly yes and appendfsync always)",
            get("appendonly")
        ));
    } else if get("appendfsync") != "always" {
        found.push(format!(
            "appendfsync is {}: a claim is acknowledged before it is on disk, so a crash can \
             lose it and a retry then runs again (set appendfsync always)",
            get("appendfsync")
        ));
    }
    let evicts = get("maxmemory") != "0" && get("maxmemory-policy") != "noeviction";
    if evicts {
        found.push(format!(
            "maxmemory-policy is {} with a memory limit: Redis may evict records before \
             their retention ends, and a retry then runs again (set maxmemory-policy \
             noeviction)",
            get("maxmemory-policy")
        ));
    }
    found
}

/// The warning logged under `durability=volatile` on a replicated deployment: the store
/// does not wait for replicas then.
pub(crate) const UNWAITED_REPLICAS: &str = "replication is asynchronous and, under \
     durability=volatile, the store does not wait for a replica to acknowledge a claim: a \
     failover can lose acknowledged claims, and a retry then runs again";

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect())
    }

    #[test]
    fn only_aof_with_fsync_always_and_no_eviction_passes() {
        let durable = [
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory", "0"),
            ("maxmemory-policy", "allkeys-lru"),
        ];
        assert!(shortfalls(&settings(&durable)).is_empty());
        let limited = [
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory", "1000000"),
            ("maxmemory-policy", "noeviction"),
        ];
        assert!(shortfalls(&settings(&limited)).is_empty());
        let cases: [(&[(&str, &str)], &str); 3] = [
            (
                &[("appendonly", "no"), ("maxmemory", "0")],
                "appendonly is no",
            ),
            (
                &[
                    ("appendonly", "yes"),
                    ("appendfsync", "everysec"),
                    ("maxmemory", "0"),
                ],
                "set appendfsync always",
            ),
            (
                &[
                    ("appendonly", "yes"),
                    ("appendfsync", "always"),
                    ("maxmemory", "100mb"),
                    ("maxmemory-policy", "volatile-lru"),
                ],
                "set maxmemory-policy noeviction",
            ),
        ];
        for (given, named) in cases {
            let found = shortfalls(&settings(given));
            assert_eq!(found.len(), 1, "{given:?}: {found:?}");
            assert!(found[0].contains(named), "{given:?}: {found:?}");
        }
        let silent = shortfalls(&settings(&[]));
        assert_eq!(silent.len(), 2, "{silent:?}");
        assert!(
            silent[0].contains("appendonly is not reported"),
            "{silent:?}"
        );
        let unreadable = shortfalls(&Err("NOPERM".to_owned()));
        assert!(unreadable[0].contains("cannot be read (CONFIG GET: NOPERM)"));
    }

    #[test]
    fn a_masters_replicas_are_read_from_its_replication_info() {
        let master = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=7004,state=online,offset=1,lag=0\r\nslave1:ip=::1,port=7005,state=online\r\nmaster_failover_state:no-failover\r\n";
        assert_eq!(
            replicas(master),
            [("127.0.0.1".to_owned(), 7004), ("::1".to_owned(), 7005)]
        );
        assert!(replicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n").is_empty());
        assert!(replicas("# Replication\r\nrole:slave\r\nslave0:ip=h,port=1\r\n").is_empty());
        assert!(replicas("").is_empty());
    }
}
