//! The transactional mode under a crash: the real `pg-charges` binary is killed (SIGKILL)
//! after it inserted the charge and stored the result but before it committed. Neither the
//! charge nor the record is visible afterwards; the retry executes once, and the next one
//! replays. Needs PostgreSQL; skips without it unless IDEM_REQUIRE_SERVICES=1.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};

use idem_core::{Key, Scope, Store};
use idem_store_postgres::PgStore;

const PG: &str = "127.0.0.1:5432";

struct Server {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(db: &str, hold: bool) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pg-charges"));
    cmd.args(["--listen", "127.0.0.1:0", "--db", db])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if hold {
        cmd.args(["--hold-before-commit", "60s"]);
    }
    let mut child = cmd.spawn().expect("spawn pg-charges");
    let stdout = child.stdout.take().expect("no stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines
        .next()
        .and_then(Result::ok)
        .expect("pg-charges printed nothing");
    let addr = first
        .rsplit(' ')
        .next()
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    Server { child, lines, addr }
}

async fn charge(addr: &str, key: &str, body: &str) -> Result<(u16, bool, String), reqwest::Error> {
    // The workspace builds reqwest with rustls and no provider of its own (idem mcp's choice):
    // without a default provider, building a client panics.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await?;
    let status = resp.status().as_u16();
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Ok((status, replayed, resp.text().await?))
}

async fn charges(addr: &str) -> usize {
    let text = reqwest::get(format!("http://{addr}/v1/charges"))
        .await
        .expect("list")
        .text()
        .await
        .expect("list");
    let list: Vec<serde_json::Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    list.len()
}

const BODY: &str = r#"{"customer_id":"cus_1","amount_cents":4900}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_effect_and_commit_leaves_neither() {
    if !idem_conformance::server_reachable(
        "a_crash_between_effect_and_commit_leaves_neither",
        "PostgreSQL",
        PG,
    ) {
        return;
    }
    let schema = format!("charges_{:016x}", rand::random::<u64>());
    let db = format!("postgres://postgres@{PG}/test?schema={schema}");

    // 1. The charge is inserted and its result stored, then the process dies uncommitted.
    let mut held = start(&db, true);
    let addr = held.addr.clone();
    let request = tokio::spawn(async move { charge(&addr, "order-1", BODY).await });
    let pid = held.child.id().to_string();
    let line = tokio::task::spawn_blocking(move || {
        let line = held.lines.next();
        (held, line)
    });
    // A request that never reaches the commit (it failed on the way) must fail the test, not
    // hang it: past the bound the server is killed, which ends its output.
    let line = match tokio::time::timeout(std::time::Duration::from_secs(60), line).await {
        Ok(joined) => joined,
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("the server did not reach the commit within 60 s");
        }
    };
    let (mut held, line) = line.unwrap();
    assert!(
        line.and_then(Result::ok)
            .is_some_and(|l| l.contains("holding before commit")),
        "the server never reached the commit"
    );
    let killed = Command::new("kill")
        .args(["-KILL", &held.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let _ = held.child.wait();
    assert!(
        request.await.unwrap().is_err(),
        "the client got an answer from a killed server"
    );

    // 2. Neither the charge nor the record exists.
    let server = start(&db, false);
    assert_eq!(
        charges(&server.addr).await,
        0,
        "the charge survived the crash"
    );
    let store = PgStore::connect_url(&db).await.unwrap();
    let key = Key::new("order-1").unwrap();
    let rec = store.get(&Scope::anonymous(), &key).await.unwrap();
    assert!(rec.is_none(), "the record survived the crash: {rec:?}");

    // 3. The retry executes once; the next one replays it, byte for byte.
    let first = charge(&server.addr, "order-1", BODY).await.unwrap();
    assert_eq!((first.0, first.1), (201, false), "{}", first.2);
    let again = charge(&server.addr, "order-1", BODY).await.unwrap();
    assert_eq!((again.0, again.1, &again.2), (201, true, &first.2));
    let other = charge(
        &server.addr,
        "order-1",
        r#"{"customer_id":"cus_1","amount_cents":1}"#,
    )
    .await
    .unwrap();
    assert_eq!(other.0, 422, "{}", other.2);
    assert_eq!(charges(&server.addr).await, 1);

    // 4. Twenty concurrent requests with one new key: the later ones wait on the first's
    // uncommitted record, then replay it.
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let addr = server.addr.clone();
            tokio::spawn(async move { charge(&addr, "order-2", BODY).await })
        })
        .collect();
    let mut bodies = std::collections::HashSet::new();
    for t in tasks {
        let (status, _, body) = t.await.unwrap().unwrap();
        assert_eq!(status, 201, "{body}");
        bodies.insert(body);
    }
    assert_eq!(bodies.len(), 1);
    assert_eq!(charges(&server.addr).await, 2);

    drop(server);
    let _ = store.drop_schema().await;
}
