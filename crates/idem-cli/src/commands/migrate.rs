//! `idem migrate`: create or check a store's schema, apart from serving.

use anyhow::{Context, Result};
use idem_stores::{AnyStore, StoreUrl};

use crate::cli::MigrateArgs;

pub(crate) async fn run(args: MigrateArgs) -> Result<()> {
    // Opening creates the schema if absent and refuses one a newer idem wrote.
    let store = args
        .store
        .open()
        .await
        .with_context(|| format!("cannot open the store {}", args.store))?;
    println!("{}", describe(&args.store, &store));
    Ok(())
}

fn describe(url: &StoreUrl, store: &AnyStore) -> String {
    let mut text = match store {
        AnyStore::Postgres(pg) => format!(
            "{url}: schema {} at version {}",
            pg.schema(),
            idem_stores::postgres::SCHEMA_VERSION
        ),
        AnyStore::Sqlite(_) => format!("{url}: at version {}", idem_stores::sqlite::SCHEMA_VERSION),
        AnyStore::Redis(r) => format!("{url}: nothing to create (keys under {}:)", r.prefix()),
        AnyStore::Memory(_) => format!("{url}: nothing to create (in memory)"),
    };
    for w in store.durability_warnings() {
        text.push_str(&format!("\nwarning: {w}"));
    }
    text
}
