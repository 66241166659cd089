//! The store on a real Redis Cluster: three masters with a replica each on loopback ports,
//! every node with an fsynced append-only file. The whole conformance suite runs on it
//! (every script touches one slot: layout.rs), with the store waiting for a replica on each
//! claim and completion, as a durable store on a replicated deployment does; and the
//! listing and purge visit every shard, wherever its slot lives. Skips without
//! `redis-server` unless IDEM_REQUIRE_SERVICES=1.

mod support;

use std::time::Duration;

use idem_conformance::redis_servers::RedisCluster;
use idem_core::{AbandonedPolicy, Claim, ClaimRequest, Fingerprint, Key, Scope, Store};
use idem_store_redis::RedisStore;
use support::OnRedis;

#[test]
fn the_conformance_suite_passes_on_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("the_conformance_suite_passes_on_a_redis_cluster")
    else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("{e}"));
    let durable = rt
        .block_on(RedisStore::connect_url(&cluster.url("")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        durable.waits_for_replica(),
        "a durable store on a cluster with replicas waits for one"
    );
    assert_eq!(durable.durability_warnings(), [] as [String; 0]);
    drop(durable);
    // As the URL says: durable, each case's claims and completions waiting for a replica.
    let harness = OnRedis {
        url: cluster.url(""),
        durability: None,
    };
    idem_conformance::conformance_sequence!(harness);

    // The same cluster accepted as volatile: no waiting, and the store says what that risks.
    let store = rt
        .block_on(RedisStore::connect_url(
            &cluster.url("?durability=volatile"),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!store.waits_for_replica());
    let warned = store.durability_warnings().join("; ");
    assert!(
        warned.contains("failover can lose acknowledged claims"),
        "{warned}"
    );

    // Every node forgets the scripts, as a restart or a failover to a replica that never ran
    // them would: each call then loads its script again (on every master) and is sent once
    // more.
    for node in &cluster.nodes {
        node.cli(&["script", "flush"]);
    }
    rt.block_on(async {
        let (scope, key) = (Scope::anonymous(), Key::new("flushed").expect("key"));
        let request = ClaimRequest {
            scope: scope.clone(),
            key: key.clone(),
            fingerprint: Fingerprint::from_bytes([b' '; 32]),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(60),
            on_abandoned: AbandonedPolicy::Reject,
        };
        let Claim::Acquired(lease) = store.claim(request).await.expect("claim") else {
            panic!("a fresh key is acquired");
        };
        for node in &cluster.nodes {
            node.cli(&["script", "flush"]);
        }
        let response = idem_conformance::response("charged");
        let done = store
            .complete(&scope, &key, lease.token, response)
            .await
            .expect("complete");
        let read = store.get(&scope, &key).await.expect("get");
        assert_eq!(read, Some(done));
        store.delete_all().await.expect("delete");
    });
    drop(store);
    drop(rt);
    drop(cluster);
}

#[test]
fn a_cluster_without_persistence_is_refused_naming_each_node() {
    let Some(cluster) =
        RedisCluster::start("a_cluster_without_persistence_is_refused_naming_each_node")
    else {
        return;
    };
    for node in &cluster.nodes {
        node.cli(&["config", "set", "appendonly", "no"]);
    }
    let rt = tokio::runtime::Runtime::new().unwrap_or_else(|e| panic!("{e}"));
    let refused = rt
        .block_on(RedisStore::connect_url(&cluster.url("")))
        .map(|_| ())
        .map_err(|e| e.to_string());
    let Err(e) = refused else {
        panic!("a cluster without AOF was accepted")
    };
    // Masters and replicas alike (a failover promotes a replica), each named once.
    for node in &cluster.nodes {
        assert_eq!(
            e.matches(&format!("127.0.0.1:{}", node.port)).count(),
            1,
            "{e}"
        );
    }
    assert_eq!(e.matches("appendonly is no").count(), 1, "{e}");
    assert_eq!(e.matches("(a replica)").count(), 3, "{e}");
    assert!(e.contains("durability=volatile"), "{e}");
}
