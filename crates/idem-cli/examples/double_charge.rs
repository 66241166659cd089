//! The seed's double charge, in one process: `cargo run --release --example double_charge`.
//!
//! An agent charges 200 customers through a `charge_card` tool. On 30% of calls the charge
//! lands but the response is lost on the way back, and the agent retries. Run once without
//! keys (every retry charges again) and once through idem's engine on the embedded SQLite store
//! (the retry gets the original charge back). Flags: `--intents N --loss P --seed S --db PATH`.
//!
//! The HTTP version, with the gateway in front of a real payment API, is `idem demo` (coming);
//! this one shows the engine and the store alone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_core::{
    Answer, Effect, Engine, Fingerprint, Key, Policy, Scope, StoredBody, StoredResponse,
};
use idem_store_sqlite::SqliteStore;

/// The payment provider: not idempotent, like most APIs an agent calls.
#[derive(Default)]
struct Ledger {
    charges: Mutex<Vec<(String, u64)>>,
}

impl Ledger {
    fn charge(&self, customer: &str, amount: u64) -> String {
        let mut charges = self.charges.lock().unwrap_or_else(|p| p.into_inner());
        charges.push((customer.to_owned(), amount));
        format!("ch_{}", charges.len())
    }

    /// (charges, duplicate charges, customers charged more than once)
    fn tally(&self) -> (usize, usize, usize) {
        let charges = self.charges.lock().unwrap_or_else(|p| p.into_inner());
        let mut per: HashMap<&str, usize> = HashMap::new();
        for (c, _) in charges.iter() {
            *per.entry(c).or_default() += 1;
        }
        let dupes = per.values().map(|n| n - 1).sum();
        (
            charges.len(),
            dupes,
            per.values().filter(|n| **n > 1).count(),
        )
    }
}

/// A seeded coin: does this response get lost on the way back?
struct Link(u64);

impl Link {
    fn loses(&mut self, p: f64) -> bool {
        // xorshift64*: deterministic for a seed, good enough for a coin.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        (x as f64 / (1u64 << 53) as f64) < p
    }
}

struct Run {
    attempts: usize,
    replays: usize,
    charges: usize,
    duplicates: usize,
    customers_hit: usize,
    wall: Duration,
}

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    match args
        .iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
    {
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("error: {name} {v:?} is not valid");
            std::process::exit(2)
        }),
        None => default,
    }
}

#[tokio::main]
async fn main() {
    let intents: usize = arg("--intents", 200);
    let loss: f64 = arg("--loss", 0.3);
    let seed: u64 = arg("--seed", 42).max(1);
    let db: String = arg("--db", "double_charge.db".to_owned());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{db}{suffix}"));
    }
    let store = match SqliteStore::open(&db) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    };
    let engine = Engine::new(store);
    let policy = Policy::default();
    let scope = Scope::new("agent:run-1").unwrap_or_else(|_| Scope::anonymous());

    // Naive: the agent retries a lost response, and the provider charges again.
    let (ledger, mut link, start) = (Ledger::default(), Link(seed), Instant::now());
    let mut attempts = 0;
    for i in 0..intents {
        loop {
            attempts += 1;
            ledger.charge(&format!("cus_{i}"), 4900);
            if !link.loses(loss) {
                break;
            }
        }
    }
    let (charges, duplicates, customers_hit) = ledger.tally();
    let naive = Run {
        attempts,
        replays: 0,
        charges,
        duplicates,
        customers_hit,
        wall: start.elapsed(),
    };

    // With idem: the key is derived once, at the point of intent, and reused on every retry.
    let (ledger, mut link, start) = (Ledger::default(), Link(seed), Instant::now());
    let (mut attempts, mut replays) = (0, 0);
    let mut story = Vec::new();
    for i in 0..intents {
        let customer = format!("cus_{i}");
        let key =
            Key::new(format!("turn_1-charge_card-{customer}")).unwrap_or_else(|e| panic!("{e}"));
        let body = format!(r#"{{"customer_id":"{customer}","amount_cents":4900}}"#);
        let fp = Fingerprint::http(
            "POST",
            "/v1/charges",
            Some("application/json"),
            body.as_bytes(),
        );
        let mut lines = Vec::new();
        loop {
            attempts += 1;
            let answer = engine
                .run(scope.clone(), key.clone(), fp, &policy, || async {
                    Effect::Done(StoredResponse::new(200, ledger.charge(&customer, 4900)))
                })
                .await;
            let (charge_id, replayed) = match answer {
                Ok(Answer::Executed { response, .. }) => (body_text(&response), false),
                Ok(Answer::Replayed(r)) => {
                    (r.response.as_ref().map(body_text).unwrap_or_default(), true)
                }
                Ok(other) => panic!("unexpected answer {other:?}"),
                Err(e) => {
                    eprintln!("error: store failed, nothing charged: {e}");
                    std::process::exit(1)
                }
            };
            replays += usize::from(replayed);
            let lost = link.loses(loss);
            lines.push(format!(
                "  -> 200 charge_id={charge_id}{}{}",
                if replayed {
                    " (replayed, no new charge)"
                } else {
                    ""
                },
                if lost {
                    "\n  -> response lost; retry with the same key"
                } else {
                    ""
                }
            ));
            if !lost {
                break;
            }
        }
        // Tell the story of the first intent whose response was lost.
        if story.is_empty() && lines.len() > 1 {
            story = std::iter::once(format!("charge_card(key={key})"))
                .chain(lines)
                .collect();
        }
    }
    let (charges, duplicates, customers_hit) = ledger.tally();
    let keyed = Run {
        attempts,
        replays,
        charges,
        duplicates,
        customers_hit,
        wall: start.elapsed(),
    };

    println!(
        "{intents} charge intents, {:.0}% of responses lost on the way back, seed {seed}\n",
        loss * 100.0
    );
    println!("{:<28}{:>14}{:>14}", "", "naive retries", "idem (sqlite)");
    let row = |label: &str, a: String, b: String| println!("{label:<28}{a:>14}{b:>14}");
    row(
        "attempts",
        naive.attempts.to_string(),
        keyed.attempts.to_string(),
    );
    row(
        "charges created",
        naive.charges.to_string(),
        keyed.charges.to_string(),
    );
    row(
        "duplicate charges",
        naive.duplicates.to_string(),
        keyed.duplicates.to_string(),
    );
    row(
        "customers double-charged",
        naive.customers_hit.to_string(),
        keyed.customers_hit.to_string(),
    );
    row(
        "replays served",
        naive.replays.to_string(),
        keyed.replays.to_string(),
    );
    row(
        "wall time",
        format!("{:.1?}", naive.wall),
        format!("{:.1?}", keyed.wall),
    );
    if !story.is_empty() {
        println!("\none intent's story:\n{}", story.join("\n"));
    }
    println!(
        "\nrecords are in {db}: try `idem inspect --store sqlite:{db} --scope agent:run-1 turn_1-charge_card-cus_0`"
    );
    if keyed.charges != intents || keyed.duplicates != 0 {
        eprintln!("error: idem let a duplicate through");
        std::process::exit(1);
    }
}

fn body_text(r: &StoredResponse) -> String {
    match &r.body {
        StoredBody::Full(b) => String::from_utf8_lossy(b).into_owned(),
        StoredBody::Omitted { len, .. } => format!("<{len} bytes>"),
    }
}
