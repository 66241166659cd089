//! `idem migrate`: create or check a store's schema, apart from serving.

use anyhow::{Context, Result};

use crate::cli::MigrateArgs;
use crate::store_url::{AnyStore, StoreUrl};

pub(crate) async fn run(args: MigrateArgs) -> Result<()> {
    // Opening creates the schema if absent and refuses one a newer idem wrote.
    let store = args
        .store
        .open(false)
        .await
        .with_context(|| format!("cannot open the store {}", args.store))?;
    println!("{}", describe(&args.store, &store));
    Ok(())
}

fn describe(url: &StoreUrl, store: &AnyStore) -> String {
    match store {
        AnyStore::Postgres(pg) => format!(
            "{url}: schema {} at version {}",
            pg.schema(),
            idem_store_postgres::SCHEMA_VERSION
        ),
        AnyStore::Sqlite(_) => format!("{url}: at version {}", idem_store_sqlite::SCHEMA_VERSION),
        AnyStore::Redis(r) => {
            let mut text = format!("{url}: nothing to create (keys under {}:)", r.prefix());
            for w in r.durability_warnings() {
                text.push_str(&format!("\nwarning: {w}"));
            }
            text
        }
        AnyStore::Memory(_) => format!("{url}: nothing to create (in memory)"),
    }
}
