//! Instructions per keyed request through the layer, for `valgrind --tool=callgrind`, whose
//! counts are the same run after run on a busy machine (wall-clock benchmarks are not; see
//! `layer.rs` for those). One thread, the memory store, the same handler as `layer.rs`.
//!
//! ```sh
//! cargo bench -p idem-http --bench layer_instructions --no-run
//! for mode in plain new replay replay-uncached; do
//!   for n in 0 10000; do
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/layer_instructions-* $mode $n 2>&1 | grep refs
//!   done
//! done
//! ```
//! (instructions of `n` = 10000, less those of `n` = 0, over 10000: one request's.)

mod common;

use common::{call, router};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mode = args.next().unwrap_or_else(|| "replay".to_owned());
    let n: u64 = args
        .next()
        .map_or(10_000, |s| s.parse().unwrap_or_else(|e| panic!("{e}")));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let app = match mode.as_str() {
        "plain" => router(None),
        "replay-uncached" => router(Some(0)),
        "new" | "replay" => router(Some(idem_http::DEFAULT_CACHE_BYTES)),
        other => panic!("mode is plain, new, replay or replay-uncached, not {other}"),
    };
    rt.block_on(async {
        // The stored record the replays repeat, and every lazy initialisation, before
        // the counted calls.
        call(&app, (mode != "plain").then(|| "replay".to_owned())).await;
        for i in 0..n {
            let key = match mode.as_str() {
                "plain" => None,
                "new" => Some(format!("k{i}")),
                _ => Some("replay".to_owned()),
            };
            call(&app, key).await;
        }
    });
}
