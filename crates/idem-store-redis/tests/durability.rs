//! A server whose configuration can lose an acknowledged claim is refused at connect, with a
//! message naming the settings to change and the opt-in; `durability=volatile` opts in and
//! keeps the shortfalls as warnings. Checked against the real server, whatever its settings
//! (the machines here run it with `appendonly no`, so the refusal is what they exercise).
//! Skips without Redis unless IDEM_REQUIRE_SERVICES=1.

use idem_store_redis::RedisStore;

const URL: &str = "redis://127.0.0.1:6379/?prefix=idem-durability-test";

/// The server's (appendonly, appendfsync, maxmemory, maxmemory-policy), or `None` if absent.
async fn server_settings() -> Option<[String; 4]> {
    let client = redis::Client::open("redis://127.0.0.1:6379").ok()?;
    let mut con = client.get_multiplexed_async_connection().await.ok()?;
    let mut out: [String; 4] = Default::default();
    for (i, name) in ["appendonly", "appendfsync", "maxmemory", "maxmemory-policy"]
        .into_iter()
        .enumerate()
    {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(&mut con)
            .await
            .ok()?;
        out[i] = pair.get(1).cloned().unwrap_or_default();
    }
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_can_lose_claims_is_refused_unless_the_url_opts_in() {
    let test = "a_server_that_can_lose_claims_is_refused_unless_the_url_opts_in";
    let Some([appendonly, appendfsync, maxmemory, policy]) = server_settings().await else {
        idem_conformance::skip(test, "no Redis at 127.0.0.1:6379");
        return;
    };
    let durable = appendonly == "yes"
        && appendfsync == "always"
        && (maxmemory == "0" || policy == "noeviction");
    match RedisStore::connect_url(URL).await {
        Ok(store) => {
            assert!(
                durable,
                "a server with appendonly {appendonly}, appendfsync {appendfsync} was accepted"
            );
            assert!(store.durability_warnings().is_empty());
        }
        Err(e) => {
            assert!(!durable, "a durable server was refused: {e}");
            let e = e.to_string();
            let setting = if appendonly != "yes" {
                "appendonly yes"
            } else if appendfsync != "always" {
                "appendfsync always"
            } else {
                "maxmemory-policy noeviction"
            };
            for part in [setting, "durability=volatile"] {
                assert!(e.contains(part), "the refusal does not name {part:?}: {e}");
            }
        }
    }
    let store = RedisStore::connect_url(&format!("{URL}&durability=volatile"))
        .await
        .unwrap_or_else(|e| panic!("the opt-in was refused: {e}"));
    assert_eq!(
        store.durability_warnings().is_empty(),
        durable,
        "warnings {:?}",
        store.durability_warnings()
    );
    if appendonly != "yes" {
        assert!(store.durability_warnings()[0].contains("appendonly is no"));
    }
}
