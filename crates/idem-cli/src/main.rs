//! The `idem` command. Thin: flags in [`cli`], one module per subcommand in [`commands`];
//! stores are parsed and opened by URL in the `idem-stores` library, which the bindings share.

mod cli;
mod commands;
mod render;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    // One rustls crypto provider for the whole process (ring, as the workspace pins it):
    // reqwest, built with rustls but no provider of its own (idem mcp's upstream client), finds
    // none otherwise and panics when any client is built, `idem demo`'s plain-HTTP one and the
    // OTLP exporter's too; so it comes first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // rmcp's transport worker logs an ERROR for every connection attempt it gives up on;
    // idem reports what that means itself (a refused start, a tool error result), so by
    // default those lines are noise. IDEM_LOG replaces the whole default.
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,rmcp::transport::worker=off")
            }),
        );
    // OpenTelemetry traces only when the OTEL_* variables ask (design §13); started before
    // the async runtime, since the exporter's blocking client must not be built inside it.
    let (traces, refused) = match idem_telemetry::export::from_env() {
        Ok(traces) => (traces, None),
        Err(e) => (None, Some(e)),
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(traces.as_ref().map(idem_telemetry::export::Traces::layer))
        .init();
    if let Some(e) = refused {
        tracing::warn!("{e}");
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => commands::demo::run(args).await,
            Command::ExampleApi(args) => commands::demo::example_api(args).await,
            Command::Serve(args) => commands::serve::run(args).await,
            Command::Mcp(args) => commands::mcp::run(args).await,
            Command::ExampleMcp(args) => commands::mcp::example(args).await,
            Command::Key(args) => commands::key::run(args),
            Command::Inspect(args) => commands::inspect::run(args).await,
            Command::Resolve(args) => commands::resolve::run(args).await,
            Command::Gc(args) => commands::gc::run(args).await,
            Command::Migrate(args) => commands::migrate::run(args).await,
        }
    });
    // A blocking read of stdin (an MCP client that keeps it open after SIGTERM) would hold
    // the runtime's drop forever; the command's work is done, so give stragglers a moment.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    // Flushes the spans still queued.
    drop(traces);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
