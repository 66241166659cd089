//! Run: `cargo run -p example-axum-charges` (listens on 127.0.0.1:3000, store `charges.db`).
//!
//! Then try:
//!   curl -si -X POST localhost:3000/v1/charges -H 'Idempotency-Key: k1' \
//!        -H 'content-type: application/json' -d '{"customer_id":"cus_1","amount_cents":4900}'
//! twice: the second answer is the same charge, with `idempotent-replayed: true`.

use example_axum_charges::{Ledger, app};
use idem_store_sqlite::SqliteStore;

#[tokio::main]
async fn main() {
    let store = match SqliteStore::open("charges.db") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:3000").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:3000: {e}");
            std::process::exit(1);
        }
    };
    println!("charges service on http://127.0.0.1:3000 (store charges.db)");
    let served = axum::serve(listener, app(store, Ledger::default()))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    if let Err(e) = served {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
