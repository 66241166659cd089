//! One connection type over a single server or a Redis Cluster, so the store's scripts and
//! reads are written once.
//!
//! On one server it is the redis crate's [`ConnectionManager`] (multiplexed, reconnecting);
//! on a cluster, its cluster connection, which routes each command to the master owning the
//! command's key slot, follows `MOVED`/`ASK` redirections and refreshes its slot map after a
//! failover. Every key a script touches shares one slot (layout.rs), so each script runs
//! whole on one node.

use std::time::Duration;

use idem_core::StoreError;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::options::Server;
use crate::store::{unavailable, within};

/// What opens connections to the deployment: kept so that another runtime can open its own
/// ([`idem_core::Store::for_this_runtime`]).
#[derive(Clone)]
pub(crate) enum Opener {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    Cluster(ClusterClient),
}

/// A multiplexed connection to the deployment, driven by a task on the runtime that opened
/// it. Cloning shares it.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Opener {
    /// The opener for `server`, each round trip bounded by `timeout`. RESP3 unless the URL
    /// names a protocol: on RESP3 a connection hears at once that the server closed it and
    /// reconnects, while on RESP2 it learns only when a call on it fails. With a connection
    /// per serving thread, most sit idle through a server restart, and a completion failed
    /// that way would leave its key abandoned though the effect ran. (`protocol=resp2` for a
    /// server older than Redis 6.)
    pub(crate) fn new(server: &Server, timeout: Duration) -> Result<Self, StoreError> {
        match server {
            Server::Single(url) => Ok(Opener::Single {
                client: resp3_client(url)?,
                config: ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    // No timer of the client's own per call: every call on the connection is
                    // bounded by the store's operation timeout already (`within`), and a
                    // timeout makes the manager reconnect neither way (it reconnects when the
                    // connection drops). The second timer cost a Redis new key about 2,000
                    // instructions (docs/benchmarks.md, "Redis replies and script calls").
                    .set_response_timeout(None)
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500)),
            }),
            Server::Cluster(nodes) => {
                let resp2 = nodes
                    .iter()
                    .any(|n| idem_core::store::take_url_param(n, "protocol").1.is_some());
                let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // A failover takes the cluster a node timeout or two to settle; the
                    // client retries a moved or refused command within the store's bound.
                    .retries(6)
                    .min_retry_wait(50)
                    .max_retry_wait(500);
                if !resp2 {
                    builder = builder.use_protocol(redis::ProtocolVersion::RESP3);
                }
                builder
                    .build()
                    .map(Opener::Cluster)
                    .map_err(|e| unavailable("url", e))
            }
        }
    }

    /// Whether a connection hears at once that the server closed it (a single server on
    /// RESP3: the close arrives as a disconnection the connection manager reconnects on),
    /// rather than only when a command on it fails (RESP2, or a cluster).
    pub(crate) fn hears_closes(&self) -> bool {
        match self {
            Opener::Single { client, .. } => {
                client.get_connection_info().redis_settings().protocol()
                    == redis::ProtocolVersion::RESP3
            }
            Opener::Cluster(_) => false,
        }
    }

    /// Opens a connection on the current runtime, within `timeout`.
    pub(crate) async fn open(&self, timeout: Duration) -> Result<Connection, StoreError> {
        match self {
            Opener::Single { client, config } => {
                let connecting = ConnectionManager::new_with_config(client.clone(), config.clone());
                Ok(Connection::Single(
                    within(timeout, "connect", connecting).await?,
                ))
            }
            Opener::Cluster(client) => Ok(Connection::Cluster(
                within(timeout, "connect", client.get_async_connection()).await?,
            )),
        }
    }
}

fn resp3_client(url: &str) -> Result<redis::Client, StoreError> {
    let client = redis::Client::open(url).map_err(|e| unavailable("url", e))?;
    if idem_core::store::take_url_param(url, "protocol")
        .1
        .is_some()
    {
        return Ok(client);
    }
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings)).map_err(|e| unavailable("url", e))
}

impl Connection {
    /// `cmd` on every server of the deployment (each master and replica of a cluster), as
    /// `(address, answer)`: for the settings every node must have.
    pub(crate) async fn on_every_node(
        &mut self,
        cmd: Cmd,
    ) -> redis::RedisResult<Vec<(String, Value)>> {
        match self {
            Connection::Single(con) => {
                let v = cmd.query_async(con).await?;
                Ok(vec![("the server".to_owned(), v)])
            }
            Connection::Cluster(con) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
                match con.route_command(cmd, all).await? {
                    Value::Map(pairs) => pairs
                        .into_iter()
                        .map(|(addr, v)| Ok((redis::from_redis_value(addr)?, v)))
                        .collect(),
                    other => Ok(vec![("the cluster".to_owned(), other)]),
                }
            }
        }
    }

    /// `cmd` on the master that owns `key`'s slot, over the connection this store's writes
    /// to that key used (so `WAIT` counts them).
    pub(crate) async fn on_owner_of(&mut self, key: &str, cmd: Cmd) -> redis::RedisResult<Value> {
        match self {
            Connection::Single(con) => cmd.query_async(con).await,
            Connection::Cluster(con) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                con.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}
