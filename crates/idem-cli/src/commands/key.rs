//! `idem key`: derive the key of an intent ([design §7](docs/design.md#7-the-runtime-side)), as
//! agent runtimes do.

use anyhow::{Context, Result, bail};

use crate::cli::KeyArgs;

pub(crate) fn run(args: KeyArgs) -> Result<()> {
    let text = match args.args.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --args file {path}"))?,
        None => args.args.clone(),
    };
    let parsed = idem_keys::parse_args(&text).context("--args")?;
    let secret = match &args.secret_env {
        Some(var) => match std::env::var(var) {
            Ok(s) if !s.is_empty() => Some(s.into_bytes()),
            Ok(_) => bail!("--secret-env {var}: the variable is empty"),
            Err(_) => bail!("--secret-env {var}: the variable is not set"),
        },
        None => None,
    };
    let key = idem_keys::derive(
        &args.scope,
        &args.tool,
        &parsed,
        args.ordinal,
        secret.as_deref(),
    )?;
    println!("{key}");
    Ok(())
}
