//! The store behind PgBouncer (a private one per pool mode in front of the shared server,
//! [`idem_conformance::pgbouncer`]): how it finds out, what it refuses, and that its settings
//! hold per transaction. The conformance suite runs through PgBouncer too
//! (`tests/conformance.rs`). And that a claim is flushed when acknowledged on the pooled and
//! the direct path alike, on a private server whose default is `synchronous_commit = off`
//! ([`idem_conformance::pgcluster`]). Skips without PostgreSQL, pgbouncer or initdb unless
//! IDEM_REQUIRE_SERVICES=1.

use std::time::Duration;

use idem_conformance::pgbouncer::{PROBE_ROLE, PgBouncer, PoolMode};
use idem_core::{AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store};
use idem_store_postgres::{PgOptions, PgStore};

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e:?}"))
}

/// The URL through a PgBouncer in `mode` plus `params`, or `None` when the test skips.
fn through(test: &str, mode: PoolMode, params: &str) -> Option<String> {
    match PgBouncer::shared(mode) {
        Ok(port) => Some(format!("{}{params}", PgBouncer::url(port))),
        Err(why) => {
            idem_conformance::skip(test, &why);
            None
        }
    }
}

fn options(url: &str) -> PgOptions {
    let mut opts = ok(PgOptions::from_url(url));
    opts.schema = format!("idem_pgb_{:016x}", rand::random::<u64>());
    opts
}

fn req(key: &str) -> ClaimRequest {
    ClaimRequest {
        scope: ok(Scope::new("s")),
        key: ok(Key::new(key)),
        fingerprint: Fingerprint::from_bytes([1; 32]),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        on_abandoned: AbandonedPolicy::Reject,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_is_found_out_whether_it_refuses_or_drops_the_startup_options() {
    let test = "a_pooler_is_found_out_whether_it_refuses_or_drops_the_startup_options";
    for mode in [PoolMode::Transaction, PoolMode::TransactionIgnoringOptions] {
        let Some(url) = through(test, mode, "") else {
            return;
        };
        let store = ok(PgStore::connect(options(&url)).await);
        assert!(store.behind_pooler(), "{mode:?}: not found out");
        assert!(matches!(
            ok(store.claim(req("k")).await),
            Claim::Acquired(_)
        ));
        ok(store.drop_schema().await);
    }
    if !idem_conformance::server_reachable(test, "PostgreSQL", "127.0.0.1:5432") {
        return;
    }
    let store = ok(PgStore::connect(options("postgres://postgres@127.0.0.1:5432/test")).await);
    assert!(
        !store.behind_pooler(),
        "a direct connection taken for a pooler"
    );
    ok(store.drop_schema().await);
}

/// A pooler that drops the startup options is found out even when the role's own settings
/// happen to equal idem's: here `lock_timeout = 2s`, which is idem's with the default 10 s
/// operation timeout. A probe that compared `lock_timeout` took that pooler for a direct
/// connection, and would have sent named statements, and cancels, through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_is_found_out_whatever_the_roles_own_settings() {
    let test = "a_pooler_is_found_out_whatever_the_roles_own_settings";
    let Some(url) = through(test, PoolMode::TransactionIgnoringOptions, "") else {
        return;
    };
    let (admin, connection) = ok(tokio_postgres::connect(
        "host=127.0.0.1 port=5432 user=postgres dbname=test",
        tokio_postgres::NoTls,
    )
    .await);
    tokio::spawn(connection);
    // The role may be left from an earlier run; each statement holds either way.
    let _ = admin
        .batch_execute(&format!("CREATE ROLE {PROBE_ROLE} LOGIN"))
        .await;
    ok(admin
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE test TO {PROBE_ROLE}; \
             ALTER ROLE {PROBE_ROLE} SET lock_timeout = '2s'"
        ))
        .await);
    let url = url.replacen("postgres@", &format!("{PROBE_ROLE}@"), 1);
    let opts = options(&url);
    assert_eq!(
        opts.op_timeout,
        Duration::from_secs(10),
        "the default bound"
    );
    let store = ok(PgStore::connect(opts).await);
    assert!(
        store.behind_pooler(),
        "a pooler that drops the options taken for a direct connection"
    );
    ok(store.drop_schema().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooler_none_behind_a_pooler_is_refused_naming_the_setting() {
    let test = "pooler_none_behind_a_pooler_is_refused_naming_the_setting";
    for mode in [PoolMode::Transaction, PoolMode::TransactionIgnoringOptions] {
        let Some(url) = through(test, mode, "?pooler=none") else {
            return;
        };
        let e = PgStore::connect(options(&url))
            .await
            .map(|_| ())
            .expect_err("pooler=none was accepted behind a pooler");
        assert!(
            e.to_string().contains("pooler=transaction"),
            "{mode:?}: {e}"
        );
    }
}

/// Behind a transaction pooler the connection's startup options never arrive: the store's
/// own settings (here `lock_timeout`) must hold in each transaction it opens. A claim of a
/// key another transaction holds gives up at the lock timeout (1 s), not at the caller's
/// bound (3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_hold_per_transaction_behind_a_transaction_pooler() {
    let test = "the_settings_hold_per_transaction_behind_a_transaction_pooler";
    let Some(url) = through(test, PoolMode::Transaction, "") else {
        return;
    };
    let mut opts = options(&url);
    opts.op_timeout = Duration::from_secs(3);
    let schema = opts.schema.clone();
    let store = ok(PgStore::connect(opts).await);
    // The holder connects directly: its transaction holds one server connection.
    let mut direct = options("postgres://postgres@127.0.0.1:5432/test");
    direct.schema = schema;
    let holder = ok(PgStore::connect(direct).await);
    let mut client = ok(holder.pool().get().await);
    let tx = ok(client.transaction().await);
    assert!(matches!(
        ok(holder.claim_in(&tx, &req("held")).await),
        Claim::Acquired(_)
    ));
    let started = std::time::Instant::now();
    let e = store
        .claim(req("held"))
        .await
        .expect_err("a claim of a held key acquired");
    assert!(
        e.to_string().contains("lock timeout"),
        "not the server's lock timeout after {:?}: {e}",
        started.elapsed()
    );
    drop(tx);
    drop(client);
    assert!(matches!(
        ok(store.claim(req("free")).await),
        Claim::Acquired(_)
    ));
    ok(store.drop_schema().await);
}

/// Whether everything written so far is flushed: asked on a connection of its own right
/// after a commit answered, it tells a commit that waited for its flush
/// (`synchronous_commit=on`) from one that did not (the WAL writer flushes within 200 ms).
async fn flushed(watcher: &tokio_postgres::Client) -> bool {
    let rows = ok(watcher
        .simple_query("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()")
        .await);
    rows.iter()
        .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t")))
}

/// How many of `n` claims, then of their completions, were flushed when they answered.
async fn flushes(store: &PgStore, watcher: &tokio_postgres::Client, n: usize) -> (usize, usize) {
    let (mut claims, mut leases) = (0, Vec::new());
    for i in 0..n {
        match ok(store.claim(req(&format!("k{i}"))).await) {
            Claim::Acquired(lease) => leases.push((i, lease.token)),
            other => panic!("k{i}: {other:?}"),
        }
        claims += usize::from(flushed(watcher).await);
    }
    let mut completions = 0;
    for (i, token) in leases {
        let r = req(&format!("k{i}"));
        let done = idem_core::StoredResponse::new(201, b"{}".to_vec());
        ok(store.complete(&r.scope, &r.key, token, done).await);
        completions += usize::from(flushed(watcher).await);
    }
    (claims, completions)
}

/// On the pooled path a claim's `synchronous_commit=on` travels in its own transaction, not
/// in the connection: on a server whose default is `off` (a private one), each claim's WAL
/// is flushed by the time it answers, while completions, which may commit without waiting,
/// are not, nor are plain commits on the same server (the control). The direct path
/// (settings as startup options) likewise, and both again through a runtime handle's
/// batchers, whose pools are their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_claim_is_flushed_whatever_the_servers_default() {
    use idem_conformance::pgcluster::{Cluster, Replication};
    let test = "a_pooled_claim_is_flushed_whatever_the_servers_default";
    let cluster = match tokio::task::block_in_place(|| Cluster::start(Replication::Synchronous)) {
        Ok(c) => c,
        Err(why) => return idem_conformance::skip(test, &why),
    };
    ok(cluster.psql(cluster.primary, "ALTER SYSTEM SET synchronous_commit = off"));
    // Nothing else writes WAL meanwhile (an autovacuum's records would read as unflushed).
    ok(cluster.psql(cluster.primary, "ALTER SYSTEM SET autovacuum = off"));
    ok(cluster.psql(cluster.primary, "SELECT pg_reload_conf()"));
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?pooler=transaction",
        cluster.primary
    );
    let store = ok(PgStore::connect(options(&url)).await);
    let (watcher, connection) = ok(tokio_postgres::connect(
        &url.replace("?pooler=transaction", ""),
        tokio_postgres::NoTls,
    )
    .await);
    tokio::spawn(connection);
    const N: usize = 40;
    // The control: plain single-statement commits under the server's default.
    let client = ok(store.pool().get().await);
    ok(client.batch_execute("CREATE TABLE control (n int)").await);
    let mut control = 0;
    for n in 0..N {
        ok(client
            .batch_execute(&format!("INSERT INTO control VALUES ({n})"))
            .await);
        control += usize::from(flushed(&watcher).await);
    }
    for route in ["pooler=transaction", "pooler=none"] {
        // The store's own batchers, then a runtime handle's (`Store::for_this_runtime`, a
        // serving thread's in `idem serve`), which batch over pools of their own.
        for through_handle in [false, true] {
            let store = ok(PgStore::connect(options(&format!(
                "postgres://postgres@127.0.0.1:{}/postgres?{route}",
                cluster.primary
            )))
            .await);
            let store = if through_handle {
                ok(store.for_this_runtime().await)
            } else {
                store
            };
            let (claims, completions) = flushes(&store, &watcher, N).await;
            let path = if through_handle {
                "a runtime handle"
            } else {
                "the store"
            };
            eprintln!(
                "{route}, {path}: flushed when answered, of {N}: plain commits {control}, \
                 claims {claims}, completions {completions}"
            );
            // The background writer logs a snapshot of running transactions every 15 s
            // without flushing it (wal_level replica): one check in a run may see that record
            // unflushed.
            assert!(
                claims + 2 >= N,
                "{route}, {path}: {claims} of {N} claims flushed when acknowledged"
            );
            assert!(
                control < N / 2,
                "the control was flushed {control} times: the default is not off"
            );
            assert!(
                completions < N / 2,
                "{route}, {path}: {N} completions were flushed {completions} times"
            );
        }
    }
    drop(client);
}
