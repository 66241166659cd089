//! What the layer adds inside a Rust service: the same axum handler called through
//! `Router::oneshot`, without the layer, and with it over the memory store (new keys, replays).
//!
//! New keys are timed twice. `layer_memory_new_key` sends every key to one store, which ends up
//! holding every key criterion chose to send (millions): its time grows with the run, as the
//! store's map rehashes and the allocator works over a heap of records. `..._bounded_store`
//! sends each run of [`KEYS_PER_STORE`] keys to a fresh layer and store, dropped outside the
//! timing, so it times what the layer does per request over a store of at most that size.
//!
//! Run: `cargo bench -p idem-http --bench layer`

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{call, router};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// How many new keys `layer_memory_new_key_bounded_store` sends to one store.
const KEYS_PER_STORE: u64 = 10_000;

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("layer");
    group.throughput(Throughput::Elements(1));
    let plain = router(None);
    let layered = router(Some(idem_http::DEFAULT_CACHE_BYTES));
    rt.block_on(call(&layered, Some("replay".into())));
    group.bench_function("handler_without_layer", |b| {
        b.to_async(&rt).iter(|| call(&plain, None));
    });
    group.bench_function("layer_memory_new_key", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("k{}", NEXT.fetch_add(1, Ordering::Relaxed));
            call(&layered, Some(key))
        });
    });
    let mut store_of_batch = router(Some(idem_http::DEFAULT_CACHE_BYTES));
    let mut sent = 0;
    group.bench_function("layer_memory_new_key_bounded_store", |b| {
        b.to_async(&rt).iter_batched(
            || {
                if sent % KEYS_PER_STORE == 0 {
                    store_of_batch = router(Some(idem_http::DEFAULT_CACHE_BYTES));
                }
                sent += 1;
                (store_of_batch.clone(), format!("k{sent}"))
            },
            // The router is handed back, so the last handle on a full store is dropped
            // outside the timing.
            |(app, key)| async move {
                call(&app, Some(key)).await;
                app
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("layer_memory_replay", |b| {
        b.to_async(&rt)
            .iter(|| call(&layered, Some("replay".into())));
    });
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
