//! One module per subcommand.

pub(crate) mod demo;
pub(crate) mod gc;
pub(crate) mod inspect;
pub(crate) mod key;
pub(crate) mod mcp;
pub(crate) mod migrate;
pub(crate) mod resolve;
pub(crate) mod serve;

use idem_core::StoreError;
use idem_stores::postgres::NoSchema;
use idem_stores::{AnyStore, NoStoreFile, StoreUrl};

/// Opens the store of an operator command (`inspect`, `resolve`, `gc`): a SQLite file or a
/// PostgreSQL schema must already exist, since one made here would be empty and every answer
/// about it wrong. The library says what is missing; which flag to check is this command's
/// to say.
pub(crate) async fn open_existing(url: &StoreUrl) -> Result<AnyStore, StoreError> {
    url.open_existing().await.map_err(|e| match e {
        StoreError::Unavailable(cause) if cause.is::<NoStoreFile>() || cause.is::<NoSchema>() => {
            StoreError::unavailable(format!("{cause} (check --store)"))
        }
        e => e,
    })
}

/// The scopes that hold a record of `key`, when the operator named none and the default scope
/// has none: an operator with only the key (from a log line, a customer's report) finds a
/// record an authenticated caller made in its own scope. Through the store's bounded listing
/// (`more`: it stopped before seeing every record, as Redis's may).
pub(crate) async fn scopes_holding(
    store: &AnyStore,
    key: &idem_core::Key,
) -> Result<(Vec<idem_core::Listed>, bool), StoreError> {
    let filter = idem_core::RecordFilter {
        state: None,
        key_prefix: key.as_str().to_owned(),
        scope_prefix: String::new(),
        // Clamped to the listing's page (500): more scopes than that holding one key is not
        // an operator's case.
        limit: usize::MAX,
    };
    let listing = idem_core::ListRecords::list(store, &filter).await?;
    let exact = listing
        .records
        .into_iter()
        .filter(|r| r.key.as_str() == key.as_str())
        .collect();
    Ok((exact, listing.more))
}

/// What to say when `key` is not in the default scope: where it is (never acting on a guess).
pub(crate) fn elsewhere(
    key: &idem_core::Key,
    found: &[idem_core::Listed],
    more: bool,
    now: idem_core::Timestamp,
) -> String {
    let k = key.as_str();
    if found.is_empty() {
        let stopped = if more {
            " (the search of every scope stopped before the end of a large store: pass --scope or --principal)"
        } else {
            ""
        };
        return format!(
            "no record for key {k:?} in any scope: it was never claimed, was released, or its retention ended{stopped}"
        );
    }
    let mut out = format!(
        "key {k:?} is not in scope {:?}; it is held in {} scope{}:",
        idem_core::scope::ANONYMOUS,
        found.len(),
        if found.len() == 1 { "" } else { "s" }
    );
    for r in found {
        out.push_str(&format!(
            "\n  --scope {}   {}",
            r.scope.as_str(),
            r.state(now).as_str()
        ));
    }
    out.push_str("\npass the caller's --scope (or --principal) to choose one");
    out
}
