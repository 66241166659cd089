//! The demo itself: the same charge intents twice through the same lossy link, once with
//! naive retries straight to the API, once with keys derived at intent and the gateway in front.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use idem_client::{HttpTransport, Intent, RetryPolicy, ToolClass, ToolClient, ToolPolicy};
use idem_core::{ListRecords, Store};
use idem_gateway::{Bound, FileConfig, Overrides, Settings};
use serde::Serialize;
use serde_json::json;
use tokio::net::TcpListener;

use crate::api::{self, Counts};
use crate::link::{self, Event, Fate};

/// The highest share of lost responses the demo accepts: beyond it, the bounded retries of a
/// run would give up on some intents.
pub const MAX_LOSS: f64 = 0.9;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Charge intents per run.
    pub intents: u32,
    /// Share of responses lost on the way back.
    pub loss: f64,
    /// Seed of the link's coin.
    pub seed: u64,
    /// Where the API's databases go (`naive.db`, `keyed.db`).
    pub dir: PathBuf,
    /// The scope keys are derived in (a conversation turn).
    pub scope: String,
}

/// One run's figures; charges are counted from the API's database.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Intents attempted.
    pub intents: u32,
    /// Calls the client made.
    pub attempts: u64,
    /// From the API's database.
    #[serde(flatten)]
    pub counts: Counts,
    /// Answers that were replays of an earlier execution.
    pub replays_served: u64,
    /// Intents whose call ended with a charge id.
    pub intents_with_charge_id: u32,
    /// Wall time of the run.
    pub wall_ms: u64,
}

/// Both runs and a story.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Intents per run.
    pub intents: u32,
    /// Share of responses lost.
    pub loss: f64,
    /// The link's seed.
    pub seed: u64,
    /// Retries without keys, straight to the API.
    pub naive: RunReport,
    /// Keys at intent, the gateway in front.
    pub keyed: RunReport,
    /// One intent of each run whose response was lost, told step by step.
    pub story: Vec<String>,
}

async fn listen() -> Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot listen on loopback")
}

async fn start_api(db: &Path) -> Result<SocketAddr> {
    let _ = std::fs::remove_file(db);
    let router = api::router(api::open(db)?);
    let listener = listen().await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

/// Starts `idem serve` in this process in front of `upstream`; stops when the sender drops.
async fn start_gateway<St: Store + ListRecords + Clone>(
    upstream: SocketAddr,
    store: St,
) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let file: FileConfig = toml_config()?;
    let overrides = Overrides {
        listen: Some(([127, 0, 0, 1], 0).into()),
        admin_listen: Some(([127, 0, 0, 1], 0).into()),
        upstream: Some(format!("http://{upstream}")),
        ..Overrides::default()
    };
    let settings = Settings::resolve(file, overrides)?;
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let served = idem_gateway::serve(
            settings,
            store,
            metrics,
            move |b| {
                let _ = bound_tx.send(b);
            },
            async {
                let _ = stop_rx.await;
            },
        )
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "demo gateway failed");
        }
    });
    let bound = bound_rx.await.context("the gateway did not start")?;
    Ok((bound.listen, stop_tx))
}

fn toml_config() -> Result<FileConfig> {
    FileConfig::parse(
        r#"
        # The demo's client sends no credentials: the example API has one caller. Callers
        # without any are refused by default; here they share the anonymous scope.
        anonymous = "allow"
        [timeouts]
        upstream = "10s"
        lease = "10s"
        [[routes]]
        method = "POST"
        path = "/v1/charges"
        require_key = true
        "#,
    )
}

struct Outcome {
    attempts: u64,
    replays: u64,
    with_charge_id: u32,
    per_intent_events: Vec<Vec<Event>>,
    wall: Duration,
}

async fn run_intents(
    link_addr: SocketAddr,
    log: &link::Log,
    opts: &Options,
    keyed: bool,
    progress: &(dyn Fn() + Sync),
) -> Result<Outcome> {
    let transport = HttpTransport::new(format!("http://{link_addr}"), Duration::from_secs(10))?
        .route("charge_card", "/v1/charges");
    let attempts = Arc::new(Mutex::new(0u64));
    let counter = attempts.clone();
    let client = ToolClient::new(transport)
        .retry_policy(RetryPolicy {
            // At the highest loss a call fails about 92% of the time (losses and resets): 200
            // attempts leave a run a chance in millions of giving up on an intent.
            max_attempts: 200,
            base: Duration::from_millis(1),
            cap: Duration::from_millis(10),
            max_total: Duration::from_secs(60),
        })
        .on_attempt(move |_| *counter.lock().unwrap_or_else(|p| p.into_inner()) += 1);
    // The naive stack believes the call is safe to repeat, so it retries without a key.
    let policy = if keyed {
        ToolPolicy::effect(idem_client::Category::Money)
    } else {
        ToolPolicy {
            class: ToolClass::Idempotent,
            category: None,
        }
    };
    let start = Instant::now();
    let (mut replays, mut with_charge_id) = (0, 0);
    let mut per_intent_events = Vec::new();
    for i in 0..opts.intents {
        let before = log.lock().unwrap_or_else(|p| p.into_inner()).len();
        let intent = Intent {
            scope: opts.scope.clone(),
            tool: "charge_card".into(),
            args: json!({ "customer_id": format!("cus_{i}"), "amount_cents": 4900 }),
            ordinal: 0,
            policy,
        };
        let resp = client
            .call(&intent)
            .await
            .with_context(|| format!("intent {i} failed"))?;
        replays += u64::from(resp.replayed);
        let body: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
        with_charge_id += u32::from(
            body["charge_id"]
                .as_str()
                .is_some_and(|c| c.starts_with("ch_")),
        );
        let events = log.lock().unwrap_or_else(|p| p.into_inner())[before..].to_vec();
        per_intent_events.push(events);
        progress();
    }
    let attempts = *attempts.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Outcome {
        attempts,
        replays,
        with_charge_id,
        per_intent_events,
        wall: start.elapsed(),
    })
}

fn charge_id(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["charge_id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The first intent whose response was lost, as a sequence of steps.
fn story(outcome: &Outcome, keyed: bool) -> Vec<String> {
    let Some(events) = outcome
        .per_intent_events
        .iter()
        .find(|evs| evs.iter().any(|e| matches!(e.fate, Fate::Lost { .. })))
    else {
        return Vec::new();
    };
    let key = events.iter().find_map(|e| e.key.clone());
    let mut lines = vec![match &key {
        Some(k) => format!("charge_card(key={k})"),
        None => "charge_card() with no key".to_owned(),
    }];
    for e in events {
        match &e.fate {
            Fate::Lost { status, body } => {
                lines.push(format!(
                    "  -> POST /v1/charges -> {status} charge_id={}",
                    charge_id(body)
                ));
                lines.push("  -> response lost on the way back".into());
                lines.push(if keyed {
                    "  -> retry with the same key".into()
                } else {
                    "  -> retry (nothing ties it to the first call)".into()
                });
            }
            Fate::Reset => {
                lines.push("  -> connection reset before it was sent".into());
                lines.push("  -> retry".into());
            }
            Fate::Delivered {
                status,
                body,
                replayed,
            } => {
                let note = match (replayed, keyed) {
                    (true, _) => " (replayed, no new charge)",
                    (false, false) => " (a second charge)",
                    (false, true) => "",
                };
                lines.push(format!(
                    "  -> POST /v1/charges -> {status} charge_id={}{note}",
                    charge_id(body)
                ));
            }
        }
    }
    lines
}

/// Runs both halves of the demo. `progress` is called once per intent finished.
pub async fn run<St: Store + ListRecords + Clone>(
    opts: &Options,
    store: St,
    progress: &(dyn Fn() + Sync),
) -> Result<Report> {
    if !(0.0..=MAX_LOSS).contains(&opts.loss) {
        bail!("--loss must be from 0 to {MAX_LOSS} (the share of responses lost)");
    }
    std::fs::create_dir_all(&opts.dir)
        .with_context(|| format!("cannot create {}", opts.dir.display()))?;

    // Naive: client -> lossy link -> API.
    let naive_db = opts.dir.join("naive.db");
    let api = start_api(&naive_db).await?;
    let listener = listen().await?;
    let naive_link = listener.local_addr()?;
    let log = link::start(listener, api, opts.loss, opts.seed)?;
    let naive = run_intents(naive_link, &log, opts, false, progress).await?;

    // Keyed: client -> lossy link -> gateway -> API, the same coin flips.
    let keyed_db = opts.dir.join("keyed.db");
    let api = start_api(&keyed_db).await?;
    let (gateway, stop) = start_gateway(api, store).await?;
    let listener = listen().await?;
    let keyed_link = listener.local_addr()?;
    let log = link::start(listener, gateway, opts.loss, opts.seed)?;
    let keyed = run_intents(keyed_link, &log, opts, true, progress).await?;
    drop(stop);

    let report = |o: &Outcome, db: &Path| -> Result<RunReport> {
        Ok(RunReport {
            intents: opts.intents,
            attempts: o.attempts,
            counts: api::count(db)?,
            replays_served: o.replays,
            intents_with_charge_id: o.with_charge_id,
            wall_ms: u64::try_from(o.wall.as_millis()).unwrap_or(u64::MAX),
        })
    };
    let mut lines = story(&naive, false);
    let keyed_story = story(&keyed, true);
    if !lines.is_empty() && !keyed_story.is_empty() {
        lines.push(String::new());
    }
    lines.extend(keyed_story);
    Ok(Report {
        intents: opts.intents,
        loss: opts.loss,
        seed: opts.seed,
        naive: report(&naive, &naive_db)?,
        keyed: report(&keyed, &keyed_db)?,
        story: lines,
    })
}

impl Report {
    /// The one screen the demo prints.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} charge intents, {:.0}% of responses lost on the way back, seed {}\n\n",
            self.intents,
            self.loss * 100.0,
            self.seed
        );
        out.push_str(&format!(
            "{:<28}{:>16}{:>16}\n",
            "", "naive retries", "keys + gateway"
        ));
        let mut row = |label: &str, a: String, b: String| {
            out.push_str(&format!("{label:<28}{a:>16}{b:>16}\n"))
        };
        let (n, k) = (&self.naive, &self.keyed);
        row("intents", n.intents.to_string(), k.intents.to_string());
        row("attempts", n.attempts.to_string(), k.attempts.to_string());
        row(
            "charges created",
            n.counts.charges.to_string(),
            k.counts.charges.to_string(),
        );
        row(
            "duplicate charges",
            n.counts.duplicate_charges.to_string(),
            k.counts.duplicate_charges.to_string(),
        );
        row(
            "customers double-charged",
            n.counts.customers_double_charged.to_string(),
            k.counts.customers_double_charged.to_string(),
        );
        row(
            "replays served",
            n.replays_served.to_string(),
            k.replays_served.to_string(),
        );
        row(
            "wall time",
            format!("{} ms", n.wall_ms),
            format!("{} ms", k.wall_ms),
        );
        if !self.story.is_empty() {
            out.push('\n');
            out.push_str(&self.story.join("\n"));
            out.push('\n');
        }
        out.push_str("\n(charges are counted from the payment API's database)\n");
        out
    }
}
