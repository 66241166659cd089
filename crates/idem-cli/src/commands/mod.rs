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
use idem_stores::{AnyStore, NoStoreFile, StoreUrl};

/// Opens the store of an operator command (`inspect`, `resolve`, `gc`): a SQLite file must
/// already exist, since one made here would be empty and every answer about it wrong. The
/// library says the file is missing; which flag to check is this command's to say.
pub(crate) async fn open_existing(url: &StoreUrl) -> Result<AnyStore, StoreError> {
    url.open_existing().await.map_err(|e| match e {
        StoreError::Unavailable(cause) if cause.is::<NoStoreFile>() => {
            StoreError::unavailable(format!("{cause} (check --store)"))
        }
        e => e,
    })
}
