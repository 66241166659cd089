//! `idem mcp` end to end: an rmcp client talks to the real `idem` binary, which spawns (stdio)
//! or connects to (streamable HTTP) the example MCP server `idem example-mcp`, whose charges
//! are rows in a SQLite file counted here.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

type Client = RunningService<RoleClient, ()>;

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

fn charges(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open(db).expect("open the example database");
    conn.query_row("SELECT COUNT(*) FROM charges", [], |r| r.get(0))
        .expect("count charges")
}

fn args(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

async fn call(client: &Client, tool: &'static str, a: Value) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args(a)))
        .await
        .expect("tools/call answered")
}

fn idem_meta(r: &CallToolResult) -> Value {
    r.meta
        .as_ref()
        .and_then(|m| m.0.get("idem"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn problem(r: &CallToolResult) -> Option<String> {
    idem_meta(r)
        .get("problem")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

struct Dir {
    _tmp: tempfile::TempDir,
    store: PathBuf,
    db: PathBuf,
}

fn dir() -> Dir {
    let tmp = tempfile::tempdir().expect("tempdir");
    Dir {
        store: tmp.path().join("idem.db"),
        db: tmp.path().join("charges.db"),
        _tmp: tmp,
    }
}

async fn stdio_proxy(d: &Dir) -> Client {
    let mut cmd = tokio::process::Command::new(IDEM);
    cmd.arg("mcp")
        .arg("--store")
        .arg(format!("sqlite:{}", d.store.display()))
        .arg("--")
        .arg(IDEM)
        .arg("example-mcp")
        .arg("--db")
        .arg(&d.db);
    let child = TokioChildProcess::new(cmd).expect("spawn idem mcp");
    ().serve(child).await.expect("initialize through the proxy")
}

/// A child process killed when the test ends, and the address it announced.
struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `idem ARGS` and reads the `http://ADDR/mcp` URL from its first line.
fn spawn_http(args: &[&str]) -> Server {
    let mut child = Command::new(IDEM)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn idem");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the announcement");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(|w| w.trim_end_matches(';').to_owned())
        .unwrap_or_else(|| panic!("no URL in {line:?}"));
    Server(child, url)
}

/// `idem example-mcp` over HTTP on `d`'s database and `idem mcp` in front of it on `d`'s
/// store, with `extra` arguments: the upstream, the proxy and the store URL.
fn behind_http_proxy(d: &Dir, extra: &[&str]) -> (Server, Server, String) {
    let db = d.db.display().to_string();
    let upstream = spawn_http(&["example-mcp", "--listen", "127.0.0.1:0", "--db", &db]);
    let store = format!("sqlite:{}", d.store.display());
    let proxy = http_proxy(&upstream.1, &store, extra);
    (upstream, proxy, store)
}

/// What `idem inspect --principal PRINCIPAL KEY` prints (on a key it does not know: the
/// error).
fn inspect(store: &str, principal: &str, key: &str) -> String {
    let out = Command::new(IDEM)
        .args(["inspect", "--store", store, "--principal", principal, key])
        .output()
        .expect("idem inspect");
    let text = if out.status.success() {
        out.stdout
    } else {
        out.stderr
    };
    String::from_utf8_lossy(&text).into_owned()
}

/// `idem mcp` over HTTP in front of `upstream`, on `store`, with `extra` arguments.
fn http_proxy(upstream: &str, store: &str, extra: &[&str]) -> Server {
    let mut args = vec!["mcp", "--listen", "127.0.0.1:0", "--upstream-url", upstream];
    args.extend(["--store", store]);
    args.extend(extra);
    spawn_http(&args)
}

async fn http_client(url: &str, token: &str) -> Client {
    http_client_as(url, "authorization", &format!("Bearer {token}")).await
}

/// A client that names itself with the header `name: value`.
async fn http_client_as(url: &str, name: &'static str, value: &str) -> Client {
    // rmcp's HTTP client is reqwest with rustls, whose crypto provider the workspace picks.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut headers = HashMap::new();
    headers.insert(
        http::HeaderName::from_static(name),
        http::HeaderValue::from_str(value).expect("header"),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("initialize over HTTP")
}

fn schema_of(tools: &[Tool], name: &str) -> Value {
    let t = tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tool {name}"));
    Value::Object((*t.input_schema).clone())
}

/// The checks of the issue, through any connected client.
async fn same_key_replays_and_refusals_charge_nothing(client: &Client, db: &Path) {
    let tools = client.list_all_tools().await.expect("tools/list");
    for effect in ["charge_card", "send_email"] {
        let s = schema_of(&tools, effect);
        assert_eq!(s["properties"]["idempotency_key"]["type"], "string");
        assert!(
            s["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("idempotency_key"))),
            "{s}"
        );
    }
    assert_eq!(
        schema_of(&tools, "get_balance")["properties"].get("idempotency_key"),
        None
    );

    let charge =
        json!({"customer": "cus_1", "amount_cents": 4900, "idempotency_key": "turn-1-charge"});
    let first = call(client, "charge_card", charge.clone()).await;
    assert_ne!(first.is_error, Some(true), "{first:?}");
    assert_eq!(idem_meta(&first), Value::Null);
    let second = call(client, "charge_card", charge).await;
    assert_eq!(second.content, first.content);
    assert_eq!(second.structured_content, first.structured_content);
    assert_eq!(
        idem_meta(&second),
        json!({"replayed": true, "key": "turn-1-charge"})
    );
    assert_eq!(charges(db), 1);

    let changed = call(
        client,
        "charge_card",
        json!({"customer": "cus_1", "amount_cents": 5000, "idempotency_key": "turn-1-charge"}),
    )
    .await;
    assert_eq!(changed.is_error, Some(true));
    assert_eq!(problem(&changed).as_deref(), Some("key-reused"));

    let no_key = call(
        client,
        "charge_card",
        json!({"customer": "cus_1", "amount_cents": 4900}),
    )
    .await;
    assert_eq!(no_key.is_error, Some(true));
    assert_eq!(problem(&no_key).as_deref(), Some("key-missing"));
    assert_eq!(charges(db), 1);

    // The key may come in _meta instead of the arguments.
    let mut meta = rmcp::model::RequestMetaObject::default();
    meta.0
        .0
        .insert("idempotency_key".into(), json!("turn-2-email"));
    let mut p = CallToolRequestParams::new("send_email").with_arguments(args(
        json!({"to": "a@example.com", "subject": "receipt", "body": "thanks"}),
    ));
    p.meta = Some(meta);
    let email = client.call_tool(p.clone()).await.expect("send_email");
    assert_ne!(email.is_error, Some(true), "{email:?}");
    let again = client.call_tool(p).await.expect("send_email again");
    assert_eq!(idem_meta(&again)["replayed"], true);

    // The read tool passes straight through: no key needed, nothing added.
    let balance = call(client, "get_balance", json!({"customer": "cus_1"})).await;
    assert_ne!(balance.is_error, Some(true), "{balance:?}");
    assert_eq!(idem_meta(&balance), Value::Null);
    assert_eq!(
        balance.structured_content,
        Some(json!({"customer": "cus_1", "charges": 1, "total_cents": 4900}))
    );
}

#[tokio::test]
async fn stdio_proxy_dedups_effect_tools() {
    let d = dir();
    let client = stdio_proxy(&d).await;
    same_key_replays_and_refusals_charge_nothing(&client, &d.db).await;
    let _ = client.cancel().await;

    // A runtime that restarted reconnects through a new proxy process: same scope, so the
    // same key still replays ([design §8](docs/design.md#8-mcp)).
    let client = stdio_proxy(&d).await;
    let replay = call(
        &client,
        "charge_card",
        json!({"customer": "cus_1", "amount_cents": 4900, "idempotency_key": "turn-1-charge"}),
    )
    .await;
    assert_eq!(idem_meta(&replay)["replayed"], true);
    assert_eq!(charges(&d.db), 1);
    let _ = client.cancel().await;
}

/// `--upstream-cmd` (and `IDEM_MCP_UPSTREAM`): the upstream's command line as one value, split
/// as a shell splits words, for launchers that drop a `--` (the MCP Inspector's CLI).
#[tokio::test]
async fn the_upstream_given_as_one_command_line_is_split_as_a_shell_would() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A path with a space and a quote: the command line must quote it for the proxy to work.
    let spaced = tmp.path().join("my charges's dir");
    std::fs::create_dir(&spaced).expect("mkdir");
    let d = Dir {
        store: tmp.path().join("idem.db"),
        db: spaced.join("charges.db"),
        _tmp: tmp,
    };
    let line = format!(
        "{IDEM} example-mcp --db \"{}\"",
        d.db.display().to_string().replace('"', "\\\"")
    );
    for from_env in [false, true] {
        let mut cmd = tokio::process::Command::new(IDEM);
        cmd.arg("mcp")
            .arg("--store")
            .arg(format!("sqlite:{}", d.store.display()));
        if from_env {
            cmd.env("IDEM_MCP_UPSTREAM", &line);
        } else {
            cmd.arg("--upstream-cmd").arg(&line);
        }
        let client = ().serve(TokioChildProcess::new(cmd).expect("spawn idem mcp")).await;
        let client = client.expect("initialize through the proxy");
        let charge =
            json!({"customer": "cus_1", "amount_cents": 4900, "idempotency_key": "one-line"});
        let result = call(&client, "charge_card", charge).await;
        assert_ne!(result.is_error, Some(true), "{result:?}");
        // The second launch replays the first's charge.
        let replayed = idem_meta(&result)["replayed"].as_bool().unwrap_or(false);
        assert_eq!(replayed, from_env, "{result:?}");
        let _ = client.cancel().await;
    }
    assert_eq!(charges(&d.db), 1);

    // Bad lines are refused with what is wrong, before anything is spawned; so is the
    // upstream given twice.
    for (args, wanted) in [
        (
            vec!["--upstream-cmd", "server 'unclosed"],
            "unbalanced quotes",
        ),
        (vec!["--upstream-cmd", "   "], "--upstream-cmd is empty"),
        (
            vec!["--upstream-cmd", "a", "--", "b"],
            "cannot be used with",
        ),
        (
            vec!["--upstream-cmd", "server --token #abc"],
            "starts with #",
        ),
        (vec![], "name the upstream MCP server"),
    ] {
        let out = Command::new(IDEM)
            .args(["mcp", "--store", "memory:"])
            .args(&args)
            .env_remove("IDEM_MCP_UPSTREAM")
            .stdin(Stdio::null())
            .output()
            .expect("run idem mcp");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(wanted), "{args:?}: {stderr}");
    }

    // IDEM_MCP_UPSTREAM only stands in where the command line names no upstream: an upstream
    // after -- wins over it (no conflict), and the upstream never inherits it (an `idem mcp`
    // there would spawn the same command again).
    let seen = tempfile::tempdir().expect("tempdir");
    for (args, file) in [
        (vec![], "from-env"),
        (vec!["--", "sh", "-c", "env > after-dashes"], "after-dashes"),
    ] {
        let out = Command::new(IDEM)
            .args(["mcp", "--store", "memory:"])
            .args(&args)
            .env("IDEM_MCP_UPSTREAM", "sh -c 'env > from-env'")
            .current_dir(seen.path())
            .stdin(Stdio::null())
            .output()
            .expect("run idem mcp");
        let env = std::fs::read_to_string(seen.path().join(file))
            .unwrap_or_else(|e| panic!("{args:?}: the upstream did not run ({e}): {out:?}"));
        assert!(env.contains("PATH="), "{env}");
        assert!(!env.contains("IDEM_MCP_UPSTREAM"), "{args:?}: {env}");
    }
}

#[tokio::test]
async fn a_cancelled_call_still_completes_and_its_retry_replays() {
    let d = dir();
    let client = stdio_proxy(&d).await;
    let slow = json!({"customer": "cus_2", "amount_cents": 700, "delay_ms": 1500, "idempotency_key": "slow-1"});
    // The client gives up after 300 ms: rmcp sends notifications/cancelled to the proxy.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        call(&client, "charge_card", slow.clone()),
    )
    .await;
    assert!(gave_up.is_err(), "the slow charge answered too soon");
    // The retry finds the call in flight, waits for it, and gets its stored result.
    let retry = call(&client, "charge_card", slow).await;
    assert_ne!(retry.is_error, Some(true), "{retry:?}");
    assert_eq!(idem_meta(&retry)["replayed"], true);
    assert_eq!(charges(&d.db), 1);
    let _ = client.cancel().await;
}

#[tokio::test]
async fn http_proxy_dedups_per_caller() {
    let d = dir();
    let (_upstream, proxy, _) = behind_http_proxy(&d, &[]);
    let alice = http_client(&proxy.1, "alice").await;
    same_key_replays_and_refusals_charge_nothing(&alice, &d.db).await;

    // Another caller's keys are another scope: the same key is a new intent of theirs.
    let bob = http_client(&proxy.1, "bob").await;
    let charge =
        json!({"customer": "cus_1", "amount_cents": 4900, "idempotency_key": "turn-1-charge"});
    let theirs = call(&bob, "charge_card", charge.clone()).await;
    assert_eq!(idem_meta(&theirs), Value::Null);
    assert_eq!(charges(&d.db), 2);
    // And a new session of the first caller still gets its replay.
    let alice_again = http_client(&proxy.1, "alice").await;
    let replay = call(&alice_again, "charge_card", charge).await;
    assert_eq!(idem_meta(&replay)["replayed"], true);
    assert_eq!(charges(&d.db), 2);
    for c in [alice, bob, alice_again] {
        let _ = c.cancel().await;
    }
}

/// Callers are named as `idem serve` names them by default (credentials, cookies, API-key
/// headers), not by `Authorization` alone: two callers with their own `x-api-key`, or their
/// own session cookie, are two scopes, and the same key is a new intent for each.
#[tokio::test]
async fn http_callers_are_named_by_the_gateways_default_scope_headers() {
    let d = dir();
    let (_upstream, proxy, store) = behind_http_proxy(&d, &[]);
    let charge = json!({"customer": "cus_k", "amount_cents": 100, "idempotency_key": "k-1"});
    let mut clients = Vec::new();
    for (n, (name, value)) in [
        ("x-api-key", "key-of-alice"),
        ("x-api-key", "key-of-bob"),
        ("cookie", "session=carol"),
    ]
    .into_iter()
    .enumerate()
    {
        let c = http_client_as(&proxy.1, name, value).await;
        let first = call(&c, "charge_card", charge.clone()).await;
        assert_eq!(idem_meta(&first), Value::Null, "{name}: {value}: {first:?}");
        assert_eq!(charges(&d.db), n as i64 + 1);
        clients.push(c);
    }
    // The same caller again, in a new session: a replay.
    let alice = http_client_as(&proxy.1, "x-api-key", "key-of-alice").await;
    let replay = call(&alice, "charge_card", charge).await;
    assert_eq!(idem_meta(&replay)["replayed"], true);
    assert_eq!(charges(&d.db), 3);
    // `idem inspect --principal` finds the caller's record with the same defaults.
    assert!(inspect(&store, "x-api-key: key-of-bob", "k-1").contains("completed"));
    clients.push(alice);
    for c in clients {
        let _ = c.cancel().await;
    }
}

/// A caller that sends none of the scope headers names no one: its effect calls are refused
/// (`principal-missing`, nothing charged) as `idem serve` refuses such keyed requests, unless
/// `--anonymous allow` puts every such caller in one shared scope. `--scope-cookie` names a
/// caller by its session cookie alone, so the rest of its cookie jar may change between
/// retries (two anonymous clients shared one scope before, and one got the other's charge
/// replayed).
#[tokio::test]
async fn http_callers_naming_no_one_are_refused_unless_allowed() {
    let d = dir();
    let charge = json!({"customer": "cus_a", "amount_cents": 100, "idempotency_key": "x-1"});
    let (_upstream, proxy, _) = behind_http_proxy(&d, &[]);
    let nobody = http_client_as(&proxy.1, "x-request-id", "r-1").await;
    let refused = call(&nobody, "charge_card", charge.clone()).await;
    assert_eq!(problem(&refused).as_deref(), Some("principal-missing"));
    assert_eq!(charges(&d.db), 0);
    let balance = call(&nobody, "get_balance", json!({"customer": "cus_a"})).await;
    assert_ne!(balance.is_error, Some(true), "a read passes: {balance:?}");
    let _ = nobody.cancel().await;

    let (_upstream, proxy, _) = behind_http_proxy(&d, &["--scope-cookie", "session"]);
    let carol = http_client_as(&proxy.1, "cookie", "session=carol; theme=dark").await;
    assert_eq!(
        idem_meta(&call(&carol, "charge_card", charge.clone()).await),
        Value::Null
    );
    let carol_again = http_client_as(&proxy.1, "cookie", "theme=light; session=carol").await;
    let replay = call(&carol_again, "charge_card", charge.clone()).await;
    assert_eq!(idem_meta(&replay)["replayed"], true, "{replay:?}");
    let crumbs = http_client_as(&proxy.1, "cookie", "theme=dark").await;
    let refused = call(&crumbs, "charge_card", charge.clone()).await;
    assert_eq!(problem(&refused).as_deref(), Some("principal-missing"));
    assert_eq!(charges(&d.db), 1);
    for c in [carol, carol_again, crumbs] {
        let _ = c.cancel().await;
    }

    let (_upstream, proxy, _) = behind_http_proxy(&d, &["--anonymous", "allow"]);
    let anon = http_client_as(&proxy.1, "x-request-id", "r-2").await;
    let other = json!({"customer": "cus_b", "amount_cents": 100, "idempotency_key": "x-2"});
    assert_eq!(
        idem_meta(&call(&anon, "charge_card", other.clone()).await),
        Value::Null
    );
    let anon_too = http_client_as(&proxy.1, "x-request-id", "r-3").await;
    let shared = call(&anon_too, "charge_card", other).await;
    assert_eq!(
        idem_meta(&shared)["replayed"],
        true,
        "allowed anonymous callers share a scope"
    );
    assert_eq!(charges(&d.db), 2);
    for c in [anon, anon_too] {
        let _ = c.cancel().await;
    }
}

/// `idem mcp` over stdio on `d`'s store in front of `upstream` (a program and its
/// arguments), driven line by line, as a client that may leave or stop it at any moment.
struct RawStdio {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl RawStdio {
    /// Starts the proxy and initializes the session: `initialize`, its answer, then
    /// `notifications/initialized`.
    fn start(d: &Dir, upstream: &[&std::ffi::OsStr]) -> Self {
        let mut child = Command::new(IDEM)
            .arg("mcp")
            .arg("--store")
            .arg(format!("sqlite:{}", d.store.display()))
            .arg("--")
            .args(upstream)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn idem mcp");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut proxy = RawStdio {
            child,
            stdin,
            stdout,
        };
        proxy.send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        );
        let mut line = String::new();
        proxy
            .stdout
            .read_line(&mut line)
            .expect("initialize answered");
        let answered: Value = serde_json::from_str(&line).expect("a JSON-RPC answer");
        assert_eq!(answered["id"], 1, "{line}");
        proxy.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        proxy
    }

    fn send(&mut self, v: Value) {
        use std::io::Write;
        let stdin = self
            .stdin
            .as_mut()
            .expect("the client's side is still open");
        writeln!(stdin, "{v}").expect("write to the proxy");
        stdin.flush().expect("flush");
    }

    /// The client goes away: the proxy's stdin closes.
    fn close(&mut self) {
        self.stdin = None;
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill -TERM");
        assert!(status.success());
    }

    /// Waits for the proxy to exit; kills it and panics with `why` past `bound`.
    async fn exits_within(&mut self, bound: Duration, why: &str) {
        let deadline = std::time::Instant::now() + bound;
        while self.child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("the proxy did not exit within {bound:?} ({why})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A client that sends a slow charge and goes away before the answer (it closes the proxy's
/// stdin, or the proxy gets SIGTERM): the proxy lets the forwarded call finish and stores it
/// before it exits, so the runtime, restarted, gets the result through a new proxy instead of
/// an unknown outcome.
#[tokio::test]
async fn a_client_that_goes_away_mid_call_finds_the_result_stored() {
    leave_mid_call(false, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_proxy_stopped_mid_call_stores_the_result_first() {
    leave_mid_call(true, Duration::from_millis(300)).await;
}

/// The client goes away, or the proxy is stopped, right after the call is written: before
/// the proxy has claimed the key, while it still asks the upstream what the tool is. The
/// call is either never started (the retry runs it) or finished and stored (the retry
/// replays it); never left in flight with its answer unread, and the proxy exits at once.
#[tokio::test]
async fn a_proxy_stopped_as_a_call_arrives_finishes_it_or_never_starts_it() {
    for sigterm in [false, true, false, true, false, true] {
        leave_mid_call(sigterm, Duration::ZERO).await;
    }
}

async fn leave_mid_call(sigterm: bool, pause: Duration) {
    let d = dir();
    let mut proxy = RawStdio::start(
        &d,
        &[
            IDEM.as_ref(),
            "example-mcp".as_ref(),
            "--db".as_ref(),
            d.db.as_os_str(),
        ],
    );
    // Not listed first: the proxy asks the upstream what charge_card is.
    proxy.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "charge_card",
        "arguments": {"customer": "cus_3", "amount_cents": 300, "delay_ms": 1000,
                      "idempotency_key": "gone-1"}}}),
    );
    tokio::time::sleep(pause).await;
    if sigterm {
        proxy.terminate();
    } else {
        proxy.close(); // the client is gone
    }
    // The call takes 1 s; the proxy's drain allows 30 s, a forwarded call 300 s.
    proxy
        .exits_within(
            Duration::from_secs(10),
            &format!("sigterm: {sigterm}, pause: {pause:?}"),
        )
        .await;
    let ran = charges(&d.db);
    // Left after a pause, the call had certainly started.
    assert!(ran == 1 || (ran == 0 && pause.is_zero()), "{ran} charges");

    let client = stdio_proxy(&d).await;
    let replay = call(
        &client,
        "charge_card",
        json!({"customer": "cus_3", "amount_cents": 300, "delay_ms": 1000, "idempotency_key": "gone-1"}),
    )
    .await;
    assert_ne!(replay.is_error, Some(true), "{replay:?}");
    let replayed = if ran == 1 { json!(true) } else { Value::Null };
    assert_eq!(idem_meta(&replay)["replayed"], replayed, "{replay:?}");
    assert_eq!(charges(&d.db), 1);
    let _ = client.cancel().await;
}

/// An upstream that answers `initialize`, then exits on the next request: here the proxy's
/// own `tools/list`, asked to learn what an unlisted tool is.
const DIES_ON_SECOND_REQUEST: &str = r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "dies", "version": "0"}}}), flush=True)
    elif "id" in m:
        sys.exit(0)
"#;

/// The upstream exits while the proxy is still looking a call's tool up: the call is then
/// never sent (nothing reads an answer from an upstream whose output has ended), its key is
/// released, and the proxy exits at once rather than after the drain's 30 s, with the key
/// left in flight by a call that waited for an answer nobody would read.
#[tokio::test]
async fn an_upstream_that_exits_mid_lookup_leaves_no_key_behind() {
    let d = dir();
    let mut proxy = RawStdio::start(
        &d,
        &[
            "python3".as_ref(),
            "-c".as_ref(),
            DIES_ON_SECOND_REQUEST.as_ref(),
        ],
    );
    proxy.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "charge_card",
        "arguments": {"customer": "cus_4", "amount_cents": 400, "idempotency_key": "dies-1"}}}),
    );
    proxy
        .exits_within(Duration::from_secs(10), "the upstream exited mid-call")
        .await;
    let out = Command::new(IDEM)
        .args(["inspect", "--store"])
        .arg(format!("sqlite:{}", d.store.display()))
        .args(["--scope", "mcp", "dies-1"])
        .output()
        .expect("idem inspect");
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the key was left behind: {said}");
    assert!(said.contains("no record"), "{said}");
}

/// A TLS front for `target` (a loopback address) with a certificate for `localhost` signed by
/// a fresh CA, whose PEM is written to `ca_path`. Returns the front's port. It runs on the
/// test's runtime, so the test must be multi-threaded: `spawn_http` blocks its thread reading
/// the proxy's first line while the proxy's startup request waits for this front's handshake.
async fn tls_front(target: std::net::SocketAddr, ca_path: &Path) -> u16 {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio_rustls::rustls;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    std::fs::write(ca_path, ca.pem()).expect("write the CA");
    let leaf_key = KeyPair::generate().expect("key");
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .signed_by(&leaf_key, &ca)
        .expect("leaf");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).expect("key der"),
        )
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    port
}

/// Runs `idem mcp` over HTTP in front of `url`, which must stop it within 90 s (its patience
/// is 10 s) with a failure; returns its stderr, with the proxy's debug log.
async fn proxy_that_fails_to_start(url: &str, store: &str) -> String {
    let mut cmd = tokio::process::Command::new(IDEM);
    cmd.args(["mcp", "--listen", "127.0.0.1:0", "--upstream-url", url])
        .args(["--store", store])
        .env("IDEM_LOG", "idem_mcp=debug")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("idem mcp in front of {url} still waits after 90 s"))
        .expect("run idem mcp");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn socket_addr(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_with_its_ca_works_and_without_it_the_error_names_the_certificate() {
    let d = dir();
    let db = d.db.display().to_string();
    let upstream = spawn_http(&["example-mcp", "--listen", "127.0.0.1:0", "--db", &db]);
    let ca = d._tmp.path().join("ca.pem");
    let port = tls_front(socket_addr(&upstream.1), &ca).await;
    let url = format!("https://localhost:{port}/mcp");
    let store = format!("sqlite:{}", d.store.display());

    // Without the CA the proxy refuses to start, and says why, at once: a certificate that
    // does not verify will not get better, so it is not retried as a server still starting.
    let err = proxy_that_fails_to_start(&url, &store).await;
    assert!(
        err.contains("certificate") && err.contains("UnknownIssuer"),
        "{err}"
    );
    assert!(!err.contains("trying again"), "{err}");

    let ca_arg = ca.display().to_string();
    let proxy = http_proxy(&url, &store, &["--upstream-ca", &ca_arg]);
    let client = tokio::time::timeout(Duration::from_secs(60), async {
        let client = http_client(&proxy.1, "alice").await;
        same_key_replays_and_refusals_charge_nothing(&client, &d.db).await;
        client
    })
    .await
    .expect("the calls through the HTTPS upstream did not finish");
    let _ = client.cancel().await;
}

/// `GET http://ADDR{path}` with HTTP/1.0 (the server closes): the status line and body.
fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    http_get_with(addr, path, &format!("Host: {addr}\r\n"))
}

/// `GET http://ADDR{path}` with these header lines (each ending in CRLF), `Host` included.
fn http_get_with(addr: std::net::SocketAddr, path: &str, headers: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\n{headers}\r\n").expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_counts_executions_and_replays() {
    let d = dir();
    let db = d.db.display().to_string();
    let upstream = spawn_http(&["example-mcp", "--listen", "127.0.0.1:0", "--db", &db]);
    let admin = {
        // A free port: bound and let go (the proxy binds it next).
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let (admin_arg, store) = (admin.to_string(), format!("sqlite:{}", d.store.display()));
    let proxy = http_proxy(&upstream.1, &store, &["--admin-listen", &admin_arg]);
    let (status, body) = http_get(admin, "/healthz");
    assert!(status.contains(" 200"), "{status} {body}");

    let client = http_client(&proxy.1, "alice").await;
    let charge = json!({"customer": "cus_m", "amount_cents": 100, "idempotency_key": "m-1"});
    for _ in 0..3 {
        call(&client, "charge_card", charge.clone()).await;
    }
    let email =
        json!({"to": "a@example.com", "subject": "s", "body": "b", "idempotency_key": "m-2"});
    call(&client, "send_email", email).await;
    let no_key = call(
        &client,
        "charge_card",
        json!({"customer": "c", "amount_cents": 1}),
    )
    .await;
    assert_eq!(problem(&no_key).as_deref(), Some("key-missing"));
    assert_eq!(charges(&d.db), 1);

    let (status, metrics) = http_get(admin, "/metrics");
    assert!(status.contains(" 200"), "{status}");
    for line in [
        r#"idem_requests_total{outcome="executed"} 2"#,
        r#"idem_requests_total{outcome="replayed"} 2"#,
        r#"idem_requests_total{outcome="missing"} 1"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
    let _ = client.cancel().await;
}

/// The admin listener of `idem mcp` follows `idem serve`'s rule: without a token it answers
/// only a `Host` DNS rebinding cannot forge (a page on a name resolving to 127.0.0.1 got a
/// stored tool result before); with `--admin-token-env` every route but `/healthz` needs the
/// bearer token, whatever the `Host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_answers_rebinding_hosts_only_with_its_token() {
    let free = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let d = dir();
    let db = d.db.display().to_string();
    let upstream = spawn_http(&["example-mcp", "--listen", "127.0.0.1:0", "--db", &db]);
    let store = format!("sqlite:{}", d.store.display());
    let open = free();
    let _open_proxy = http_proxy(&upstream.1, &store, &["--admin-listen", &open.to_string()]);
    let evil = "Host: evil.example:9191\r\n";
    for path in ["/metrics", "/keys/k-1?scope=anonymous", "/ui", "/ui/login"] {
        let (status, body) = http_get_with(open, path, evil);
        assert!(status.contains(" 403"), "{path}: {status} {body}");
        let (status, _) = http_get(open, path);
        assert!(
            !status.contains(" 403"),
            "{path} on its own address: {status}"
        );
    }
    assert!(http_get_with(open, "/healthz", evil).0.contains(" 200"));

    let guarded = free();
    let mut child = Command::new(IDEM)
        .args([
            "mcp",
            "--listen",
            "127.0.0.1:0",
            "--upstream-url",
            &upstream.1,
        ])
        .args(["--store", &store, "--admin-listen", &guarded.to_string()])
        .args(["--admin-token-env", "TEST_MCP_ADMIN_TOKEN"])
        .env("TEST_MCP_ADMIN_TOKEN", "mcp-admin-token-0123")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn idem mcp");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the announcement");
    let _guarded_proxy = Server(child, String::new());
    let (status, _) = http_get(guarded, "/metrics");
    assert!(status.contains(" 401"), "{status}");
    let bearer = "Authorization: Bearer mcp-admin-token-0123\r\n";
    let (status, body) = http_get_with(guarded, "/metrics", &format!("{evil}{bearer}"));
    assert!(status.contains(" 200"), "{status} {body}");
    let short = Command::new(IDEM)
        .args([
            "mcp",
            "--store",
            &store,
            "--admin-listen",
            &free().to_string(),
        ])
        .args(["--admin-token-env", "TEST_MCP_ADMIN_TOKEN", "--", "true"])
        .env("TEST_MCP_ADMIN_TOKEN", "short")
        .output()
        .expect("idem mcp");
    let err = String::from_utf8_lossy(&short.stderr);
    assert!(
        !short.status.success() && err.contains("at least 16"),
        "{err}"
    );
}

/// An upstream that accepts connections and never answers (here: a socket nobody accepts on,
/// whose connections the kernel completes) stops the proxy with an error after its patience,
/// instead of holding the startup forever.
#[tokio::test]
async fn an_upstream_that_never_answers_stops_the_proxy_at_startup() {
    let d = dir();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/mcp", silent.local_addr().expect("addr"));
    let store = format!("sqlite:{}", d.store.display());
    let err = proxy_that_fails_to_start(&url, &store).await;
    assert!(
        err.contains("cannot reach the upstream MCP server") && err.contains("timed out"),
        "{err}"
    );
    drop(silent);
}

/// The upstream restarts (on the same address) while a slow charge is in flight: that call's
/// outcome is unknown and never re-sent; the clients' sessions are answered 404 (rmcp then
/// starts a new session by itself and sends its call again there), and a new key charges once
/// ([design §8](docs/design.md#8-mcp)).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_restart_loses_the_session_and_never_resends_a_call_in_flight() {
    let d = dir();
    let db = d.db.display().to_string();
    let upstream = spawn_http(&["example-mcp", "--listen", "127.0.0.1:0", "--db", &db]);
    let upstream_addr = socket_addr(&upstream.1).to_string();
    let store = format!("sqlite:{}", d.store.display());
    let proxy = http_proxy(&upstream.1, &store, &[]);
    let alice = http_client(&proxy.1, "alice").await;
    // A client that does not start a new session by itself shows what the proxy answers.
    let strict = {
        let headers = HashMap::from([(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer strict"),
        )]);
        let config = StreamableHttpClientTransportConfig::with_uri(proxy.1.as_str())
            .custom_headers(headers)
            .reinit_on_expired_session(false);
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("initialize over HTTP")
    };
    let slow = json!({"customer": "cus_r", "amount_cents": 100, "delay_ms": 20000,
                      "idempotency_key": "in-flight-1"});
    let peer = alice.peer().clone();
    let in_flight = tokio::spawn({
        let slow = slow.clone();
        async move {
            peer.call_tool(CallToolRequestParams::new("charge_card").with_arguments(args(slow)))
                .await
        }
    });
    // The call reached the upstream once the proxy holds its key in flight.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if inspect(&store, "authorization: Bearer alice", "in-flight-1").contains("in_flight") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(upstream); // killed mid-call, its sessions with it
    let first = tokio::time::timeout(Duration::from_secs(60), in_flight)
        .await
        .expect("the call in flight was never answered")
        .expect("join")
        .expect("an answer, not a transport failure");
    assert_eq!(
        problem(&first).as_deref(),
        Some("outcome-unknown"),
        "{first:?}"
    );
    let upstream = spawn_http(&["example-mcp", "--listen", &upstream_addr, "--db", &db]);

    // The proxy passes the upstream's 404: the session is gone, nothing ran.
    let lost = strict
        .call_tool(
            CallToolRequestParams::new("charge_card").with_arguments(args(
                json!({"customer": "cus_r", "amount_cents": 300, "idempotency_key": "strict-1"}),
            )),
        )
        .await;
    let err = format!("{:?}", lost.expect_err("the old session still worked"));
    assert!(err.contains("SessionExpired"), "{err}");
    assert_eq!(charges(&d.db), 0);

    // rmcp starts a new session on the 404 and sends the call again: a new key charges once.
    let next = json!({"customer": "cus_r", "amount_cents": 200, "idempotency_key": "after-1"});
    let after = call(&alice, "charge_card", next.clone()).await;
    assert_ne!(after.is_error, Some(true), "{after:?}");
    assert_eq!(idem_meta(&after), Value::Null);
    assert_eq!(charges(&d.db), 1);
    // The call that was in flight is never sent again, in any session.
    let retry = call(&alice, "charge_card", slow.clone()).await;
    assert_eq!(
        problem(&retry).as_deref(),
        Some("outcome-unknown"),
        "{retry:?}"
    );
    let again = http_client(&proxy.1, "alice").await;
    let retry = call(&again, "charge_card", slow).await;
    assert_eq!(
        problem(&retry).as_deref(),
        Some("outcome-unknown"),
        "{retry:?}"
    );
    assert_eq!(
        idem_meta(&call(&again, "charge_card", next).await)["replayed"],
        true
    );
    assert_eq!(charges(&d.db), 1);
    drop(upstream);
    for c in [alice, strict, again] {
        let _ = c.cancel().await;
    }
}
