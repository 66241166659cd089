//! `idem serve` gives each serving thread a store handle of its own, opened on that thread
//! (`Store::for_this_runtime`), so a store whose connection a task drives (Redis) is driven
//! by the thread that uses it; and the keyed requests on every thread still meet in one
//! set of records.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use idem_core::{
    Claim, ClaimRequest, FencingToken, Key, ListRecords, Listing, MemoryStore, Record,
    RecordFilter, Resolution, Scope, Store, StoreError, StoredResponse, Timestamp,
};
use idem_gateway::{Bound, FileConfig, Overrides, Settings};
use metrics_exporter_prometheus::PrometheusBuilder;
use support::{BODY, CONFIG, send, start_upstream};
use tokio::sync::oneshot;

/// The memory store, noting the thread each handle was opened on.
#[derive(Clone)]
struct Noting {
    inner: MemoryStore,
    opened_on: Arc<Mutex<Vec<String>>>,
}

impl Store for Noting {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        self.inner.complete(scope, key, token, response).await
    }
    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        self.inner.release(scope, key, token).await
    }
    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: std::time::Duration,
    ) -> Result<Timestamp, StoreError> {
        self.inner.extend(scope, key, token, lease).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(scope, key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.resolve(scope, key, resolution).await
    }
    async fn for_this_runtime(&self) -> Result<Self, StoreError> {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        self.opened_on
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name);
        Ok(self.clone())
    }
}

impl ListRecords for Noting {
    async fn list(&self, filter: &RecordFilter) -> Result<Listing, StoreError> {
        self.inner.list(filter).await
    }
}

#[tokio::test]
async fn each_serving_thread_opens_its_own_store_handle_on_itself() {
    let (upstream, up) = start_upstream().await;
    let mut file = FileConfig::parse(CONFIG).unwrap_or_else(|e| panic!("{e:#}"));
    file.admin.token_env = None;
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let settings = Settings::resolve(
        file,
        Overrides {
            listen: Some(loopback),
            admin_listen: Some(loopback),
            upstream: Some(format!("http://{upstream}")),
            store: Some("memory:".to_owned()),
            threads: Some(3),
            ..Overrides::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let store = Noting {
        inner: MemoryStore::new(),
        opened_on: Arc::default(),
    };
    let (bound_tx, bound_rx) = oneshot::channel::<Bound>();
    let (stop, stopped) = oneshot::channel::<()>();
    let gateway = tokio::spawn(idem_gateway::serve(
        settings,
        store.clone(),
        PrometheusBuilder::new().build_recorder().handle(),
        move |b| {
            let _ = bound_tx.send(b);
        },
        async {
            let _ = stopped.await;
        },
    ));
    let bound = bound_rx.await.expect("the gateway starts");

    let mut opened = store
        .opened_on
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    opened.sort();
    assert_eq!(opened, ["idem-serve-0", "idem-serve-1", "idem-serve-2"]);

    // One key from connections that land on different threads: executed once.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let key = [("idempotency-key", "handles-k1")];
        statuses.push(
            send(bound.listen, "POST", "/v1/charges", &key, BODY)
                .await
                .status,
        );
    }
    assert_eq!(statuses, [201; 6]);
    assert_eq!(up.seen().len(), 1, "executed once across the threads");

    let _ = stop.send(());
    gateway.await.expect("joined").expect("served");
}
