//! `idem inspect`: one record's whole story.

use anyhow::{Result, bail};
use idem_core::{Clock, Store, SystemClock};

use crate::cli::{InspectArgs, Target};

pub(crate) async fn run(args: InspectArgs) -> Result<()> {
    let Target {
        store,
        scope,
        key,
        named,
    } = args.target.resolve()?;
    let (k, s) = (key.as_str().to_owned(), scope.as_str().to_owned());
    let store = super::open_existing(&store).await?;
    let record = match store.get(&scope, &key).await? {
        Some(record) => record,
        None if named => bail!(
            "no record for key {k:?} in scope {s:?}: it was never claimed, was released, or its retention ended (a caller with a principal has its own scope: pass --principal 'authorization: ...' or the --scope the gateway logged)"
        ),
        // No scope named: the key may be an authenticated caller's, in its own scope.
        None => {
            let (found, more) = super::scopes_holding(&store, &key).await?;
            let [only] = found.as_slice() else {
                bail!(
                    "{}",
                    super::elsewhere(&key, &found, more, SystemClock.now())
                );
            };
            let Some(record) = store.get(&only.scope, &key).await? else {
                bail!("{}", super::elsewhere(&key, &[], false, SystemClock.now()));
            };
            eprintln!(
                "key {k:?} is not in scope {s:?}; the one record of it is in scope {:?}",
                only.scope.as_str()
            );
            record
        }
    };
    let now = SystemClock.now();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&idem_core::report::to_json(&record, now))?
        );
    } else {
        print!("{}", crate::render::text(&record, now));
    }
    Ok(())
}
