//! The store says when the server's configuration lets a claim be lost or a record be
//! evicted, as read from the real server. Skips without Redis unless IDEM_REQUIRE_SERVICES=1.

use idem_store_redis::RedisStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_match_the_servers_persistence_settings() {
    let url = "redis://127.0.0.1:6379/?prefix=idem-durability-test";
    let store = match RedisStore::connect_url(url).await {
        Ok(s) => s,
        Err(e) => {
            idem_conformance::skip(
                "warnings_match_the_servers_persistence_settings",
                &format!("no Redis: {e}"),
            );
            return;
        }
    };
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let appendonly: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut con)
        .await
        .unwrap();
    let warned = store
        .durability_warnings()
        .iter()
        .any(|w| w.contains("appendonly"));
    assert_eq!(
        warned,
        appendonly.get(1).map(String::as_str) != Some("yes"),
        "appendonly {appendonly:?}, warnings {:?}",
        store.durability_warnings()
    );
}
