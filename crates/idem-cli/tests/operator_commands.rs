//! `idem inspect`, `idem resolve`, `idem gc` and `idem migrate` run as a user runs them: the
//! real binary, on a real SQLite file that the store library wrote, and on the local
//! PostgreSQL and Redis (each test in a schema or key prefix of its own).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store, StoredResponse,
};
use idem_store_sqlite::SqliteStore;

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn k(s: &str) -> Key {
    Key::new(s).expect("test key")
}

fn req(key: &str, lease: Duration, retention: Duration) -> ClaimRequest {
    ClaimRequest {
        scope: Scope::anonymous(),
        key: k(key),
        fingerprint: Fingerprint::http(
            "POST",
            "/v1/charges",
            Some("application/json"),
            br#"{"amount":4900}"#,
        ),
        lease,
        retention,
        on_abandoned: AbandonedPolicy::Reject,
    }
}

/// A file with: `done` completed (201, JSON body), `lost` abandoned, `gone1..3` expired.
fn seeded_store(dir: &Path) -> PathBuf {
    let path = dir.join("idem.db");
    let rt = runtime();
    rt.block_on(async {
        let store = SqliteStore::open(&path).expect("open");
        let hour = Duration::from_secs(3600);
        let Ok(Claim::Acquired(l)) = store.claim(req("done", hour, hour)).await else {
            panic!("claim done");
        };
        let mut resp = StoredResponse::new(201, br#"{"charge_id":"ch_1"}"#.to_vec());
        resp.headers
            .push(("content-type".into(), b"application/json".to_vec()));
        store
            .complete(&Scope::anonymous(), &k("done"), l.token, resp)
            .await
            .expect("complete");
        assert!(matches!(
            store.claim(req("done", hour, hour)).await,
            Ok(Claim::Completed(_))
        ));
        assert!(matches!(
            store
                .claim(req("lost", Duration::from_millis(1), hour))
                .await,
            Ok(Claim::Acquired(_))
        ));
        for i in 1..=3 {
            let key = format!("gone{i}");
            let Ok(Claim::Acquired(l)) =
                store.claim(req(&key, hour, Duration::from_millis(1))).await
            else {
                panic!("claim {key}");
            };
            store
                .complete(
                    &Scope::anonymous(),
                    &k(&key),
                    l.token,
                    StoredResponse::new(200, Vec::new()),
                )
                .await
                .expect("complete");
        }
    });
    std::thread::sleep(Duration::from_millis(20));
    path
}

#[test]
fn inspect_tells_a_completed_records_story() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(dir.path());
    let url = format!("sqlite:{}", db.display());
    let o = idem(&["inspect", "--store", &url, "done"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "key          done",
        "state        completed",
        "status       201",
        "header       content-type: application/json",
        "{\"charge_id\":\"ch_1\"}",
        "attempts     1",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // The replay is counted after it is answered; allow the writer its moment.
    let o = idem(&["inspect", "--store", &url, "--json", "done"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["state"], "completed");
    assert_eq!(v["replays"], 1);
    assert_eq!(v["response"]["status"], 201);
    assert_eq!(v["response"]["body"]["text"], "{\"charge_id\":\"ch_1\"}");
    assert_eq!(v["fingerprint"].as_str().map(str::len), Some(64));
}

#[test]
fn resolve_settles_an_abandoned_record_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(dir.path());
    let url = format!("sqlite:{}", db.display());
    let o = idem(&["inspect", "--store", &url, "lost"]);
    assert!(stdout(&o).contains("abandoned"), "{}", stdout(&o));

    let refused = idem(&["resolve", "--store", &url, "done", "--release"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("is completed; only an abandoned record can be resolved"),
        "{}",
        stderr(&refused)
    );

    let body = dir.path().join("body.json");
    std::fs::write(&body, br#"{"charge_id":"ch_9","settled":true}"#).unwrap();
    let body_arg = body.display().to_string();
    let o = idem(&[
        "resolve",
        "--store",
        &url,
        "lost",
        "--status",
        "200",
        "--body",
        &body_arg,
        "--header",
        "Content-Type: application/json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("resolved \"lost\""), "{}", stdout(&o));

    let rt = runtime();
    let store = SqliteStore::open(&db).expect("open");
    let hour = Duration::from_secs(3600);
    match rt.block_on(store.claim(req("lost", hour, hour))) {
        Ok(Claim::Completed(r)) => {
            assert_eq!(r.completed_by, Some(idem_core::CompletedBy::Operator));
            let resp = r.response.expect("no response");
            assert_eq!(resp.status, 200);
            assert_eq!(
                resp.headers,
                vec![("content-type".to_owned(), b"application/json".to_vec())]
            );
            assert_eq!(
                resp.body,
                idem_core::StoredBody::Full(
                    br#"{"charge_id":"ch_9","settled":true}"#.to_vec().into()
                )
            );
        }
        other => panic!("after resolve: {other:?}"),
    }
}

#[test]
fn resolve_release_frees_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(dir.path());
    let url = format!("sqlite:{}", db.display());
    let o = idem(&["resolve", "--store", &url, "lost", "--release"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = idem(&["inspect", "--store", &url, "lost"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no record for key \"lost\""),
        "{}",
        stderr(&o)
    );
}

/// A record an authenticated caller made lives in its own scope: an operator with only the
/// key finds it, and is told where the key is when more than one scope holds it.
#[test]
fn a_key_in_a_callers_scope_is_found_without_naming_the_scope() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(dir.path());
    let url = format!("sqlite:{}", db.display());
    let rt = runtime();
    let store = SqliteStore::open(&db).expect("open");
    let hour = Duration::from_secs(3600);
    let in_scope = |scope: &str, key: &str| ClaimRequest {
        scope: Scope::new(scope).expect("scope"),
        ..req(key, hour, hour)
    };
    for (scope, key) in [
        ("p:aaaa", "mine"),
        ("p:bbbb", "shared"),
        ("p:cccc", "shared"),
    ] {
        assert!(matches!(
            rt.block_on(store.claim(in_scope(scope, key))),
            Ok(Claim::Acquired(_))
        ));
    }
    drop(store);

    let o = idem(&["inspect", "--store", &url, "mine"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("in_flight"), "{}", stdout(&o));
    assert!(stderr(&o).contains("in scope \"p:aaaa\""), "{}", stderr(&o));

    // Two callers used the key: both are named, and nothing is chosen for the operator.
    let o = idem(&["inspect", "--store", &url, "shared"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("held in 2 scopes"), "{e}");
    assert!(
        e.contains("--scope p:bbbb") && e.contains("--scope p:cccc"),
        "{e}"
    );
    let o = idem(&["inspect", "--store", &url, "--scope", "p:cccc", "shared"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // resolve says where the key is, and settles nothing on a guess.
    let o = idem(&["resolve", "--store", &url, "mine", "--release"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--scope p:aaaa"), "{}", stderr(&o));
    assert!(idem(&["inspect", "--store", &url, "mine"]).status.success());

    // A named scope is looked in alone.
    let o = idem(&["inspect", "--store", &url, "--scope", "anonymous", "mine"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("in scope \"anonymous\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn gc_purges_expired_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(dir.path());
    let url = format!("sqlite:{}", db.display());
    let o = idem(&["gc", "--store", &url, "--batch", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "purged 3 expired records");
    let o = idem(&["gc", "--store", &url]);
    assert_eq!(stdout(&o).trim(), "purged 0 expired records");
    assert!(idem(&["inspect", "--store", &url, "done"]).status.success());
}

#[test]
fn bad_input_gets_a_precise_message_and_a_failing_exit() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded_store(dir.path());
    let url = format!("sqlite:{}", db.display());
    let missing = format!("sqlite:{}", dir.path().join("nope.db").display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["inspect", "--store", "idem.db", "k"], "has no scheme"),
        (
            vec!["inspect", "--store", "mysql://x", "k"],
            "unknown scheme \"mysql\"",
        ),
        (
            vec!["inspect", "--store", &missing, "k"],
            "no store file at",
        ),
        (
            vec!["inspect", "--store", &url, "bad key"],
            "byte 0x20 at position 3",
        ),
        (
            vec!["inspect", "--store", &url, "--scope", "", "k"],
            "not a valid scope",
        ),
        (
            vec!["inspect", "--store", &url, "never-used"],
            "no record for key \"never-used\"",
        ),
        (vec!["resolve", "--store", &url, "lost"], "--release"),
        (
            vec!["resolve", "--store", &url, "lost", "--status", "700"],
            "700",
        ),
        (
            vec![
                "resolve",
                "--store",
                &url,
                "lost",
                "--status",
                "200",
                "--body",
                "/nonexistent/x",
            ],
            "cannot read --body",
        ),
        (
            vec![
                "resolve", "--store", &url, "lost", "--status", "200", "--header", "novalue",
            ],
            "is not NAME:VALUE",
        ),
        (vec!["gc", "--store", &url, "--batch", "0"], "0"),
    ];
    for (args, want) in cases {
        let o = idem(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            stderr(&o).contains(want),
            "{args:?}: {want:?} not in {}",
            stderr(&o)
        );
    }
    assert!(
        !dir.path().join("nope.db").exists(),
        "an operator command created a store file"
    );
}

/// An abandoned record made through the library, then found, settled and purged through the
/// binary, on a shared store's URL.
async fn operators_settle_an_abandoned_key<S: Store>(store: &S, url: &str) {
    let Ok(Claim::Acquired(_)) = store
        .claim(req(
            "stuck",
            Duration::from_millis(1),
            Duration::from_secs(60),
        ))
        .await
    else {
        panic!("claim");
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let shown = idem(&["inspect", "--store", url, "stuck"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(stdout(&shown).contains("abandoned"), "{}", stdout(&shown));
    let settled = idem(&["resolve", "--store", url, "stuck", "--release"]);
    assert!(settled.status.success(), "{}", stderr(&settled));
    let gone = store
        .get(&Scope::anonymous(), &k("stuck"))
        .await
        .expect("read the released key");
    assert!(gone.is_none(), "{gone:?}");
    let gc = idem(&["gc", "--store", url]);
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert!(stdout(&gc).starts_with("purged "), "{}", stdout(&gc));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_and_migrate_on_postgres() {
    if !idem_conformance::server_reachable(
        "operator_commands_and_migrate_on_postgres",
        "PostgreSQL",
        "127.0.0.1:5432",
    ) {
        return;
    }
    let schema = format!("idem_ops_{:016x}", rand::random::<u64>());
    let url = format!("postgres://postgres@127.0.0.1:5432/test?schema={schema}");
    // No gateway and no migrate made this schema yet: each operator command says so and
    // creates nothing (else the last would answer "no record" from an empty store).
    for args in [
        vec!["inspect", "--store", &url, "k"],
        vec!["gc", "--store", &url],
        vec!["resolve", "--store", &url, "k", "--release"],
        vec!["inspect", "--store", &url, "k"],
    ] {
        let refused = idem(&args);
        assert!(!refused.status.success(), "{args:?}: {}", stdout(&refused));
        let said = stderr(&refused);
        assert!(
            said.contains(&format!("no idem schema \"{schema}\""))
                && said.contains("check --store"),
            "{args:?}: {said}"
        );
    }
    for _ in 0..2 {
        let migrated = idem(&["migrate", "--store", &url]);
        assert!(migrated.status.success(), "{}", stderr(&migrated));
        assert!(
            stdout(&migrated).contains(&format!("schema {schema} at version 1")),
            "{}",
            stdout(&migrated)
        );
    }
    let store = idem_store_postgres::PgStore::connect_url(&url)
        .await
        .unwrap();
    operators_settle_an_abandoned_key(&store, &url).await;
    // A schema a newer idem wrote is refused, by every command.
    let client = store.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "INSERT INTO \"{schema}\".schema_version (version) VALUES (2)"
        ))
        .await
        .unwrap();
    let refused = idem(&["migrate", "--store", &url]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("upgrade idem"),
        "{}",
        stderr(&refused)
    );
    drop(client);
    let _ = store.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_on_redis() {
    if !idem_conformance::server_reachable("operator_commands_on_redis", "Redis", "127.0.0.1:6379")
    {
        return;
    }
    let prefix = format!("idem-ops-{:016x}", rand::random::<u64>());
    // The test server runs without persistence, which idem refuses unless told (see
    // `migrate_refuses_a_redis_that_can_lose_claims`).
    let url = format!("redis://127.0.0.1:6379/?prefix={prefix}&durability=volatile");
    let migrated = idem(&["migrate", "--store", &url]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let store = idem_store_redis::RedisStore::connect_url(&url)
        .await
        .unwrap();
    operators_settle_an_abandoned_key(&store, &url).await;
    let _ = store.delete_all().await;
}

/// `idem migrate` on a Redis that can lose claims (the test server: `appendonly no`) refuses,
/// naming the setting to change and the opt-in; with `durability=volatile` it succeeds and
/// prints what falls short as warnings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_redis_that_can_lose_claims() {
    let test = "migrate_refuses_a_redis_that_can_lose_claims";
    if !idem_conformance::server_reachable(test, "Redis", "127.0.0.1:6379") {
        return;
    }
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let appendonly: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut con)
        .await
        .unwrap();
    if appendonly.get(1).map(String::as_str) == Some("yes") {
        idem_conformance::skip(
            test,
            "this Redis persists with AOF; the refusal needs one that does not",
        );
        return;
    }
    let url = "redis://127.0.0.1:6379/?prefix=idem-migrate-refusal";
    let refused = idem(&["migrate", "--store", url]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    for part in [
        "appendonly is no",
        "appendonly yes",
        "appendfsync always",
        "durability=volatile",
    ] {
        assert!(
            err.contains(part),
            "the refusal does not name {part:?}: {err}"
        );
    }
    let opted = idem(&["migrate", "--store", &format!("{url}&durability=volatile")]);
    assert!(opted.status.success(), "{}", stderr(&opted));
    let out = String::from_utf8_lossy(&opted.stdout);
    assert!(out.contains("warning: appendonly is no"), "{out}");
}
