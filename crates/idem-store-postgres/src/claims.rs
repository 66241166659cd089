//! Claims: the one statement that claims many keys, and the batches that feed it.
//!
//! A claim must be durable before the effect runs, so it goes to the pool whose commits
//! wait for the disk, never to the after-commit one. Concurrent claims are grouped by [`crate::batch::Batcher`] and run as one statement per (abandoned
//! policy, retention); each key's row is then settled against the state machine, and a claim
//! the statement left unsettled runs alone with the same token. The transactional mode runs
//! the same statement, one key at a time, inside a service's transaction.

use std::collections::HashMap;
use std::time::Duration;

use idem_core::clock::duration_millis;
use idem_core::{
    AbandonedPolicy, Claim, ClaimRequest, FencingToken, Key, Lease, Record, Scope, StoreError,
    Timestamp, machine,
};
use tokio::sync::oneshot;

use deadpool_postgres::Pool;

use crate::batch::Job;
use crate::inner::{Conn, Inner, Lane};
use crate::sql::{now_of, record_of, unavailable, unavailable_because};

/// How many times a claim is run again when a racing writer left its snapshot behind. Each
/// run takes a fresh snapshot, so a second run settles it unless yet another writer raced.
const CLAIM_RUNS: usize = 8;

/// A claim statement's row for one key.
#[derive(Debug)]
pub(crate) struct ClaimRow {
    acquired: bool,
    now: Timestamp,
    rec: Record,
}

/// A claim waiting for its batch, with the token it will hold if it acquires.
pub(crate) type ClaimJob = (ClaimRequest, FencingToken);

/// A lease a batch granted to a caller that was gone when the answer came: nobody will run
/// the effect, so the key is released rather than left to read as in flight, then abandoned.
#[derive(Debug)]
pub(crate) struct Departed {
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    pub(crate) token: FencingToken,
}

/// A claim statement that failed. `busy`: the server gave up waiting on a lock
/// (`lock_timeout`) or on the statement (`statement_timeout`), so the key is held by another
/// transaction rather than the store being down.
#[derive(Debug)]
struct Failed {
    error: StoreError,
    busy: bool,
}

impl From<StoreError> for Failed {
    fn from(error: StoreError) -> Self {
        Failed { error, busy: false }
    }
}

fn busy(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED
    )
}

/// A [`StoreError`] again: the same message for each key a shared failure answers.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        other => unavailable_because("claim", other),
    }
}

impl Inner {
    /// Runs the claim statement for `reqs` (distinct keys, one abandoned policy); returns
    /// each key's row: acquired or not, the statement's time, and the record.
    async fn claim_rows(
        &self,
        client: &impl Conn,
        reqs: &[(&ClaimRequest, FencingToken)],
        retry: bool,
    ) -> Result<HashMap<(String, String), Result<ClaimRow, StoreError>>, Failed> {
        use tokio_postgres::types::Type;
        let scopes: Vec<&str> = reqs.iter().map(|(r, _)| r.scope.as_str()).collect();
        let keys: Vec<&str> = reqs.iter().map(|(r, _)| r.key.as_str()).collect();
        let fps: Vec<&[u8]> = reqs
            .iter()
            .map(|(r, _)| r.fingerprint.as_bytes().as_slice())
            .collect();
        let tokens: Vec<i64> = reqs.iter().map(|(_, t)| t.as_i64()).collect();
        let leases: Vec<i64> = reqs.iter().map(|(r, _)| duration_millis(r.lease)).collect();
        // One retention per statement: a batch is split by it, as by the abandoned policy.
        let retention = reqs
            .first()
            .map_or(0, |(r, _)| duration_millis(r.retention));
        let rows = self
            .query(
                client,
                Lane::Claim,
                &self.sql.claim,
                &[
                    (&self.now(), Type::INT8),
                    (&scopes, Type::TEXT_ARRAY),
                    (&keys, Type::TEXT_ARRAY),
                    (&fps, Type::BYTEA_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&leases, Type::INT8_ARRAY),
                    (&retry, Type::BOOL),
                    (&retention, Type::INT8),
                ],
            )
            .await
            .map_err(|e| Failed {
                busy: busy(&e),
                error: unavailable("claim", e),
            })?;
        // Each row is read on its own: a row idem cannot read fails its own key only. The
        // statement committed for the others.
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let id = (
                row.try_get::<_, String>("scope"),
                row.try_get::<_, String>("key"),
            );
            let (Ok(scope), Ok(key)) = id else { continue };
            let decoded = (|| {
                let now = now_of(&row)?;
                let rec = record_of(&row)?.ok_or_else(|| {
                    StoreError::Corrupt("postgres claim returned no record".into())
                })?;
                let acquired: bool = row
                    .try_get("acquired")
                    .map_err(|e| unavailable("claim", e))?;
                Ok(ClaimRow { acquired, now, rec })
            })();
            out.insert((scope, key), decoded);
        }
        Ok(out)
    }

    /// The answer to `req` from its row, or `None` when a racing writer left the statement's
    /// snapshot behind and the claim must run again.
    fn settle(
        &self,
        req: &ClaimRequest,
        token: FencingToken,
        row: Option<&Result<ClaimRow, StoreError>>,
    ) -> Result<Option<Claim>, StoreError> {
        let Some(row) = row else {
            return Ok(None);
        };
        let ClaimRow { acquired, now, rec } = match row {
            Ok(r) => r,
            Err(e) => return Err(copy(e)),
        };
        // A record in flight under this claim's own token is this claim's: an earlier run of
        // it committed although its answer was lost (a connection cut after the commit).
        let ours = rec.token == token && rec.completed_at.is_none();
        if *acquired || ours {
            if rec.token != token {
                return Err(StoreError::Corrupt(
                    "postgres claim acquired under another token".into(),
                ));
            }
            return Ok(Some(Claim::Acquired(Lease {
                token,
                expires_at: rec.lease_expires_at,
                attempt: rec.attempts,
            })));
        }
        Ok(match machine::claim(Some(rec), req, *now, token).0 {
            Claim::Acquired(_) => None,
            Claim::Completed(replayed) => {
                self.replays.count(&rec.scope, &rec.key, rec.token);
                Some(Claim::Completed(replayed))
            }
            answer => Some(answer),
        })
    }

    /// One claim on `client`: the pool's connection, or a service's transaction.
    pub(crate) async fn claim_on(
        &self,
        client: &impl Conn,
        req: &ClaimRequest,
        token: FencingToken,
    ) -> Result<Claim, StoreError> {
        let retry = req.on_abandoned == AbandonedPolicy::Retry;
        let id = (req.scope.as_str().to_owned(), req.key.as_str().to_owned());
        for _ in 0..CLAIM_RUNS {
            let rows = self
                .claim_rows(client, &[(req, token)], retry)
                .await
                .map_err(|f| f.error)?;
            if let Some(answer) = self.settle(req, token, rows.get(&id))? {
                return Ok(answer);
            }
        }
        Err(unavailable_because(
            "claim",
            format!("did not settle in {CLAIM_RUNS} runs under contention"),
        ))
    }

    /// A batch of claims: one statement per (abandoned policy, retention) among distinct
    /// keys. A key claimed twice in one batch is answered from the first one's row; any claim
    /// the statement left unsettled runs alone after, with the same token. The leases of
    /// callers gone by their answer go to `departed`, which the batch's runner releases in
    /// one statement after the batch, whether it finished or was cut
    /// ([`Inner::release_departed`]).
    pub(crate) async fn claim_batch(
        &self,
        pool: &Pool,
        jobs: Vec<Job<ClaimJob, Result<Claim, StoreError>>>,
        departed: &mut Vec<Departed>,
    ) {
        // A caller that gave up (its timeout passed) is not claimed for: nobody would hold
        // the lease, and its retry would find the key in flight, then abandoned.
        let jobs: Vec<_> = jobs.into_iter().filter(|(_, r)| !r.is_closed()).collect();
        if jobs.is_empty() {
            return;
        }
        let client = match self.checkout(pool, Lane::Claim).await {
            Ok(c) => c,
            Err(e) => {
                let why = e.to_string();
                for (_, reply) in jobs {
                    let _ = reply.send(Err(unavailable_because("claim", &why)));
                }
                return;
            }
        };
        let mut groups: HashMap<(bool, Duration), Vec<_>> = HashMap::new();
        let mut dups = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for ((req, token), reply) in jobs {
            if seen.insert((req.scope.clone(), req.key.clone())) {
                let policy = (req.on_abandoned == AbandonedPolicy::Retry, req.retention);
                groups.entry(policy).or_default().push((req, token, reply));
            } else {
                dups.push((req, token, reply));
            }
        }
        let mut alone = Vec::new();
        let mut all_rows = HashMap::new();
        for ((retry, _), mut group) in groups {
            // Key order: concurrent batches lock rows in one order and cannot deadlock.
            group.sort_by(|a, b| (&a.0.scope, &a.0.key).cmp(&(&b.0.scope, &b.0.key)));
            let reqs: Vec<_> = group.iter().map(|(r, t, _)| (r, *t)).collect();
            let rows = self.claim_rows(&*client, &reqs, retry).await;
            // A lone claim that waited out the lock timeout is answered now, not run again:
            // its key is held by a transaction, and a second wait would keep this batch's
            // slot from every other key.
            let lone_busy = group.len() == 1 && matches!(&rows, Err(f) if f.busy);
            for (req, token, reply) in group {
                let id = (req.scope.as_str().to_owned(), req.key.as_str().to_owned());
                let settled = match &rows {
                    Ok(rows) => self.settle(&req, token, rows.get(&id)),
                    Err(f) if lone_busy => Err(copy(&f.error)),
                    // The statement failed: each claim runs alone, with its token, so one
                    // that did commit is recognised as its own.
                    Err(_) => Ok(None),
                };
                match settled {
                    Ok(Some(answer)) => send_answer(req, answer, reply, departed),
                    Ok(None) => alone.push((req, token, reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            if let Ok(rows) = rows {
                all_rows.extend(rows);
            }
        }
        for (req, token, reply) in dups {
            let id = (req.scope.as_str().to_owned(), req.key.as_str().to_owned());
            let row = all_rows.get(&id).map(|r| {
                r.as_ref().map_err(copy).map(|r| ClaimRow {
                    acquired: false,
                    now: r.now,
                    rec: r.rec.clone(),
                })
            });
            match self.settle(&req, token, row.as_ref()) {
                Ok(Some(answer)) => send_answer(req, answer, reply, departed),
                Ok(None) => alone.push((req, token, reply)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        for (req, token, reply) in alone {
            if reply.is_closed() {
                continue;
            }
            match self.claim_on(&*client, &req, token).await {
                Ok(answer) => send_answer(req, answer, reply, departed),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
    }
}

/// Sends a claim's answer. A lease whose caller is gone goes to `departed`: nobody will run
/// the effect, and the key must not wait for the lease to end and then read as an unknown
/// outcome.
fn send_answer(
    req: ClaimRequest,
    answer: Claim,
    reply: oneshot::Sender<Result<Claim, StoreError>>,
    departed: &mut Vec<Departed>,
) {
    if let Err(Ok(Claim::Acquired(lease))) = reply.send(Ok(answer)) {
        departed.push(Departed {
            scope: req.scope,
            key: req.key,
            token: lease.token,
        });
    }
}
