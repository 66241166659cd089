//! A pooled connection that goes silent while idle (its peer's host gone without a word, a
//! NAT or a firewall that forgot it, so no reset ever comes) is found by TCP keepalive and
//! dropped by the pool before it is handed out: the next operation opens a new connection
//! and answers at once, rather than waiting out its bound on the dead one and failing.
//!
//! The silence is real TCP silence: an nftables rule drops what the server sends to this
//! store's own connections (found by their `application_name` in `pg_stat_activity`), so
//! the kernel's keepalive probes go unanswered, as they would across a lost host. Only
//! those ports are touched, for a minute at most; the rule's table is deleted when the test
//! ends. The URL asks for probes one second apart so the test takes seconds (the store's
//! defaults, 30 s idle and three probes 10 s apart, are checked in `options.rs`). Needs the
//! PostgreSQL server and `nft` with the right to use it (Debian: nftables, as root); skips
//! without them unless IDEM_REQUIRE_SERVICES=1.

use std::process::Command;
use std::time::{Duration, Instant};

use idem_core::{Key, Scope, Store};
use idem_store_postgres::{PgOptions, PgStore};

const PG: &str = "127.0.0.1:5432";
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Every table this test makes is named so.
const TABLE_PREFIX: &str = "idem_keepalive_";

/// An nftables table of this test's own; deleted when dropped, so a failing test leaves no
/// rule behind.
struct Firewall {
    table: String,
}

impl Firewall {
    /// `None` when `nft` is missing or may not be used here. Deletes the tables an earlier
    /// run left behind (killed before its drop ran) first.
    fn new(table: &str) -> Option<Firewall> {
        if let Ok(out) = Command::new("nft").args(["list", "tables"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(stale) = line.strip_prefix("table inet ")
                    && stale.starts_with(TABLE_PREFIX)
                {
                    let _ = nft(&["delete", "table", "inet", stale]);
                }
            }
        }
        let made = nft(&["add", "table", "inet", table]).ok()?;
        made.then(|| Firewall {
            table: table.to_owned(),
        })
    }

    /// Drops every packet the server sends to these local ports, for a minute at most: the
    /// ports are elements of a set that expire by themselves, so a run killed before its
    /// drop cannot leave them silenced for the next connections that reuse them.
    fn silence_server_to(&self, ports: &[u16]) {
        let t = self.table.as_str();
        let set = "{ type inet_service; flags timeout; }";
        assert_eq!(
            nft(&["add", "set", "inet", t, "ports", set]).ok(),
            Some(true)
        );
        let chain = "{ type filter hook input priority 0; }";
        assert_eq!(
            nft(&["add", "chain", "inet", t, "input", chain]).ok(),
            Some(true)
        );
        let rule = [
            "add", "rule", "inet", t, "input", "tcp", "sport", "5432", "tcp", "dport", "@ports",
            "drop",
        ];
        assert_eq!(nft(&rule).ok(), Some(true), "nft add rule");
        let elements: Vec<String> = ports.iter().map(|p| format!("{p} timeout 60s")).collect();
        let elements = format!("{{ {} }}", elements.join(", "));
        assert_eq!(
            nft(&["add", "element", "inet", t, "ports", &elements]).ok(),
            Some(true),
            "nft add element"
        );
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table]);
    }
}

/// Runs `nft`: whether it succeeded, or the error starting it.
fn nft(args: &[&str]) -> std::io::Result<bool> {
    let out = Command::new("nft").args(args).output()?;
    if !out.status.success() {
        eprintln!("nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_gone_silent_is_dropped_by_keepalive_not_handed_out() {
    let test = "an_idle_connection_gone_silent_is_dropped_by_keepalive_not_handed_out";
    if !idem_conformance::server_reachable(test, "PostgreSQL", PG) {
        return;
    }
    let name = format!("{TABLE_PREFIX}{:016x}", rand::random::<u64>());
    let Some(firewall) = Firewall::new(&name) else {
        idem_conformance::skip(test, "nft is missing or may not be used here");
        return;
    };
    let mut opts = PgOptions::from_url(&format!(
        "postgres://postgres@{PG}/test?keepalives_idle=1&keepalives_interval=1&keepalives_retries=2"
    ))
    .expect("url");
    opts.schema = name.clone();
    opts.op_timeout = OP_TIMEOUT;
    opts.config.application_name(&name);
    let store = PgStore::connect(opts).await.expect("connect");
    let (scope, key) = (Scope::anonymous(), Key::new("absent").expect("key"));
    // The shared pool's connection, idle in the pool after this read.
    assert!(store.get(&scope, &key).await.expect("read").is_none());

    let ports = client_ports(&name).await;
    assert!(!ports.is_empty(), "the store's connections were not found");
    firewall.silence_server_to(&ports);
    // Idle one second, then two probes one second apart, unanswered: the kernel ends each
    // connection by about three seconds, and its task closes the client.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let started = Instant::now();
    let read = store.get(&scope, &key).await;
    assert!(
        matches!(read, Ok(None)),
        "the read after the silence: {read:?}"
    );
    assert!(
        started.elapsed() < OP_TIMEOUT / 2,
        "the read took {:?}: it was handed the silent connection",
        started.elapsed()
    );
    drop(firewall);
    store.drop_schema().await.expect("drop schema");
}

/// The local ports of the connections whose `application_name` is `name`, as the server
/// sees them (a connection of the test's own, not through the store).
async fn client_ports(name: &str) -> Vec<u16> {
    let (client, conn) = tokio_postgres::connect(
        "host=127.0.0.1 port=5432 user=postgres dbname=test",
        tokio_postgres::NoTls,
    )
    .await
    .expect("a connection of the test's own");
    tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT client_port FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .expect("pg_stat_activity");
    rows.iter()
        .filter_map(|r| r.get::<_, Option<i32>>(0))
        .filter_map(|p| u16::try_from(p).ok())
        .collect()
}
