//! `idem demo` and `idem example-api`.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use idem_stores::StoreUrl;
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{DemoArgs, ExampleApiArgs};

pub(crate) async fn run(args: DemoArgs) -> Result<()> {
    if !(0.0..=idem_demo::run::MAX_LOSS).contains(&args.loss) {
        anyhow::bail!(
            "--loss must be from 0 to {} (the share of responses lost)",
            idem_demo::run::MAX_LOSS
        );
    }
    let given_store: Option<StoreUrl> = args.store.as_deref().map(str::parse).transpose()?;
    let (dir, keep) = match &args.dir {
        Some(d) => (d.clone(), true),
        None => (
            std::env::temp_dir().join(format!("idem-demo-{}", std::process::id())),
            false,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = run_in(&args, &dir, given_store).await;
    // A temporary directory goes, whether the demo succeeded or not.
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result?;
    if keep && !args.json {
        println!("databases kept in {}", dir.display());
    }
    Ok(())
}

async fn run_in(
    args: &DemoArgs,
    dir: &std::path::Path,
    given_store: Option<StoreUrl>,
) -> Result<()> {
    let store_url = match given_store {
        Some(url) => url,
        None => {
            let path = dir.join("idem.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            StoreUrl::Sqlite {
                path,
                timeout: None,
            }
        }
    };
    let store = store_url
        .open()
        .await
        .with_context(|| format!("cannot open the store {store_url}"))?;
    // A scope of its own per run, so a kept store never replays another run's charges.
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let opts = idem_demo::Options {
        intents: args.intents,
        loss: args.loss,
        seed: args.seed,
        dir: dir.to_path_buf(),
        scope: format!("turn_{:06x}", stamp & 0xff_ffff),
    };
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(u64::from(args.intents) * 2);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg:<24} [{bar:30}] {pos}/{len}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message("charging through the link");
        bar
    };
    let tick = || bar.inc(1);
    let report = idem_demo::run(&opts, store, &tick).await;
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

pub(crate) async fn example_api(args: ExampleApiArgs) -> Result<()> {
    let db = idem_demo::api::open(&args.db)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!(
        "example payment API (not idempotent) on http://{}; charges in {}",
        listener.local_addr()?,
        args.db.display()
    );
    axum::serve(listener, idem_demo::api::router(db))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
