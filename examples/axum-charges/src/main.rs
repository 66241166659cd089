//! Run: `cargo run -p example-axum-charges` (listens on 127.0.0.1:3000, store `charges.db`).
//! With `-- --plain` it runs without the layer: a naive service to put `idem serve` in front of.
//!
//! Then try:
//!   curl -si -X POST localhost:3000/v1/charges -H 'Idempotency-Key: k1' \
//!        -H 'content-type: application/json' -d '{"customer_id":"cus_1","amount_cents":4900}'
//! twice: the second answer is the same charge, with `idempotent-replayed: true`.

use example_axum_charges::{Ledger, app, plain_app};
use idem_store_sqlite::SqliteStore;

#[tokio::main]
async fn main() {
    let plain = std::env::args().any(|a| a == "--plain");
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:3000").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:3000: {e}");
            std::process::exit(1);
        }
    };
    let router = if plain {
        println!("charges service on http://127.0.0.1:3000, without idem: every request charges");
        plain_app(Ledger::default())
    } else {
        let store = match SqliteStore::open("charges.db") {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        };
        println!("charges service on http://127.0.0.1:3000 (idempotency store charges.db)");
        app(store, Ledger::default())
    };
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    if let Err(e) = served {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
