//! `idem gc`: delete expired records, in bounded batches.

use anyhow::Result;
use idem_core::Store;

use crate::cli::GcArgs;

pub(crate) async fn run(args: GcArgs) -> Result<()> {
    let store = super::open_existing(&args.store).await?;
    let batch = args.batch as usize;
    let mut total = 0usize;
    loop {
        let n = store.purge_expired(batch).await?;
        total += n;
        if n < batch {
            break;
        }
    }
    println!(
        "purged {total} expired record{}",
        if total == 1 { "" } else { "s" }
    );
    Ok(())
}
