//! What the layer adds inside a Rust service: the same axum handler called through
//! `Router::oneshot`, without the layer, and with it over the memory store (new keys, replays).
//!
//! Run: `cargo bench -p idem-http --bench layer`

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{call, router};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

static NEXT: AtomicU64 = AtomicU64::new(0);

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
    group.bench_function("layer_memory_replay", |b| {
        b.to_async(&rt)
            .iter(|| call(&layered, Some("replay".into())));
    });
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
