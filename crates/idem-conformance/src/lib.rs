//! The one conformance suite every idem [`Store`] backend must pass.
//!
//! A backend crate implements [`Harness`] (how to open a fresh, isolated store on a given
//! clock) and expands the suite in an integration test:
//!
//! ```ignore
//! struct Sqlite;
//! impl idem_conformance::Harness for Sqlite { /* ... */ }
//! idem_conformance::conformance_suite!(Sqlite);
//! ```
//!
//! That expands one `#[test]` per case in [`cases`], so a failure names the rule that broke
//! and the backend it broke in. The cases cover every transition of
//! [design §2](docs/design.md#2-the-records-life), every row of
//! [§3](docs/design.md#3-what-a-request-with-a-key-gets) at the store level, fencing, retention,
//! bounded purge, and races of real OS threads.
//!
//! Backends that need a server (PostgreSQL, Redis) return [`Unavailable`] from
//! [`Harness::open`] when it cannot be reached: the case prints why and passes, unless
//! `IDEM_REQUIRE_SERVICES=1` is set (as `.ci/run` does), in which case it fails.

use std::io::Write as _;
pub mod cases;
pub mod load;
pub mod pgbouncer;
pub mod pgcluster;
pub mod redis_servers;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, ClaimRequest, Clock, Fingerprint, Key, ListRecords, ManualClock, Scope, Store,
    StoredResponse, Timestamp,
};

/// Why a backend could not be opened (its server is down, say).
#[derive(Debug)]
pub struct Unavailable(pub String);

/// How to open a fresh, isolated store for one case.
pub trait Harness: Send + Sync + 'static {
    /// The backend under test: the claim contract, and the operator's listing.
    type Store: Store + ListRecords;

    /// Opens a store that sees no other case's records (its own file, schema or key prefix)
    /// and reads time from `clock`. Runs inside a multi-threaded tokio runtime.
    fn open(
        &self,
        clock: Arc<dyn Clock>,
    ) -> impl Future<Output = Result<Self::Store, Unavailable>> + Send;

    /// Removes what `open` created (a file, a schema, keys under a prefix). Called only after
    /// a case passed, so a failing case leaves its data behind to be looked at.
    fn cleanup(&self, store: &Self::Store) -> impl Future<Output = ()> + Send {
        let _ = store;
        async {}
    }
}

/// What a case gets: the store, the clock it reads, and a scope no other case uses.
#[derive(Debug)]
pub struct Cx<S> {
    /// The store under test, shareable with threads.
    pub store: Arc<S>,
    /// The store's clock; only the case moves it.
    pub clock: Arc<ManualClock>,
    /// A scope unique to this case.
    pub scope: Scope,
    /// The runtime's handle, for threads that call into the store.
    pub handle: tokio::runtime::Handle,
}

/// The lease every case claims with.
pub const LEASE: Duration = Duration::from_secs(30);
/// The retention every case claims with.
pub const RETENTION: Duration = Duration::from_secs(3600);

impl<S: Store> Cx<S> {
    /// A claim request in this case's scope with the suite's lease and retention.
    pub fn req(&self, key: &Key, fingerprint: Fingerprint) -> ClaimRequest {
        ClaimRequest {
            scope: self.scope.clone(),
            key: key.clone(),
            fingerprint,
            lease: LEASE,
            retention: RETENTION,
            on_abandoned: AbandonedPolicy::Reject,
        }
    }

    /// The current time on the case's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

/// A key unique within the case.
pub fn key(name: &str) -> Key {
    match Key::new(name) {
        Ok(k) => k,
        Err(e) => panic!("test key {name:?} is invalid: {e}"),
    }
}

/// A fingerprint standing for request number `n`.
pub fn fp(n: u32) -> Fingerprint {
    Fingerprint::http("POST", &format!("/v1/charges?n={n}"), None, b"{}")
}

/// A response with a recognisable body.
pub fn response(body: &str) -> StoredResponse {
    let mut r = StoredResponse::new(201, body.as_bytes().to_vec());
    r.headers
        .push(("content-type".into(), b"application/json".to_vec()));
    r
}

/// Whether a missing server must fail the run instead of skipping (`IDEM_REQUIRE_SERVICES=1`).
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1" || v == "true")
}

/// A test that cannot run here says why and returns: printed past libtest's capture, so the
/// skip shows in a passing run. Under `IDEM_REQUIRE_SERVICES=1` it fails instead.
pub fn skip(test: &str, why: &str) {
    assert!(!services_required(), "{test}: required but {why}");
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: {why} (set IDEM_REQUIRE_SERVICES=1 to fail instead)"
    );
}

/// Whether the server `name` answers at `addr` (`host:port`); when it does not, the test
/// [`skip`]s.
pub fn server_reachable(test: &str, name: &str, addr: &str) -> bool {
    match std::net::TcpStream::connect(addr) {
        Ok(_) => true,
        Err(e) => {
            skip(test, &format!("no {name} at {addr}: {e}"));
            false
        }
    }
}

/// Runs one case against a fresh store from `harness`. Used by [`conformance_suite!`].
pub fn run<H, F, Fut>(harness: &H, case_name: &str, case: F)
where
    H: Harness,
    F: FnOnce(Cx<H::Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot start a tokio runtime: {e}"),
    };
    // A fixed, recognisable start: 2026-01-01T00:00:00Z.
    let clock = ManualClock::new(Timestamp::from_millis(1_767_225_600_000));
    let opened = rt.block_on(harness.open(clock.clone()));
    let store = match opened {
        Ok(s) => s,
        Err(Unavailable(why)) if !services_required() => {
            skip(case_name, &why);
            return;
        }
        Err(Unavailable(why)) => panic!("{case_name}: backend unavailable: {why}"),
    };
    let scope = match Scope::new(format!(
        "conformance:{case_name}:{:016x}",
        rand::random::<u64>()
    )) {
        Ok(s) => s,
        Err(e) => panic!("scope: {e}"),
    };
    let store = Arc::new(store);
    let cx = Cx {
        store: store.clone(),
        clock,
        scope,
        handle: rt.handle().clone(),
    };
    rt.block_on(case(cx));
    rt.block_on(harness.cleanup(&store));
}

/// Expands one `#[test]` per conformance case for a [`Harness`] value, named after the case.
///
/// The cases are the ones listed in [`cases`]; that list is the only one.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::__conformance_cases!(tests $harness);
    };
}

/// Runs every conformance case in turn, inside one test: for a backend that a test starts
/// and stops itself (a private server, a cluster), which must outlive every case and be gone
/// when the test ends. The same list as [`conformance_suite!`].
#[macro_export]
macro_rules! conformance_sequence {
    ($harness:expr) => {
        $crate::__conformance_cases!(sequence $harness);
    };
}
