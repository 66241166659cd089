//! The store behind PgBouncer (a private one per pool mode in front of the shared server,
//! [`idem_conformance::pgbouncer`]): how it finds out, what it refuses, and that its settings
//! hold per transaction. The conformance suite runs through PgBouncer too
//! (`tests/conformance.rs`). Skips without PostgreSQL or pgbouncer unless
//! IDEM_REQUIRE_SERVICES=1.

use std::time::Duration;

use idem_conformance::pgbouncer::{PgBouncer, PoolMode};
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
