//! `idem resolve`: an operator settles an abandoned record
//! ([design §5](docs/design.md#5-unknown-outcomes)).

use anyhow::{Context, Result, bail};
use idem_core::{Clock, Resolution, Store, StoreError, StoredResponse, SystemClock};

use crate::cli::ResolveArgs;

pub(crate) async fn run(args: ResolveArgs) -> Result<()> {
    let crate::cli::Target {
        store,
        scope,
        key,
        named,
    } = args.target.resolve()?;
    let (k, s) = (key.as_str().to_owned(), scope.as_str().to_owned());
    let resolution = match (args.release, args.status) {
        (true, None) => Resolution::Release,
        (false, Some(status)) => {
            let body = match &args.body {
                Some(path) => std::fs::read(path)
                    .with_context(|| format!("cannot read --body {}", path.display()))?,
                None => Vec::new(),
            };
            let mut response = StoredResponse::new(status, body);
            for h in &args.header {
                let (name, value) = h
                    .split_once(':')
                    .with_context(|| format!("--header {h:?} is not NAME:VALUE"))?;
                response.headers.push((
                    name.trim().to_ascii_lowercase(),
                    value.trim().as_bytes().to_vec(),
                ));
            }
            Resolution::Complete(response)
        }
        _ => bail!("say how to settle the record: --release, or --status N [--body FILE]"),
    };
    let store = super::open_existing(&store).await?;
    match store.resolve(&scope, &key, resolution).await {
        Ok(None) => {
            println!("released {k:?} in scope {s:?}: the next request with this key executes")
        }
        Ok(Some(record)) => {
            println!("resolved {k:?} in scope {s:?}: retries now replay this result");
            print!("{}", crate::render::text(&record, SystemClock.now()));
        }
        // No scope named: say where the key is, and settle nothing on a guess.
        Err(StoreError::NotFound) if !named => {
            let (found, more) = super::scopes_holding(&store, &key).await?;
            bail!(
                "{}",
                super::elsewhere(&key, &found, more, SystemClock.now())
            )
        }
        Err(StoreError::NotFound) => bail!(
            "no record for key {k:?} in scope {s:?}: it was never claimed, was released, or its retention ended (a caller with a principal has its own scope: pass --principal 'authorization: ...' or the --scope the gateway logged)"
        ),
        Err(StoreError::NotAbandoned { state }) => bail!(
            "key {k:?} in scope {s:?} is {state}; only an abandoned record can be resolved{}",
            if state == idem_core::RecordState::InFlight {
                " (its lease is still running: wait for it to end)"
            } else {
                " (a completed result stays until its retention ends; a new intent needs a new key)"
            }
        ),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
