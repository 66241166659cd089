//! [`RedisStore`]: the `Store` methods as Lua scripts over a multiplexed connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::clock::duration_millis;
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, Clock, FencingToken, Key, Lease, Record, RecordState,
    Resolution, Scope, Stale, Store, StoreError, StoredResponse, Timestamp, machine,
};
use redis::Value;

use crate::connection::{Connection, Opener};
use crate::durability::{self, UNWAITED_REPLICAS};
use crate::layout::{Shard, Shards};
use crate::options::{Durability, RedisOptions};
use crate::reply::{self, corrupt};
use crate::scripts::{Invocation, Scripts};

/// Durations are clamped to this many milliseconds (about 35,000 years) so that `now + d`
/// stays exact in Lua's doubles.
const MAX_MS: i64 = 1 << 50;

/// The Redis [`Store`]. Cloning shares one multiplexed connection, which reconnects by
/// itself when the server comes back; [`Store::for_this_runtime`] opens another, driven by
/// the caller's runtime, over the same records.
#[derive(Clone)]
pub struct RedisStore {
    /// Driven by a task on the runtime that opened it.
    con: Connection,
    inner: Arc<Inner>,
}

struct Inner {
    /// How to open another connection ([`Store::for_this_runtime`]).
    opener: Opener,
    prefix: String,
    shards: Shards,
    clock: Option<Arc<dyn Clock>>,
    op_timeout: Duration,
    scripts: Scripts,
    /// What in the deployment's configuration breaks [design §9](docs/design.md#9-performance-shape)
    /// (claims durable before the effect) or lets Redis evict records; read once at connect,
    /// and non-empty only under `durability=volatile`.
    warnings: Vec<String>,
    /// Each claim and completion is acknowledged only once a replica holds it too (`WAIT`):
    /// the deployment has replicas, and the URL did not accept losing claims to a failover.
    wait_for_replica: bool,
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
    /// gateway should not start on a store it cannot use. Refuses a deployment whose
    /// configuration can lose an acknowledged claim or evict a record, naming the settings to
    /// change, unless `opts.durability` is [`Durability::Volatile`]. On a deployment with
    /// replicas, a durable store waits for one to hold each claim and completion.
    pub async fn connect(opts: RedisOptions) -> Result<Self, StoreError> {
        let opener = Opener::new(&opts.server, opts.op_timeout)?;
        let con = opener.open(opts.op_timeout).await?;
        let found = durability::assess(&mut con.clone(), &opts.server, opts.op_timeout).await;
        let mut warnings = found.shortfalls;
        if !warnings.is_empty() && opts.durability == Durability::Required {
            return Err(volatile_refusal(&warnings));
        }
        let wait_for_replica = found.replicated && opts.durability == Durability::Required;
        if found.replicated && !wait_for_replica {
            warnings.push(UNWAITED_REPLICAS.to_owned());
        }
        for w in &warnings {
            tracing::warn!("redis store (durability=volatile): {w}");
        }
        Ok(RedisStore {
            con,
            inner: Arc::new(Inner {
                opener,
                shards: Shards::new(&opts.prefix),
                prefix: opts.prefix,
                clock: opts.clock,
                op_timeout: opts.op_timeout,
                scripts: Scripts::new(),
                warnings,
                wait_for_replica,
            }),
        })
    }

    /// Connects to `redis://...[?prefix=NAME]` or `redis+cluster://...`.
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

    /// Whether a connection of this store hears at once that the server closed it, and
    /// reconnects before its next command (one server on RESP3, idem's default), rather than
    /// only when a command on it fails (`protocol=resp2`, or a Redis Cluster).
    pub fn hears_closes(&self) -> bool {
        self.inner.opener.hears_closes()
    }

    /// Whether each claim and completion waits for a replica to hold it.
    pub fn waits_for_replica(&self) -> bool {
        self.inner.wait_for_replica
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Deletes every record of this store and its indexes; returns how many keys. For tests,
    /// and for an operator who means it. Every record is in one of its shard's indexes (the
    /// scripts keep them so), or has expired already.
    pub async fn delete_all(&self) -> Result<usize, StoreError> {
        let mut con = self.con.clone();
        let timeout = self.inner.op_timeout;
        let mut deleted = 0;
        for shard in self.inner.shards.all() {
            let (live, expiry) = (shard.live().to_owned(), shard.expiry().to_owned());
            let mut read = redis::pipe();
            read.zrange(&live, 0, -1).zrange(&expiry, 0, -1);
            let (mut keys, completed): (Vec<String>, Vec<String>) =
                within(timeout, "read index", read.query_async(&mut con)).await?;
            keys.extend(completed);
            keys.push(live);
            keys.push(expiry);
            for chunk in keys.chunks(500) {
                let n: usize = within(
                    timeout,
                    "del",
                    redis::cmd("DEL").arg(chunk).query_async(&mut con),
                )
                .await?;
                deleted += n;
            }
        }
        Ok(deleted)
    }

    /// Every shard of this store.
    pub(crate) fn shards(&self) -> &[Shard] {
        self.inner.shards.all()
    }

    /// A record's shard and the record's own key.
    fn shard(&self, scope: &Scope, key: &Key) -> (&Shard, String) {
        let shard = self.inner.shards.of(scope, key);
        let record = shard.record(scope, key);
        (shard, record)
    }

    fn now_arg(&self) -> String {
        self.inner
            .clock
            .as_ref()
            .map(|c| c.now().as_millis().to_string())
            .unwrap_or_default()
    }

    /// Runs a script within the operation timeout.
    async fn run(&self, invocation: Invocation<'_>) -> Result<Value, StoreError> {
        let mut con = self.con.clone();
        within(self.inner.op_timeout, "script", invocation.invoke(&mut con)).await
    }

    /// Runs a script that only reads, once more if the connection turned out dropped (the
    /// server restarted and the connection had not yet heard, or could not reconnect then):
    /// the failed call makes the connection manager reconnect, and a read is safe to repeat.
    /// Both attempts share the one operation timeout. Writes are not repeated: one may have
    /// been applied before the connection dropped.
    async fn run_read(&self, invocation: Invocation<'_>) -> Result<Value, StoreError> {
        let mut con = self.con.clone();
        let attempts = async {
            match invocation.invoke(&mut con).await {
                Err(e) if e.is_connection_dropped() => invocation.invoke(&mut con).await,
                answer => answer,
            }
        };
        within(self.inner.op_timeout, "script", attempts).await
    }

    /// On a replicated deployment, waits until a replica holds what this connection wrote to
    /// `record`'s node (`WAIT 1`), within the operation timeout: a failover then cannot lose
    /// it. `Err` when no replica acknowledged in time: the write is on the master only.
    ///
    /// On a cluster, the client may have sent the `WAIT` to another node than the write's
    /// (it retries a command on the slot's new master after a failover, where a `WAIT` over a
    /// fresh connection counts nothing of ours), so the record is read back from the slot's
    /// master: still held by `held_by` (and completed, if `completed`), or the write was lost.
    async fn replicated(
        &self,
        record: &str,
        held_by: Option<(FencingToken, bool)>,
        what: &str,
    ) -> Result<(), StoreError> {
        if !self.inner.wait_for_replica {
            return Ok(());
        }
        let mut con = self.con.clone();
        let mut wait = redis::cmd("WAIT");
        wait.arg(1).arg(ms(self.inner.op_timeout));
        let acked = within(
            self.inner.op_timeout + Duration::from_secs(1),
            "wait for a replica",
            con.on_owner_of(record, wait),
        )
        .await?;
        match acked {
            Value::Int(n) if n >= 1 => {}
            Value::Int(_) => {
                return Err(unavailable(
                    "wait for a replica",
                    format!(
                        "no replica acknowledged the {what} within {:?}: it is on the master \
                         only, and a failover now could lose it (a master whose replica was \
                         promoted away has none until one rejoins)",
                        self.inner.op_timeout
                    ),
                ));
            }
            other => {
                return Err(unavailable(
                    "wait for a replica",
                    format!(
                        "the {what}'s node answered WAIT with {other:?} (a failover under way?)"
                    ),
                ));
            }
        }
        let (Connection::Cluster(_), Some((token, completed))) = (&self.con, held_by) else {
            return Ok(());
        };
        let mut inv = Invocation::new(&self.inner.scripts.held, &[record], 3, 0);
        inv.arg(self.now_arg())
            .arg(token.as_i64())
            .arg(if completed { "1" } else { "0" });
        match self.run_read(inv).await? {
            Value::Int(1) => Ok(()),
            _ => Err(unavailable(
                "wait for a replica",
                format!("the {what} was lost in a failover before a replica held it"),
            )),
        }
    }

    /// A handle on the shared multiplexed connection.
    pub(crate) fn connection(&self) -> Connection {
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
        let (secs, micros): (i64, i64) = within(
            self.inner.op_timeout,
            "time",
            redis::cmd("TIME").query_async(&mut con),
        )
        .await?;
        Ok(Timestamp::from_millis(secs * 1000 + micros / 1000))
    }
}

/// The refusal of a deployment with shortfalls, unless the URL opts in.
fn volatile_refusal(shortfalls: &[String]) -> StoreError {
    StoreError::Unavailable(
        format!(
            "redis: refused: this server can lose claims it acknowledged: {}. Change the \
             server's settings, or add durability=volatile to the store URL's parameters \
             (?durability=volatile, or &durability=volatile after others such as ?prefix=idem) \
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
        let (shard, k) = self.shard(&req.scope, &req.key);
        let retry = req.on_abandoned == AbandonedPolicy::Retry;
        let mut inv = Invocation::on_record(&self.inner.scripts.claim, shard, &k, 8, 0);
        inv.arg(self.now_arg())
            .arg(req.fingerprint.as_bytes().as_slice())
            .arg(token.as_i64())
            .arg(ms(req.lease))
            .arg(ms(req.retention))
            .arg(if retry { "1" } else { "0" })
            .arg(req.scope.as_str())
            .arg(req.key.as_str());
        match self.run(inv).await? {
            Value::BulkString(acquired) => {
                let held = match reply::acquired(&acquired) {
                    Ok(lease) => self
                        .replicated(&k, Some((token, false)), "claim")
                        .await
                        .map(|()| lease),
                    Err(e) => Err(e),
                };
                match held {
                    Ok((expires_at, attempt)) => Ok(Claim::Acquired(Lease {
                        token,
                        expires_at,
                        attempt,
                    })),
                    Err(e) => {
                        // Acquired, but its answer unreadable or no replica holding it:
                        // nothing ran under it, so give the key back rather than leave it in
                        // flight, if the master still answers.
                        let _ = self.release(&req.scope, &req.key, token).await;
                        Err(e)
                    }
                }
            }
            Value::Array(items) => {
                let [_, now, rec] = items.as_slice() else {
                    return Err(corrupt(format!(
                        "claim answered {} values, not [0, now, record]",
                        items.len()
                    )));
                };
                let now = reply::timestamp(now)?;
                let rec = reply::record(rec)?.ok_or_else(|| corrupt("claim returned no record"))?;
                // The script decided and wrote atomically; the machine only names what is there.
                match machine::claim(Some(&rec), &req, now, token).0 {
                    Claim::Acquired(_) => Err(corrupt("claim script and state machine disagree")),
                    answer => Ok(answer),
                }
            }
            other => Err(corrupt(format!(
                "claim answered {other:?}, neither 'LEASE_END ATTEMPT' nor [0, now, record]"
            ))),
        }
    }
    async fn complete(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<Record, StoreError> {
        let (shard, k) = self.shard(scope, key);
        let encoded = response.encode();
        let mut inv =
            Invocation::on_record(&self.inner.scripts.complete, shard, &k, 3, encoded.len());
        inv.arg(self.now_arg()).arg(token.as_i64()).arg(encoded);
        match self.run(inv).await? {
            Value::BulkString(done) => {
                let rec = reply::completed(&done, scope, key, token, response)?;
                self.replicated(&k, Some((token, true)), "completion")
                    .await?;
                Ok(rec)
            }
            refused => Err(refusal(status(&reply::items(refused)?)?)?),
        }
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let (shard, k) = self.shard(scope, key);
        let mut inv = Invocation::on_record(&self.inner.scripts.release, shard, &k, 2, 0);
        inv.arg(self.now_arg()).arg(token.as_i64());
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
        let (shard, k) = self.shard(scope, key);
        let mut inv = Invocation::on_record(&self.inner.scripts.extend, shard, &k, 3, 0);
        inv.arg(self.now_arg()).arg(token.as_i64()).arg(ms(lease));
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
        let (_, k) = self.shard(scope, key);
        let mut inv = Invocation::new(&self.inner.scripts.get, &[&k], 1, 0);
        inv.arg(self.now_arg());
        let items = reply::items(self.run_read(inv).await?)?;
        let [now, rec] = items.as_slice() else {
            return Err(corrupt("get reply is not [now, record]"));
        };
        Ok(machine::read(reply::record(rec)?, reply::timestamp(now)?))
    }

    /// Each shard's due records, from its expiry index; the purge script deletes a record and
    /// its entry in one step.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = self.redis_now().await?;
        let mut con = self.con.clone();
        let timeout = self.inner.op_timeout;
        let mut deleted = 0;
        for shard in self.inner.shards.all() {
            let expiry = shard.expiry();
            while deleted < limit {
                let batch = isize::try_from((limit - deleted).min(500)).unwrap_or(500);
                let mut read = redis::cmd("ZRANGE");
                read.arg(expiry)
                    .arg("-inf")
                    .arg(now.as_millis())
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(batch);
                let due: Vec<String> =
                    within(timeout, "read expiry index", read.query_async(&mut con)).await?;
                if due.is_empty() {
                    break;
                }
                for k in &due {
                    let mut inv = Invocation::on_record(&self.inner.scripts.purge, shard, k, 1, 0);
                    inv.arg(now.as_millis());
                    let items = reply::items(self.run(inv).await?)?;
                    match status(&items)? {
                        "deleted" => deleted += 1,
                        // Each leaves the due range: removed, or moved to a later expiry.
                        "absent" | "never" | "later" => {}
                        other => return Err(corrupt(format!("purge status {other:?}"))),
                    }
                }
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
        let (shard, k) = self.shard(scope, key);
        let encoded = match &resolution {
            Resolution::Release => None,
            Resolution::Complete(response) => Some(response.encode()),
        };
        let bytes = encoded.as_ref().map_or(0, Vec::len);
        let mut inv = Invocation::on_record(&self.inner.scripts.resolve, shard, &k, 4, bytes);
        inv.arg(self.now_arg());
        match encoded {
            None => inv.arg("release").arg("").arg(""),
            Some(encoded) => inv
                .arg("complete")
                .arg(encoded)
                .arg(FencingToken::random().as_i64()),
        };
        let items = reply::items(self.run(inv).await?)?;
        match status(&items)? {
            "ok" => {
                self.replicated(&k, None, "resolution").await?;
                items
                    .get(2)
                    .map(reply::record)
                    .transpose()
                    .map(Option::flatten)
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
    /// scripts, the prefix, the clock and the durability decided at connect are shared.
    async fn for_this_runtime(&self) -> Result<Self, StoreError> {
        let con = self.inner.opener.open(self.inner.op_timeout).await?;
        Ok(RedisStore {
            con,
            inner: self.inner.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_settings_and_the_opt_in() {
        let e = volatile_refusal(&[
            "appendonly is no: set appendonly yes and appendfsync always".to_owned(),
        ])
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
