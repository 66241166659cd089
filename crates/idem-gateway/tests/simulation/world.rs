//! One run of the simulation: a world built from a seed (clients, gateways on one store, the
//! counting upstream), the chaos the seed decides (link partitions, gateway crashes and
//! restarts), an audit once it is calm again, and what happened, as a trace.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use idem_core::{ListRecords, ManualClock, MemoryStore, Store, Timestamp};
use idem_gateway::proxy::Proxy;
use idem_gateway::{FileConfig, Listeners, Overrides, Settings};
use idem_store_sqlite::{SqliteOptions, SqliteStore};
use metrics_exporter_prometheus::PrometheusBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use turmoil::Sim;
use turmoil::net::TcpListener;

use crate::check;
use crate::client::{self, Answer, GATEWAY_PORT, Outcome, Plan};
use crate::net::{SimConnector, SimListener};
use crate::upstream::{self, Ledger};

/// Which store the gateways share; it outlives every gateway crash, as a durable store does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    /// The memory store: every part of the run on turmoil's thread and clock.
    Memory,
    /// SQLite on a temporary directory: its writer is an OS thread, outside the simulation.
    Sqlite,
}

/// The gateways' configuration: keys required on the charge route, unknown outcomes
/// rejected, a short lease so a crashed gateway's claims are abandoned within the run, and
/// an upstream timeout the upstream sometimes misses.
const CONFIG: &str = r#"
upstream = "http://upstream:80"
[timeouts]
upstream = "2s"
lease = "3s"
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
wait = "1s"
on_unknown = "reject"
"#;

/// Simulated time per step: each step runs every host once, so the tick bounds the run's
/// cost; 10 ms keeps the message delays (1..200 ms) and timeouts (seconds) apart.
const TICK: Duration = Duration::from_millis(10);

/// Where the simulated clock starts (fixed, so a seed's record timestamps repeat too).
const EPOCH_SECS: u64 = 1_800_000_000;

/// What one run did.
#[derive(Debug)]
pub(crate) struct Run {
    /// Every answer, chaos event and upstream execution count, in order: equal for equal seeds
    /// where the run is deterministic.
    pub(crate) trace: Vec<String>,
    /// Every broken invariant.
    pub(crate) violations: Vec<String>,
    /// Attempts the clients made.
    pub(crate) attempts: usize,
    /// Upstream executions.
    pub(crate) executions: u64,
    /// How often each kind of answer and fault happened: what the seeds exercised.
    pub(crate) tally: BTreeMap<String, usize>,
}

/// The shape of a world, drawn from its seed.
struct Shape {
    gateways: usize,
    clients: usize,
    tenants: usize,
    keys_per_tenant: usize,
    intents_per_client: usize,
    max_latency_ms: u64,
}

impl Shape {
    fn draw(rng: &mut StdRng) -> Self {
        Shape {
            gateways: rng.random_range(1..=3),
            clients: rng.random_range(2..=5),
            tenants: rng.random_range(1..=2),
            keys_per_tenant: rng.random_range(2..=6),
            intents_per_client: rng.random_range(2..=6),
            max_latency_ms: rng.random_range(1..=200),
        }
    }
}

/// Runs the world of `seed` on a store of `kind` and checks it.
pub(crate) fn run(seed: u64, kind: StoreKind) -> Run {
    let clock = ManualClock::new(Timestamp::from_millis(EPOCH_SECS as i64 * 1000));
    match kind {
        StoreKind::Memory => run_on(seed, MemoryStore::with_clock(clock.clone()), &clock),
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            let options = SqliteOptions {
                clock: clock.clone(),
                // Simulated time runs while the writer thread works: a generous bound.
                op_timeout: Duration::from_secs(60),
                ..SqliteOptions::default()
            };
            let store = SqliteStore::open_with(dir.path().join("idem.db"), options)
                .unwrap_or_else(|e| panic!("{e}"));
            run_on(seed, store, &clock)
        }
    }
}

fn run_on<St: Store + ListRecords + Clone>(seed: u64, store: St, clock: &Arc<ManualClock>) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = Shape::draw(&mut rng);
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .simulation_duration(Duration::from_secs(3_600))
        .tick_duration(TICK)
        .min_message_latency(Duration::from_millis(shape.max_latency_ms / 2))
        .max_message_latency(Duration::from_millis(shape.max_latency_ms / 2))
        .build();
    let ledger = Rc::new(RefCell::new(Ledger::default()));
    let log = Rc::new(RefCell::new(Vec::<Answer>::new()));
    let mut trace = Vec::new();

    sim.host("upstream", {
        let ledger = ledger.clone();
        move || upstream::serve(ledger.clone(), upstream_delay)
    });
    let settings = settings();
    for g in 0..shape.gateways {
        let (settings, store) = (settings.clone(), store.clone());
        sim.host(format!("gateway-{g}"), move || {
            gateway(settings.clone(), store.clone())
        });
    }
    for c in 0..shape.clients {
        let tenant = format!("Bearer tenant-{}", c % shape.tenants);
        let keys = (0..shape.intents_per_client)
            .map(|_| format!("order-{}", rng.random_range(0..shape.keys_per_tenant)))
            .collect();
        let plan = Plan {
            client: c,
            tenant,
            keys,
            gateways: shape.gateways,
            seed,
        };
        sim.client(format!("client-{c}"), client::run(plan, log.clone()));
    }

    // Each link its own delay, drawn from the seed, the same for every message on it. Not a
    // delay per message: a crash drops the host's tasks in an order that depends on tokio's
    // process-wide task ids (its task list is sharded by id), so the connections it closes
    // would draw their delays from turmoil's generator in an order that differs between two
    // runs of one seed in one process.
    for g in 0..shape.gateways {
        let others = (0..shape.clients)
            .map(|c| format!("client-{c}"))
            .chain(["upstream".to_owned()]);
        for other in others {
            let delay = Duration::from_millis(rng.random_range(1..=shape.max_latency_ms));
            sim.set_link_latency(format!("gateway-{g}"), other, delay);
        }
    }
    let mut chaos = Chaos::new(shape.gateways, shape.clients);
    let finished = loop {
        clock.set(now(&sim));
        match sim.step() {
            Ok(true) => break Ok(()),
            Ok(false) => chaos.step(&mut sim, &mut rng, &mut trace),
            Err(e) => break Err(e.to_string()),
        }
    };
    let mut violations = Vec::new();
    if let Err(e) = finished {
        violations.push(format!("the simulation failed: {e}"));
    }
    chaos.calm(&mut sim, &mut trace);
    let (crashes, partitions) = (chaos.crashes, chaos.partitions);

    // The audit: every intent a client saw completed is asked for once more.
    let completed = check::completed_intents(&log.borrow());
    let auditor = shape.clients;
    let plans: Vec<_> = completed.keys().cloned().collect();
    sim.client("auditor", {
        let log = log.clone();
        let gateways = shape.gateways;
        async move {
            for (i, intent) in plans.into_iter().enumerate() {
                audit(auditor, i % gateways, intent, &log).await;
            }
            Ok(())
        }
    });
    let audited = loop {
        clock.set(now(&sim));
        match sim.step() {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(e) => break Err(e.to_string()),
        }
    };
    if let Err(e) = audited {
        violations.push(format!("the audit failed: {e}"));
    }

    let answers = log.borrow();
    let ledger = ledger.borrow();
    violations.extend(check::violations(&answers, &ledger));
    for intent in completed.keys() {
        let answered = answers.iter().any(|a| {
            a.client == auditor && &a.intent == intent && !matches!(a.outcome, Outcome::NoAnswer(_))
        });
        if !answered {
            violations.push(format!("the audit got no answer for {intent:?}"));
        }
    }
    let mut tally = BTreeMap::from([
        ("gateway crash".to_owned(), crashes),
        ("partition".to_owned(), partitions),
    ]);
    for a in answers.iter() {
        let kind = match &a.outcome {
            Outcome::Completed {
                replayed: false, ..
            } => "executed",
            Outcome::Completed { replayed: true, .. } => "replayed",
            Outcome::Problem { name, .. } => name.as_str(),
            Outcome::Unexpected { .. } => "unexpected",
            Outcome::NoAnswer(_) => "no answer",
        };
        *tally.entry(kind.to_owned()).or_default() += 1;
        trace.push(format!(
            "{}..{} ms client-{} gateway-{} {:?}: {:?}",
            a.sent_ms, a.received_ms, a.client, a.gateway, a.intent, a.outcome
        ));
    }
    for (intent, (n, body)) in &ledger.by_intent {
        trace.push(format!("upstream {intent:?}: {n} x {body:?}"));
    }
    Run {
        trace,
        violations,
        attempts: answers.len(),
        executions: ledger.executions,
        tally,
    }
}

/// Asks for `intent` again until a gateway answers (in-flight: later), through `gateway`.
async fn audit(
    auditor: usize,
    gateway: usize,
    intent: upstream::Intent,
    log: &Rc<RefCell<Vec<Answer>>>,
) {
    for _ in 0..20 {
        let sent_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
        let outcome = client::attempt(gateway, &intent, Duration::from_secs(10)).await;
        let again = matches!(&outcome, Outcome::NoAnswer(_))
            || matches!(&outcome, Outcome::Problem { name, .. } if name == "in-flight");
        log.borrow_mut().push(Answer {
            client: auditor,
            intent: intent.clone(),
            gateway,
            sent_ms,
            received_ms: turmoil::sim_elapsed().unwrap_or_default().as_millis(),
            outcome,
        });
        if !again {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Simulated now, as the stores' clock reads it.
fn now(sim: &Sim<'_>) -> Timestamp {
    Timestamp::from_millis(EPOCH_SECS as i64 * 1000 + sim.elapsed().as_millis() as i64)
}

/// How long the upstream takes over execution `n`: mostly quick, one in seven past the
/// gateway's upstream timeout (2 s).
fn upstream_delay(n: u64) -> Duration {
    match n % 7 {
        0 => Duration::from_millis(2_500),
        k => Duration::from_millis(20 * k),
    }
}

fn settings() -> Settings {
    let file = FileConfig::parse(CONFIG).unwrap_or_else(|e| panic!("{e:#}"));
    let any: std::net::SocketAddr = ([0, 0, 0, 0], GATEWAY_PORT).into();
    Settings::resolve(
        file,
        Overrides {
            listen: Some(any),
            admin_listen: Some(([0, 0, 0, 0], ADMIN_PORT).into()),
            store: Some("memory:".into()),
            ..Overrides::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"))
}

const ADMIN_PORT: u16 = 9090;

/// A gateway host's software: `serve_on` with simulated listeners and upstream connector.
/// A crash drops it; a restart runs it again on the same store.
async fn gateway<St: Store + ListRecords + Clone>(
    settings: Settings,
    store: St,
) -> turmoil::Result {
    let proxy = Proxy::with_connector(&settings, SimConnector);
    let listeners = Listeners {
        proxy: SimListener(TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?),
        admin: SimListener(TcpListener::bind(("0.0.0.0", ADMIN_PORT)).await?),
    };
    // Not installed: the metrics recorder is global.
    let metrics = PrometheusBuilder::new().build_recorder().handle();
    idem_gateway::serve_on(
        settings,
        store,
        metrics,
        proxy,
        listeners,
        std::future::pending(),
    )
    .await;
    Ok(())
}

/// The faults the seed injects while the clients run, decided at every step.
struct Chaos {
    /// Per gateway: down until this simulated millisecond (a crash), or up.
    down_until: Vec<Option<u64>>,
    /// Partitioned links and the millisecond each heals at.
    cut: Vec<(String, String, u64)>,
    clients: usize,
    crashes: usize,
    partitions: usize,
}

/// Mean simulated time between gateway crashes, and between new partitions.
const CRASH_EVERY_MS: u32 = 4_000;
const PARTITION_EVERY_MS: u32 = 1_500;

impl Chaos {
    fn new(gateways: usize, clients: usize) -> Self {
        Chaos {
            down_until: vec![None; gateways],
            cut: Vec::new(),
            clients,
            crashes: 0,
            partitions: 0,
        }
    }

    fn step(&mut self, sim: &mut Sim<'_>, rng: &mut StdRng, trace: &mut Vec<String>) {
        let t = sim.elapsed().as_millis() as u64;
        let tick = TICK.as_millis() as u32;
        for (g, down) in self.down_until.iter_mut().enumerate() {
            if down.is_some_and(|until| until <= t) {
                *down = None;
                sim.bounce(format!("gateway-{g}"));
                trace.push(format!("{t} ms: gateway-{g} restarts"));
            }
        }
        self.cut.retain(|(a, b, until)| {
            let heal = *until <= t;
            if heal {
                sim.repair(a.as_str(), b.as_str());
                trace.push(format!("{t} ms: {a} <-> {b} repaired"));
            }
            !heal
        });
        if rng.random_ratio(tick, CRASH_EVERY_MS) {
            let g = rng.random_range(0..self.down_until.len());
            if self.down_until[g].is_none() {
                self.down_until[g] = Some(t + rng.random_range(100..4_000));
                sim.crash(format!("gateway-{g}"));
                self.crashes += 1;
                trace.push(format!("{t} ms: gateway-{g} crashes"));
            }
        }
        if rng.random_ratio(tick, PARTITION_EVERY_MS) {
            let g = format!("gateway-{}", rng.random_range(0..self.down_until.len()));
            let other = match rng.random_range(0..=self.clients) {
                0 => "upstream".to_owned(),
                c => format!("client-{}", c - 1),
            };
            if !self.cut.iter().any(|(a, b, _)| *a == g && *b == other) {
                sim.partition(g.as_str(), other.as_str());
                self.partitions += 1;
                let until = t + rng.random_range(50..3_000);
                trace.push(format!("{t} ms: {g} <-> {other} partitioned"));
                self.cut.push((g, other, until));
            }
        }
    }

    /// Heals every link and restarts every crashed gateway: the calm the audit runs in.
    fn calm(&mut self, sim: &mut Sim<'_>, trace: &mut Vec<String>) {
        for (a, b, _) in self.cut.drain(..) {
            sim.repair(a.as_str(), b.as_str());
        }
        for (g, down) in self.down_until.iter_mut().enumerate() {
            if down.take().is_some() {
                sim.bounce(format!("gateway-{g}"));
            }
        }
        trace.push("calm: every link repaired, every gateway up".into());
    }
}
