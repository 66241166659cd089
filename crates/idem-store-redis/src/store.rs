//! [`RedisStore`]: the `Store` methods as Lua scripts over a multiplexed connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::clock::duration_millis;
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Clock, FencingToken, Key, Lease, Record, RecordState,
    Resolution, Scope, Stale, Store, StoreError, StoredResponse, Timestamp, machine,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, ScriptInvocation, Value};
use tokio::sync::RwLock;

use crate::options::{Durability, RedisOptions};
use crate::reply::{self, corrupt};
use crate::scripts::Scripts;

/// Durations are clamped to this many milliseconds (about 35,000 years) so that `now + d`
/// stays exact in Lua's doubles.
const MAX_MS: i64 = 1 << 50;

/// The Redis [`Store`]. Cloning shares one multiplexed connection, which reconnects by
/// itself when the server comes back; [`Store::for_this_runtime`] opens another, driven by
/// the caller's runtime, over the same records.
#[derive(Clone)]
pub struct RedisStore {
    /// Driven by a task on the runtime that opened it.
    con: ConnectionManager,
    inner: Arc<Inner>,
}

struct Inner {
    /// How to open another connection ([`Store::for_this_runtime`]).
    client: redis::Client,
    config: ConnectionManagerConfig,
    prefix: String,
    /// The index of completed records by expiry: a sorted set of record keys.
    index: String,
    clock: Option<Arc<dyn Clock>>,
    op_timeout: Duration,
    scripts: Scripts,
    /// What in the server's configuration breaks [design §9](docs/design.md#9-performance-shape)
    /// (claims durable before the effect) or lets Redis evict records; read once at connect,
    /// and non-empty only under `durability=volatile`.
    warnings: Vec<String>,
    /// Held shared by every expiry-index write still on its way, and exclusively by
    /// `purge_expired` before it reads the index, so a purge in this process sees every
    /// completion this process acknowledged.
    indexing: Arc<RwLock<()>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

pub(crate) fn unavailable(what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {what}: {e}").into())
}

/// One round trip (or a few, for `what`), within the operation timeout.
pub(crate) async fn within<T>(
    timeout: Duration,
    what: &str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(|e| unavailable(what, e)),
        Err(_) => Err(unavailable(what, "timed out")),
    }
}

fn ms(d: Duration) -> i64 {
    duration_millis(d).min(MAX_MS)
}

impl RedisStore {
    /// Connects. Fails if the server cannot be reached within the operation timeout: a
    /// gateway should not start on a store it cannot use. Refuses a server whose
    /// configuration can lose an acknowledged claim or evict a record, naming the settings to
    /// change, unless `opts.durability` is [`Durability::Volatile`].
    pub async fn connect(opts: RedisOptions) -> Result<Self, StoreError> {
        let client = client(&opts.url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.op_timeout))
            .set_response_timeout(Some(opts.op_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let con = open_connection(&client, &config, opts.op_timeout).await?;
        let index = format!("{}:expiry", opts.prefix);
        let warnings = shortfalls(&read_settings(&mut con.clone(), opts.op_timeout).await);
        if !warnings.is_empty() && opts.durability == Durability::Required {
            return Err(volatile_refusal(&warnings));
        }
        for w in &warnings {
            tracing::warn!("redis store (durability=volatile): {w}");
        }
        Ok(RedisStore {
            con,
            inner: Arc::new(Inner {
                client,
                config,
                prefix: opts.prefix,
                index,
                clock: opts.clock,
                op_timeout: opts.op_timeout,
                scripts: Scripts::new(),
                warnings,
                indexing: Arc::default(),
            }),
        })
    }

    /// Connects to `redis://...[?prefix=NAME]`.
    pub async fn connect_url(url: &str) -> Result<Self, StoreError> {
        let opts = RedisOptions::from_url(url).map_err(|e| unavailable("url", e))?;
        Self::connect(opts).await
    }

    /// What in the server's configuration makes claims less than durable, or lets Redis
    /// evict records (and so run a key twice), as read at connect. Empty when all is well;
    /// otherwise the store was opened with `durability=volatile`, or it would have been
    /// refused.
    pub fn durability_warnings(&self) -> &[String] {
        &self.inner.warnings
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Deletes every key under the prefix; returns how many. For tests, and for an operator
    /// who means it.
    pub async fn delete_all(&self) -> Result<usize, StoreError> {
        // After this process's index writes still on their way, which would otherwise
        // recreate the index behind the scan.
        self.indexed().await?;
        let mut con = self.con.clone();
        let pattern = format!("{}:*", self.inner.prefix);
        let mut keys: Vec<String> = Vec::new();
        {
            let mut iter = con
                .scan_match::<_, String>(&pattern)
                .await
                .map_err(|e| unavailable("scan", e))?;
            while let Some(k) = iter.next_item().await {
                keys.push(k.map_err(|e| unavailable("scan", e))?);
            }
        }
        for chunk in keys.chunks(500) {
            let _: () = con.del(chunk).await.map_err(|e| unavailable("del", e))?;
        }
        Ok(keys.len())
    }

    /// `PREFIX:r:<scope length>:<scope>:<key>`: readable in redis-cli, and unambiguous
    /// although scopes and keys may hold colons.
    fn record_key(&self, scope: &Scope, key: &Key) -> String {
        format!(
            "{}:r:{}:{}:{}",
            self.inner.prefix,
            scope.as_str().len(),
            scope.as_str(),
            key.as_str()
        )
    }

    fn now_arg(&self) -> String {
        self.inner
            .clock
            .as_ref()
            .map(|c| c.now().as_millis().to_string())
            .unwrap_or_default()
    }

    /// Runs a script within the operation timeout.
    async fn run(&self, invocation: ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let mut con = self.con.clone();
        within(
            self.inner.op_timeout,
            "script",
            invocation.invoke_async(&mut con),
        )
        .await
    }

    /// Runs a script that only reads, once more if the connection turned out dropped (the
    /// server restarted and the connection had not yet heard, or could not reconnect then):
    /// the failed call makes the connection manager reconnect, and a read is safe to repeat.
    /// Both attempts share the one operation timeout. Writes are not repeated: one may have
    /// been applied before the connection dropped.
    async fn run_read(&self, invocation: ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let mut con = self.con.clone();
        let attempts = async {
            match invocation.invoke_async(&mut con).await {
                Err(e) if e.is_connection_dropped() => invocation.invoke_async(&mut con).await,
                answer => answer,
            }
        };
        within(self.inner.op_timeout, "script", attempts).await
    }

    /// Adds a completed record to the expiry index. A crash before this leaves the record
    /// to Redis's own expiry, which the script set already.
    async fn index(&self, record_key: &str, expires_at: Timestamp) -> Result<(), StoreError> {
        let mut con = self.con.clone();
        let added = con.zadd::<_, _, _, ()>(&self.inner.index, record_key, expires_at.as_millis());
        within(self.inner.op_timeout, "index", added).await
    }

    /// Indexes a completed record from a task of its own, so a completion costs its caller
    /// one round trip, not two. Waits for the write instead only while a purge in this
    /// process is about to read the index.
    async fn index_soon(&self, record_key: String, expires_at: Timestamp) {
        match self.inner.indexing.clone().try_read_owned() {
            Ok(pending) => {
                let store = self.clone();
                tokio::spawn(async move {
                    store.index_or_warn(&record_key, expires_at).await;
                    drop(pending);
                });
            }
            Err(_) => self.index_or_warn(&record_key, expires_at).await,
        }
    }

    /// Indexes a completed record; a failure is logged, not returned: the result is
    /// stored, and Redis's own expiry deletes the record if `purge_expired` never sees it.
    async fn index_or_warn(&self, record_key: &str, expires_at: Timestamp) {
        if let Err(e) = self.index(record_key, expires_at).await {
            tracing::warn!(key = record_key, error = %e, "completed record not indexed for purge");
        }
    }

    /// Waits until every index write this process has started is done, within the operation
    /// timeout: each runs as a task on the runtime of the handle that completed the record,
    /// which may be stopped or busy.
    async fn indexed(&self) -> Result<(), StoreError> {
        match tokio::time::timeout(self.inner.op_timeout, self.inner.indexing.write()).await {
            Ok(_) => Ok(()),
            Err(_) => Err(unavailable(
                "index",
                "pending index writes did not finish in time",
            )),
        }
    }

    /// A handle on the shared multiplexed connection.
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.con.clone()
    }

    /// The bound on each round trip.
    pub(crate) fn op_timeout(&self) -> Duration {
        self.inner.op_timeout
    }

    pub(crate) async fn redis_now(&self) -> Result<Timestamp, StoreError> {
        if let Some(c) = &self.inner.clock {
            return Ok(c.now());
        }
        let mut con = self.con.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut con)
            .await
            .map_err(|e| unavailable("time", e))?;
        Ok(Timestamp::from_millis(secs * 1000 + micros / 1000))
    }
}

/// The client for `url`, speaking RESP3 unless the URL names a protocol: on RESP3 the
/// connection manager hears at once that the server closed a connection and reconnects,
/// while on RESP2 it learns only when a call on that connection fails. With a connection per
/// serving thread, most sit idle through a server restart, and a completion failed that way
/// would leave its key abandoned though the effect ran. (`protocol=resp2` for a server
/// older than Redis 6.)
fn client(url: &str) -> Result<redis::Client, StoreError> {
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

/// Opens a multiplexed connection, driven by a task on the current runtime, within `timeout`.
async fn open_connection(
    client: &redis::Client,
    config: &ConnectionManagerConfig,
    timeout: Duration,
) -> Result<ConnectionManager, StoreError> {
    let connecting = ConnectionManager::new_with_config(client.clone(), config.clone());
    within(timeout, "connect", connecting).await
}

type Settings = std::collections::HashMap<String, String>;

/// Reads the persistence and eviction settings that decide whether a claim survives a
/// restart and whether a record can vanish before its retention ends.
async fn read_settings(con: &mut ConnectionManager, timeout: Duration) -> Result<Settings, String> {
    let read = async {
        let mut settings = Settings::new();
        for name in ["appendonly", "appendfsync", "maxmemory", "maxmemory-policy"] {
            // A map on RESP3, pairs in an array on RESP2: read as a map either way.
            let pair: Settings = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(con)
                .await?;
            settings.extend(pair);
        }
        Ok::<_, redis::RedisError>(settings)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(settings)) => Ok(settings),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// What in the settings lets an acknowledged claim be lost or a record be evicted, each
/// naming the setting to change; empty when none does. Settings that could not be read are
/// a shortfall too: idem cannot tell ([design §6](docs/design.md#6-a-store-failure-fails-closed)).
fn shortfalls(settings: &Result<Settings, String>) -> Vec<String> {
    let settings = match settings {
        Ok(s) => s,
        Err(e) => {
            return vec![format!(
                "the server's persistence settings cannot be read (CONFIG GET: {e}), so idem \
                 cannot tell whether an acknowledged claim survives a crash (let idem's user \
                 run CONFIG GET, on a server with appendonly yes and appendfsync always)"
            )];
        }
    };
    let get = |k: &str| settings.get(k).map_or("not reported", String::as_str);
    let mut found = Vec::new();
    if get("appendonly") != "yes" {
        found.push(format!(
            "appendonly is {}: claims and results are lost if Redis restarts, and a retry then \
             runs again (set appendonly yes and appendfsync always)",
            get("appendonly")
        ));
    } else if get("appendfsync") != "always" {
        found.push(format!(
            "appendfsync is {}: a claim is acknowledged before it is on disk, so a crash can \
             lose it and a retry then runs again (set appendfsync always)",
            get("appendfsync")
        ));
    }
    let evicts = get("maxmemory") != "0" && get("maxmemory-policy") != "noeviction";
    if evicts {
        found.push(format!(
            "maxmemory-policy is {} with a memory limit: Redis may evict records before \
             their retention ends, and a retry then runs again (set maxmemory-policy \
             noeviction)",
            get("maxmemory-policy")
        ));
    }
    found
}

/// The refusal of a server with shortfalls, unless the URL opts in.
fn volatile_refusal(shortfalls: &[String]) -> StoreError {
    StoreError::Unavailable(
        format!(
            "redis: refused: this server can lose claims it acknowledged: {}. Change the \
             server's settings, or add durability=volatile to the store URL (redis://HOST:PORT/?durability=volatile) \
             to accept that a crash or an eviction may run a request twice",
            shortfalls.join("; ")
        )
        .into(),
    )
}

/// A fenced script's refusal, as the machine names it.
fn refusal(status: &str) -> Result<StoreError, StoreError> {
    Ok(StoreError::Stale(match status {
        "absent" => Stale::Absent,
        "superseded" => Stale::Superseded,
        "completed" => Stale::Completed,
        other => return Err(corrupt(format!("unknown status {other:?}"))),
    }))
}

fn status(items: &[Value]) -> Result<&str, StoreError> {
    items
        .first()
        .ok_or_else(|| corrupt("empty reply"))
        .and_then(reply::text)
}

impl Store for RedisStore {
    async fn claim(&self, req: ClaimRequest) -> Result<Claim, StoreError> {
        let token = FencingToken::random();
        let k = self.record_key(&req.scope, &req.key);
        let retry = req.on_abandoned == AbandonedPolicy::Retry;
        let mut inv = self.inner.scripts.claim.prepare_invoke();
        inv.key(&k)
            .arg(self.now_arg())
            .arg(req.fingerprint.as_bytes().as_slice())
            .arg(token.as_i64())
            .arg(ms(req.lease))
            .arg(ms(req.retention))
            .arg(if retry { "1" } else { "0" })
            .arg(req.scope.as_str())
            .arg(req.key.as_str());
        let items = reply::items(self.run(inv).await?)?;
        match items.as_slice() {
            [acquired, _, lease_end, attempt] if reply::int(acquired)? == 1 => {
                let attempt = u32::try_from(reply::int(attempt)?)
                    .map_err(|_| corrupt("claim returned an attempt out of range"))?;
                Ok(Claim::Acquired(Lease {
                    token,
                    expires_at: reply::timestamp(lease_end)?,
                    attempt,
                }))
            }
            [_, now, rec] => {
                let now = reply::timestamp(now)?;
                let rec = reply::record(rec)?.ok_or_else(|| corrupt("claim returned no record"))?;
                // The script decided and wrote atomically; the machine only names what is there.
                match machine::claim(Some(&rec), &req, now, token).0 {
                    Claim::Acquired(_) => Err(corrupt("claim script and state machine disagree")),
                    answer => Ok(answer),
                }
            }
            _ => Err(corrupt(
                "claim reply is neither [1, now, lease end, attempt] nor [0, now, record]",
            )),
        }
    }
    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        let k = self.record_key(scope, key);
        let mut inv = self.inner.scripts.complete.prepare_invoke();
        inv.key(&k)
            .arg(self.now_arg())
            .arg(token.as_i64())
            .arg(response.encode());
        let items = reply::items(self.run(inv).await?)?;
        match status(&items)? {
            "ok" => {
                let rec = reply::completed(&items[1..], scope, key, token, response)?;
                self.index_soon(k, rec.expires_at).await;
                Ok(rec)
            }
            other => Err(refusal(other)?),
        }
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let mut inv = self.inner.scripts.release.prepare_invoke();
        inv.key(self.record_key(scope, key))
            .arg(self.now_arg())
            .arg(token.as_i64());
        let items = reply::items(self.run(inv).await?)?;
        match status(&items)? {
            "ok" => Ok(()),
            other => Err(refusal(other)?),
        }
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Timestamp, StoreError> {
        let mut inv = self.inner.scripts.extend.prepare_invoke();
        inv.key(self.record_key(scope, key))
            .arg(self.now_arg())
            .arg(token.as_i64())
            .arg(ms(lease));
        let items = reply::items(self.run(inv).await?)?;
        match status(&items)? {
            "ok" => items
                .get(1)
                .ok_or_else(|| corrupt("extend returned no lease end"))
                .and_then(reply::timestamp),
            other => Err(refusal(other)?),
        }
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, StoreError> {
        let mut inv = self.inner.scripts.get.prepare_invoke();
        inv.key(self.record_key(scope, key)).arg(self.now_arg());
        let items = reply::items(self.run_read(inv).await?)?;
        let [now, rec] = items.as_slice() else {
            return Err(corrupt("get reply is not [now, record]"));
        };
        Ok(machine::read(reply::record(rec)?, reply::timestamp(now)?))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        // Every completion acknowledged so far is indexed before the index is read.
        self.indexed().await?;
        let now = self.redis_now().await?;
        let mut con = self.con.clone();
        let mut deleted = 0;
        while deleted < limit {
            let batch = isize::try_from(limit - deleted).unwrap_or(isize::MAX);
            let due: Vec<String> = con
                .zrangebyscore_limit(&self.inner.index, "-inf", now.as_millis(), 0, batch)
                .await
                .map_err(|e| unavailable("read expiry index", e))?;
            if due.is_empty() {
                break;
            }
            for k in &due {
                let mut inv = self.inner.scripts.purge.prepare_invoke();
                inv.key(k).arg(now.as_millis());
                let items = reply::items(self.run(inv).await?)?;
                match status(&items)? {
                    "deleted" => deleted += 1,
                    // Completed again since: its entry moves to the new expiry.
                    "later" => {
                        let exp = items
                            .get(1)
                            .ok_or_else(|| corrupt("purge returned no expiry"))
                            .and_then(reply::int)?;
                        let _: () = con
                            .zadd(&self.inner.index, k, exp)
                            .await
                            .map_err(|e| unavailable("index", e))?;
                        continue;
                    }
                    // Gone already, or in flight again: its completion will index it anew.
                    "absent" | "never" => {}
                    other => return Err(corrupt(format!("purge status {other:?}"))),
                }
                let _: () = con
                    .zrem(&self.inner.index, k)
                    .await
                    .map_err(|e| unavailable("index", e))?;
            }
        }
        Ok(deleted)
    }

    async fn resolve(
        &self,
        scope: &Scope,
        key: &Key,
        resolution: Resolution,
    ) -> Result<Option<Record>, StoreError> {
        let k = self.record_key(scope, key);
        let mut inv = self.inner.scripts.resolve.prepare_invoke();
        inv.key(&k).arg(self.now_arg());
        match &resolution {
            Resolution::Release => inv.arg("release").arg("").arg(""),
            Resolution::Complete(response) => inv
                .arg("complete")
                .arg(response.encode())
                .arg(FencingToken::random().as_i64()),
        };
        let items = reply::items(self.run(inv).await?)?;
        match status(&items)? {
            "ok" => {
                let rec = items.get(2).map(reply::record).transpose()?.flatten();
                if let Some(r) = &rec {
                    self.index_or_warn(&k, r.expires_at).await;
                }
                Ok(rec)
            }
            "not_found" => Err(StoreError::NotFound),
            "completed" => Err(StoreError::NotAbandoned {
                state: RecordState::Completed,
            }),
            "in_flight" => Err(StoreError::NotAbandoned {
                state: RecordState::InFlight,
            }),
            other => Err(corrupt(format!("resolve status {other:?}"))),
        }
    }

    /// A connection of its own, driven by the caller's runtime: a command from a serving
    /// thread is written and answered there, not by the runtime that connected first. The
    /// scripts, the prefix, the clock and the purge's view of pending index writes are
    /// shared.
    async fn for_this_runtime(&self) -> Result<Self, StoreError> {
        let con = open_connection(
            &self.inner.client,
            &self.inner.config,
            self.inner.op_timeout,
        )
        .await?;
        Ok(RedisStore {
            con,
            inner: self.inner.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        Ok(pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect())
    }

    #[test]
    fn only_aof_with_fsync_always_and_no_eviction_passes() {
        let durable = [
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory", "0"),
            ("maxmemory-policy", "allkeys-lru"),
        ];
        assert!(shortfalls(&settings(&durable)).is_empty());
        let limited = [
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory", "1000000"),
            ("maxmemory-policy", "noeviction"),
        ];
        assert!(shortfalls(&settings(&limited)).is_empty());
        let cases: [(&[(&str, &str)], &str); 3] = [
            (
                &[("appendonly", "no"), ("maxmemory", "0")],
                "appendonly is no",
            ),
            (
                &[
                    ("appendonly", "yes"),
                    ("appendfsync", "everysec"),
                    ("maxmemory", "0"),
                ],
                "set appendfsync always",
            ),
            (
                &[
                    ("appendonly", "yes"),
                    ("appendfsync", "always"),
                    ("maxmemory", "100mb"),
                    ("maxmemory-policy", "volatile-lru"),
                ],
                "set maxmemory-policy noeviction",
            ),
        ];
        for (given, named) in cases {
            let found = shortfalls(&settings(given));
            assert_eq!(found.len(), 1, "{given:?}: {found:?}");
            assert!(found[0].contains(named), "{given:?}: {found:?}");
        }
        let silent = shortfalls(&settings(&[]));
        assert_eq!(silent.len(), 2, "{silent:?}");
        assert!(
            silent[0].contains("appendonly is not reported"),
            "{silent:?}"
        );
        let unreadable = shortfalls(&Err("NOPERM".to_owned()));
        assert!(unreadable[0].contains("cannot be read (CONFIG GET: NOPERM)"));
    }

    #[test]
    fn the_refusal_names_the_settings_and_the_opt_in() {
        let e = volatile_refusal(&shortfalls(&settings(&[
            ("appendonly", "no"),
            ("maxmemory", "0"),
        ])))
        .to_string();
        for part in [
            "appendonly yes",
            "appendfsync always",
            "durability=volatile",
        ] {
            assert!(e.contains(part), "{e}");
        }
    }
}
