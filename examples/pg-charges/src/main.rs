//! `pg-charges`: the transactional-mode example as a server.
//!
//! ```text
//! cargo run -p example-pg-charges -- --db 'postgres://postgres@127.0.0.1/test?schema=charges'
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use example_pg_charges::{App, app, migrate};
use idem_store_postgres::PgStore;

/// A payment service whose charges and idempotency records commit in one transaction.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (port 0 picks one; the address is printed).
    #[arg(long, default_value = "127.0.0.1:3002")]
    listen: SocketAddr,
    /// The database, with ?schema=NAME for the schema holding charges and records.
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?schema=charges"
    )]
    db: String,
    /// For the crash test: pause between writing and committing, e.g. 60s.
    #[arg(long, value_parser = humantime::parse_duration)]
    hold_before_commit: Option<Duration>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let store = PgStore::connect_url(&args.db)
        .await
        .context("cannot open the database")?;
    migrate(&store)
        .await
        .context("cannot create the charges table")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!("pg-charges: listening on {}", listener.local_addr()?);
    let state = App {
        store,
        hold_before_commit: args.hold_before_commit,
    };
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
