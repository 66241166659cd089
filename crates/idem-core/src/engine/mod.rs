//! The engine: run a side effect at most once per (scope, key), over any [`Store`].
//!
//! This is [design §3](docs/design.md#3-what-a-request-with-a-key-gets) and
//! [§4](docs/design.md#4-which-results-are-kept) without a protocol: claim the key; execute only
//! when acquired; keep the lease alive while the effect runs; then store the result, release the
//! key, or leave the outcome unknown, depending on what the effect reports. A duplicate of an
//! execution in flight waits for it (up to the policy's bound), woken at once when the execution is
//! in this process and polling the store when it is elsewhere; if the key comes free meanwhile, the
//! duplicate executes with its own effect.
//!
//! This is the one claim loop in idem. The HTTP layer, the gateway, the MCP proxy and the
//! language packages are adapters: they parse and fingerprint a request, call [`Engine::run`],
//! and turn its [`Answer`] into their protocol. The engine counts outcomes and store calls for
//! all of them ([`crate::outcome`], [`MeteredStore`]).
//!
//! # Cancel safety
//! Dropping the future of [`Engine::run`] while the effect runs (a client hung up, a panic
//! unwound through it) does not release the key: the effect may have happened. The heartbeat
//! stops with it, the lease runs out, and the record reads as abandoned
//! ([design §5](docs/design.md#5-unknown-outcomes)).

mod cache;
mod heartbeats;
mod waiters;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

pub use self::cache::{CLOCK_MARGIN, CompletedCache, DEFAULT_CACHE_BYTES};
use self::heartbeats::{Armed, Heartbeats};
pub use self::waiters::{Running, Waiters};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::outcome::Outcome;
pub use crate::policy::Policy;
use crate::record::{FencingToken, Record, StoredBody, StoredResponse};
use crate::scope::Scope;
use crate::store::{Claim, ClaimRequest, Lease, MeteredStore, Store, StoreError};

/// How often a waiting duplicate re-reads the store when the execution it waits for runs in
/// another process (one in this process wakes it at once).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(25);

/// What the effect reports about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// It ran and answered this: store it (or release the key, for a status the policy
    /// says means "not processed").
    Done(StoredResponse),
    /// The request surely never reached the side effect (connection refused): the key is
    /// released and a retry executes.
    NotSent,
    /// The request may have reached it, but no answer came (timeout, reset): the record is
    /// marked abandoned at once, and a retry gets the abandoned policy's answer.
    Unknown,
}

/// What became of an executed effect's result.
#[derive(Debug)]
pub enum Kept {
    /// Stored: retries replay it.
    Stored,
    /// Released: its status says "not processed", so a retry executes again.
    Released,
    /// Not stored: the store failed, or this executor lost its lease meanwhile. The record
    /// will read as abandoned (or holds the other executor's result); the engine logs it.
    Lost(StoreError),
}

/// The engine's answer to one request. `T` is the caller's own value that the effect
/// returned beside its [`Effect`] (an answer that is not stored, an error to hand back); it
/// exists only for the request that executed.
#[derive(Debug)]
pub enum Answer<T> {
    /// This request executed the effect, which reported [`Effect::Done`].
    Executed {
        /// What the effect answered, whole (even when only a digest was stored).
        response: StoredResponse,
        /// What became of it.
        kept: Kept,
        /// The effect's value.
        value: T,
    },
    /// This request executed the effect, which reported [`Effect::NotSent`]; the key was
    /// released.
    NotSent(T),
    /// This request executed the effect, which reported [`Effect::Unknown`]; the record is
    /// abandoned.
    Unknown(T),
    /// A result was stored for the same request: replay `record.response`. Shared, since a
    /// replay answered from the completed-record cache copies nothing.
    Replayed(Arc<Record>),
    /// Another executor holds the key for the same request, and the policy's wait (if any)
    /// ran out first.
    InFlight(Record),
    /// The key was used for another request.
    Mismatch(Record),
    /// An earlier execution's outcome is unknown and the policy is to reject.
    Abandoned(Record),
}

impl<T> Answer<T> {
    /// The value of `idem_requests_total{outcome}` this answer counts under.
    pub const fn outcome(&self) -> Outcome {
        match self {
            Answer::Executed { .. } => Outcome::Executed,
            Answer::NotSent(_) => Outcome::NotSent,
            Answer::Unknown(_) | Answer::Abandoned(_) => Outcome::OutcomeUnknown,
            Answer::Replayed(_) => Outcome::Replayed,
            Answer::InFlight(_) => Outcome::Conflict,
            Answer::Mismatch(_) => Outcome::Mismatch,
        }
    }
}

/// Runs effects at most once per key, over a store. Cloning shares the store and the
/// in-process waiters.
#[derive(Debug, Clone)]
pub struct Engine<S> {
    store: MeteredStore<S>,
    waiters: Arc<Waiters>,
    poll_interval: Duration,
    completed: Option<CompletedCache>,
    /// The heartbeats of executions begun with [`Engine::begin`], not started yet.
    heartbeats: Heartbeats,
    /// Where those heartbeats run, when not on the runtime of the call that began them
    /// ([`Engine::beating_on`]).
    beats_on: Option<BeatHome<S>>,
}

/// The runtime and the store handle an engine's heartbeats use instead of the caller's: see
/// [`Engine::beating_on`].
#[derive(Debug)]
struct BeatHome<S> {
    runtime: tokio::runtime::Handle,
    store: Arc<MeteredStore<S>>,
}

// By hand: derived, it would ask `S: Clone`, and an engine clones without that.
impl<S> Clone for BeatHome<S> {
    fn clone(&self) -> Self {
        BeatHome {
            runtime: self.runtime.clone(),
            store: self.store.clone(),
        }
    }
}

impl<S: Store> Engine<S> {
    /// An engine over `store`.
    pub fn new(store: S) -> Self {
        Engine {
            store: MeteredStore::new(store),
            waiters: Arc::default(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            completed: None,
            heartbeats: Heartbeats::default(),
            beats_on: None,
        }
    }

    /// Answers replays (and mismatches) of completed records from `cache` before asking the
    /// store, and fills it with the completed records the store answers or this engine
    /// stores. Correct in front of a store other processes share: see [`CompletedCache`].
    #[must_use]
    pub fn with_cache(mut self, cache: CompletedCache) -> Self {
        self.completed = Some(cache);
        self
    }

    /// As [`Engine::with_cache`], with a cache of at most `bytes` on the system clock; 0
    /// leaves the engine without one.
    #[must_use]
    pub fn with_cache_bytes(self, bytes: u64) -> Self {
        if bytes == 0 {
            self
        } else {
            self.with_cache(CompletedCache::new(bytes))
        }
    }

    /// This engine over another handle on the same store ([`Store::for_this_runtime`]):
    /// the in-process waiters, the completed-record cache and the poll interval are shared,
    /// so a duplicate still waits for an execution that runs through the other handle.
    #[must_use]
    pub fn with_store(&self, store: S) -> Self {
        Engine {
            store: MeteredStore::new(store),
            waiters: self.waiters.clone(),
            poll_interval: self.poll_interval,
            completed: self.completed.clone(),
            heartbeats: self.heartbeats.clone(),
            beats_on: self.beats_on.clone(),
        }
    }

    /// As [`Engine::with_store`], for a caller whose runtime runs only while the caller waits
    /// on it: a host language's thread that blocks on a current-thread runtime of its own
    /// for each claim and completion, so that the round trips over `store` (a handle
    /// [`Store::for_this_runtime`] opened on that runtime) are written and answered on the
    /// calling thread, with no hand-off to another thread and back.
    ///
    /// Such a runtime is idle while the caller's function runs, so the heartbeats of
    /// executions begun through the engine answered here run on `runtime` (multi-threaded)
    /// over this engine's own store, as they would for a call begun on `runtime`.
    #[must_use]
    pub fn beating_on(&self, store: S, runtime: tokio::runtime::Handle) -> Self
    where
        S: Clone,
    {
        Engine {
            beats_on: Some(BeatHome {
                runtime,
                store: Arc::new(self.store.clone()),
            }),
            ..self.with_store(store)
        }
    }

    /// The completed-record cache, if the engine has one.
    pub const fn cache(&self) -> Option<&CompletedCache> {
        self.completed.as_ref()
    }

    /// Sets how often a waiting duplicate re-reads the store while the execution it waits
    /// for runs in another process.
    #[must_use]
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// The store.
    pub const fn store(&self) -> &S {
        self.store.get_ref()
    }

    /// Claims (scope, key) for `fingerprint` and runs `effect` only if the claim acquired.
    /// A duplicate of an execution in flight waits up to `policy.wait` for its result; if the
    /// key comes free meanwhile (the first execution released it), this request claims it
    /// and runs its own `effect`.
    ///
    /// Fails closed: an error means the store could not be used and the effect did not run.
    pub async fn run<T, F, Fut>(
        &self,
        scope: Scope,
        key: Key,
        fingerprint: Fingerprint,
        policy: &Policy,
        effect: F,
    ) -> Result<Answer<T>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = (Effect, T)>,
    {
        match self.acquire(&scope, &key, fingerprint, policy).await? {
            Ok(lease) => Ok(self.execute(&scope, &key, lease, policy, effect).await),
            Err(refused) => Ok(refused),
        }
    }

    /// The first half of [`Engine::run`], for callers that must run the effect themselves,
    /// outside the engine's future: a language binding whose function must run on the
    /// caller's own thread. Claims (waiting for a duplicate in flight as `run` does) and
    /// answers either the final answer, or an [`Execution`] that holds the lease, keeps it
    /// alive (with a heartbeat started only once the execution outlives a third of its lease,
    /// see `heartbeats`), and is finished with what the effect reported.
    ///
    /// # Panics
    /// Outside a multi-threaded tokio runtime (the heartbeat runs on it and must run while
    /// the caller's function does), before anything is claimed; on an engine made by
    /// [`Engine::beating_on`], when the runtime given there is not multi-threaded.
    ///
    /// Dropping the execution without finishing it stops the heartbeat: the lease runs out
    /// and the record reads as abandoned, as when `run`'s future is dropped.
    pub async fn begin<T>(
        &self,
        scope: Scope,
        key: Key,
        fingerprint: Fingerprint,
        policy: &Policy,
    ) -> Result<Begun<S, T>, StoreError>
    where
        S: Clone + Send + Sync + 'static,
    {
        // Checked before anything is claimed: on a current-thread runtime the heartbeat would
        // run only while the caller polls the runtime, not while its function runs, and the
        // lease would end under a live execution.
        let (beat_runtime, beat_store) = match &self.beats_on {
            Some(home) => (Ok(home.runtime.clone()), &*home.store),
            None => (tokio::runtime::Handle::try_current(), &self.store),
        };
        let beat_runtime = match beat_runtime {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => h,
            _ => panic!(
                "Engine::begin needs a multi-threaded tokio runtime, whose workers keep the \
                 lease alive while the caller's function runs"
            ),
        };
        let lease = match self.acquire(&scope, &key, fingerprint, policy).await? {
            Ok(lease) => lease,
            Err(refused) => return Ok(Begun::Answered(refused)),
        };
        let running = self.announce(&scope, &key, policy);
        let (stop, stopped) = watch::channel(false);
        // Started only if the execution is still running when its first extend is due (see
        // `heartbeats`), with that extend at once: the lease is extended when it would have
        // been had the heartbeat run from the start.
        let beat = {
            let (store, scope, key) = (beat_store.clone(), scope.clone(), key.clone());
            let (token, lease) = (lease.token, policy.lease);
            // On this call's runtime (or the engine's `beats_on`), whichever runtime the
            // driver runs on.
            let here = beat_runtime.clone();
            self.heartbeats.arm(
                &beat_runtime,
                Instant::now() + beat_interval(lease),
                Box::new(move |first| {
                    here.spawn(async move {
                        heartbeat(&store, &scope, &key, token, lease, first, stopped).await;
                    })
                }),
            )
        };
        Ok(Begun::Execute(Execution {
            engine: self.clone(),
            scope,
            key,
            lease,
            policy: policy.clone(),
            beat: Some(beat),
            stop,
            running,
        }))
    }

    /// Claims until the key is acquired or the answer is final: a duplicate of an in-flight
    /// execution waits (up to `policy.wait`) and claims again.
    async fn acquire<T>(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Fingerprint,
        policy: &Policy,
    ) -> Result<Result<Lease, Answer<T>>, StoreError> {
        crate::span::record_claim(scope, key);
        let got = self
            .claim_until_final(scope, key, fingerprint, policy)
            .await;
        match &got {
            Ok(Ok(_)) => {}
            Ok(Err(refused)) => refused.outcome().count(),
            Err(e) => {
                tracing::error!(error = %e, key = %key, scope = %scope, "store unavailable; not executed");
                Outcome::StoreError.count();
            }
        }
        got
    }

    async fn claim_until_final<T>(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Fingerprint,
        policy: &Policy,
    ) -> Result<Result<Lease, Answer<T>>, StoreError> {
        if let Some(known) = self.cached(scope, key, fingerprint) {
            return Ok(Err(known));
        }
        let wait = policy.wait.filter(|w| !w.is_zero());
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            // Listen before claiming, so a finish between the claim and the wait is not missed.
            let local = wait.and_then(|_| self.waiters.get(scope, key));
            let mut notified = local.as_ref().map(|n| Box::pin(n.notified()));
            if let Some(n) = notified.as_mut() {
                n.as_mut().enable();
            }
            let req = ClaimRequest {
                scope: scope.clone(),
                key: key.clone(),
                fingerprint,
                lease: policy.lease,
                retention: policy.retention,
                on_abandoned: policy.on_abandoned,
            };
            let record = match self.store.claim(req).await? {
                Claim::Acquired(lease) => return Ok(Ok(lease)),
                Claim::Completed(r) => {
                    let r = Arc::new(r);
                    if let Some(cache) = &self.completed {
                        cache.insert_shared(&r);
                    }
                    return Ok(Err(Answer::Replayed(r)));
                }
                Claim::Mismatch(r) => return Ok(Err(Answer::Mismatch(r))),
                Claim::Abandoned(r) => return Ok(Err(Answer::Abandoned(r))),
                Claim::InFlight(r) => r,
            };
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| *d > now) else {
                return Ok(Err(Answer::InFlight(record)));
            };
            let nap = self.poll_interval.min(deadline - now);
            match notified {
                Some(n) => {
                    let _ = tokio::time::timeout(nap, n).await;
                }
                None => tokio::time::sleep(nap).await,
            }
        }
    }

    /// What the completed-record cache answers for a request, without a store call: the
    /// replay, or the mismatch when the key was used for another request; `None` when the
    /// cache does not hold the key (then [`Engine::begin`] claims it). No I/O and no await, so
    /// a host may ask on its event loop before it hands [`Engine::begin`] to a thread: a
    /// replay the cache holds then costs no hop. Counted as [`Engine::begin`] counts it.
    pub fn answer_cached<T>(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Option<Answer<T>> {
        let answer = self.cached(scope, key, fingerprint)?;
        answer.outcome().count();
        Some(answer)
    }

    /// The answer a cached completed record gives: its replay, or a mismatch when the key
    /// was used for another request.
    fn cached<T>(&self, scope: &Scope, key: &Key, fingerprint: Fingerprint) -> Option<Answer<T>> {
        let record = self.completed.as_ref()?.get(scope, key)?;
        Some(if record.fingerprint == fingerprint {
            Answer::Replayed(record)
        } else {
            Answer::Mismatch(Arc::unwrap_or_clone(record))
        })
    }

    /// Runs the effect under an acquired lease and keeps what it reports.
    async fn execute<T, F, Fut>(
        &self,
        scope: &Scope,
        key: &Key,
        lease: Lease,
        policy: &Policy,
        effect: F,
    ) -> Answer<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = (Effect, T)>,
    {
        // Duplicates in this process wake when this guard drops: after the result is kept,
        // not before.
        let _running = self.announce(scope, key, policy);
        let mut effect = pin!(effect());
        let (stop, stopped) = watch::channel(false);
        let mut beat = pin!(heartbeat(
            &self.store,
            scope,
            key,
            lease.token,
            policy.lease,
            beat_interval(policy.lease),
            stopped
        ));
        let mut beating = true;
        let (reported, value) = tokio::select! {
            out = &mut effect => out,
            // The heartbeat only ends by itself when someone else holds the key: its result
            // wins and ours will be refused; the effect still runs to its end.
            () = &mut beat => {
                beating = false;
                effect.await
            }
        };
        if beating {
            // Stopped between extends, never in the middle of one: an extend already sent
            // must land before the final write, or it could revive a record this execution
            // is about to mark abandoned.
            let _ = stop.send(true);
            beat.await;
        }
        self.finish(scope, key, lease.token, policy, reported, value)
            .await
    }

    /// Only executions whose duplicates may wait are announced to in-process waiters.
    fn announce(&self, scope: &Scope, key: &Key, policy: &Policy) -> Option<Running> {
        policy
            .wait
            .filter(|w| !w.is_zero())
            .map(|_| self.waiters.executing(scope, key))
    }

    /// Keeps what the effect reported: stores the result (or releases the key for a status
    /// that means "not processed"), releases a key whose request was never sent, or marks an
    /// unknown outcome abandoned.
    async fn finish<T>(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        policy: &Policy,
        reported: Effect,
        value: T,
    ) -> Answer<T> {
        let answer = match reported {
            Effect::Done(response) => {
                let kept = self.keep(scope, key, token, policy, &response).await;
                if let Kept::Lost(e) = &kept {
                    metrics::counter!("idem_completions_lost_total").increment(1);
                    tracing::error!(error = %e, key = %key, scope = %scope, "executed, but the result was not stored; the key will read as abandoned");
                }
                Answer::Executed {
                    response,
                    kept,
                    value,
                }
            }
            Effect::NotSent => {
                if let Err(e) = self.store.release(scope, key, token).await {
                    tracing::warn!(error = %e, key = %key, "could not release a key whose request was never sent; it will read as abandoned");
                }
                Answer::NotSent(value)
            }
            Effect::Unknown => {
                metrics::counter!("idem_abandoned_records_total").increment(1);
                tracing::warn!(key = %key, scope = %scope, "outcome unknown: the record is abandoned until resolved (idem inspect / idem resolve)");
                // A lease of zero ends now: the record reads as abandoned from this moment.
                // Over the heartbeat's connection when it has one of its own (`beats_on`):
                // an extend of the heartbeat's still on its way (one that timed out here)
                // then lands first, where on another connection it could land after and
                // give the record a lease again.
                let store = self
                    .beats_on
                    .as_ref()
                    .map_or(&self.store, |home| &*home.store);
                if let Err(e) = store.extend(scope, key, token, Duration::ZERO).await {
                    tracing::warn!(error = %e, key = %key, "could not mark an unknown outcome abandoned; it will be once its lease ends");
                }
                Answer::Unknown(value)
            }
        };
        answer.outcome().count();
        answer
    }

    /// The execution's final write: store the result, or release the key for a status that
    /// means "not processed". A store that fails here turns an executed effect into an unknown
    /// outcome, so the write is retried while the store is unavailable, for up to half the
    /// lease (the heartbeat kept it live until now). Fencing makes a retry safe; an attempt
    /// that failed on the way back but landed is recognised by its token.
    async fn keep(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        policy: &Policy,
        response: &StoredResponse,
    ) -> Kept {
        let release = policy.release_statuses.contains(&response.status);
        let deadline = Instant::now() + policy.lease / 2;
        let mut pause = Duration::from_millis(10);
        let mut retried = false;
        loop {
            // The stored form is made afresh for each attempt (a retry is rare): the first
            // attempt then costs one copy of the response, not two.
            let written = if release {
                self.store
                    .release(scope, key, token)
                    .await
                    .map(|()| Kept::Released)
            } else {
                let stored = bounded(response, policy.max_stored_body);
                self.store
                    .complete(scope, key, token, stored)
                    .await
                    .map(|record| {
                        if let Some(cache) = &self.completed {
                            cache.insert(record);
                        }
                        Kept::Stored
                    })
            };
            let e = match written {
                Ok(kept) => return kept,
                Err(e) => e,
            };
            if e.is_stale() && retried {
                // An earlier attempt may have landed before its answer was lost.
                return match self.store.get(scope, key).await {
                    Ok(None) if release => Kept::Released,
                    Ok(Some(rec)) if !release && rec.token == token && rec.response.is_some() => {
                        Kept::Stored
                    }
                    _ => Kept::Lost(e),
                };
            }
            if !e.is_unavailable() || Instant::now() + pause >= deadline {
                return Kept::Lost(e);
            }
            tracing::warn!(error = %e, key = %key, "could not keep the result yet; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
            retried = true;
        }
    }
}

/// Extends the lease every third of it until told to stop; ends by itself only when the key
/// is someone else's now (a takeover, an operator), whose result wins. It stops only between
/// extends, so no extend lands after the execution's final write. A slow `extend` (a
/// busy store) never pauses the effect it runs beside. A store that is down is retried: the
/// lease may still be saved.
/// The first extend is sent after `first`, the next ones every [`beat_interval`].
async fn heartbeat<S: Store>(
    store: &S,
    scope: &Scope,
    key: &Key,
    token: FencingToken,
    lease: Duration,
    first: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut pause = first;
    loop {
        if pause.is_zero() {
            // Due now (started late by `heartbeats`): no timer, which would round up.
            if *stopped.borrow() {
                return;
            }
        } else {
            tokio::select! {
                biased;
                // Told to stop, or the execution is gone: stop between extends.
                _ = stopped.wait_for(|stop| *stop) => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
        pause = beat_interval(lease);
        match store.extend(scope, key, token, lease).await {
            Ok(_) => {}
            Err(e) if e.is_stale() => return,
            Err(e) => tracing::warn!(error = %e, key = %key, "heartbeat failed"),
        }
    }
}

/// How often a heartbeat extends a lease: every third of it, so two extends in a row may
/// fail (a store down for a moment) before the lease ends.
fn beat_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(10))
}

/// What [`Engine::begin`] came to.
#[derive(Debug)]
pub enum Begun<S, T> {
    /// The key is this caller's: run the effect, then [`Execution::finish`].
    Execute(Execution<S>),
    /// Nothing to run: a replay, a conflict, a mismatch or an unknown outcome.
    Answered(Answer<T>),
}

/// An acquired key whose effect the caller runs; see [`Engine::begin`].
#[derive(Debug)]
pub struct Execution<S> {
    engine: Engine<S>,
    scope: Scope,
    key: Key,
    lease: Lease,
    policy: Policy,
    /// `None` once finished.
    beat: Option<Armed>,
    stop: watch::Sender<bool>,
    running: Option<Running>,
}

impl<S: Store> Execution<S> {
    /// The lease this execution holds.
    pub const fn lease(&self) -> &Lease {
        &self.lease
    }

    /// This execution, to be finished over `engine`: another handle on its store, made from
    /// the engine that began it by [`Engine::with_store`] or [`Engine::beating_on`] (or that
    /// engine itself), so the waiters woken and the cache filled are the same. For a caller
    /// whose finishing thread drives another connection than the claiming one did.
    ///
    /// # Panics
    /// When `engine` is not of the family of the engine that began this execution.
    #[must_use]
    pub fn over(mut self, engine: &Engine<S>) -> Self
    where
        S: Clone,
    {
        assert!(
            Arc::ptr_eq(&self.engine.waiters, &engine.waiters),
            "Execution::over takes a handle on the engine that began the execution"
        );
        self.engine = engine.clone();
        self
    }

    /// Keeps what the effect reported, as [`Engine::run`] does, and wakes the duplicates
    /// waiting in this process.
    pub async fn finish<T>(mut self, reported: Effect, value: T) -> Answer<T> {
        // Stopped between extends (see `Engine::execute`), then waited for; one not started
        // yet never will be, and there is nothing to wait for.
        let _ = self.stop.send(true);
        if let Some(task) = self.beat.take().and_then(Armed::end) {
            let _ = task.await;
        }
        let answer = self
            .engine
            .finish(
                &self.scope,
                &self.key,
                self.lease.token,
                &self.policy,
                reported,
                value,
            )
            .await;
        drop(self.running.take());
        answer
    }
}

impl<S> Drop for Execution<S> {
    fn drop(&mut self) {
        // Finished or abandoned by its caller: either way no heartbeat outlives it.
        if let Some(task) = self.beat.take().and_then(Armed::end) {
            task.abort();
        }
    }
}

/// The response as stored: whole, or status and headers with a digest of an oversized body.
///
/// The one copy of the body a result costs: the stored form owns exactly its bytes. The
/// response's body may be a view into a larger buffer (a connection's read buffer, when a
/// front end collected the body without copying it), which a record shared for its whole
/// retention would keep alive. Every clone after this one, into the store's record, the
/// completed-record cache and each answer sent from them, shares it.
pub fn bounded(response: &StoredResponse, max_body: usize) -> StoredResponse {
    let body = match &response.body {
        StoredBody::Full(b) if b.len() > max_body => StoredBody::Omitted {
            len: b.len() as u64,
            sha256: Sha256::digest(b).into(),
        },
        StoredBody::Full(b) => StoredBody::Full(Bytes::copy_from_slice(b)),
        omitted @ StoredBody::Omitted { .. } => omitted.clone(),
    };
    StoredResponse {
        status: response.status,
        headers: response.headers.clone(),
        body,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::clock::{Clock, ManualClock, SystemClock, Timestamp};
    use crate::memory::MemoryStore;
    use crate::record::Record;
    use crate::record::RecordState;
    use crate::store::{AbandonedPolicy, Claim, ClaimRequest};

    fn setup() -> (Engine<MemoryStore>, Arc<ManualClock>) {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        (Engine::new(MemoryStore::with_clock(clock.clone())), clock)
    }

    fn k(s: &str) -> Key {
        Key::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::http("POST", "/charge", None, &[n])
    }

    async fn charge(
        engine: &Engine<MemoryStore>,
        key: &str,
        n: u8,
        count: &AtomicU32,
        policy: &Policy,
        status: u16,
    ) -> Answer<()> {
        let run = engine.run(Scope::anonymous(), k(key), fp(n), policy, || async {
            let id = count.fetch_add(1, Ordering::SeqCst) + 1;
            (
                Effect::Done(StoredResponse::new(status, format!("ch_{id}"))),
                (),
            )
        });
        run.await.unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn executes_once_and_replays_the_original() {
        let (engine, _) = setup();
        let count = AtomicU32::new(0);
        let p = Policy::default();
        match charge(&engine, "k", 1, &count, &p, 201).await {
            Answer::Executed {
                response,
                kept: Kept::Stored,
                ..
            } => {
                assert_eq!(response, StoredResponse::new(201, "ch_1"));
            }
            other => panic!("{other:?}"),
        }
        for _ in 0..3 {
            match charge(&engine, "k", 1, &count, &p, 201).await {
                Answer::Replayed(r) => {
                    assert_eq!(r.response, Some(StoredResponse::new(201, "ch_1")))
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            charge(&engine, "k", 2, &count, &p, 201).await,
            Answer::Mismatch(_)
        ));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// Two engines over one store, as two gateways over a shared one; `b` caches.
    fn two_gateways() -> (Engine<MemoryStore>, Engine<MemoryStore>, Arc<ManualClock>) {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let store = MemoryStore::with_clock(clock.clone());
        let a = Engine::new(store.clone());
        let b = Engine::new(store).with_cache(CompletedCache::with_clock(1 << 20, clock.clone()));
        (a, b, clock)
    }

    async fn stored_replays(engine: &Engine<MemoryStore>, key: &str) -> u32 {
        let got = engine.store().get(&Scope::anonymous(), &k(key)).await;
        got.unwrap_or_else(|e| panic!("{e}"))
            .map_or(0, |r| r.replays)
    }

    #[tokio::test]
    async fn the_cache_answers_replays_and_mismatches_of_completed_records_only() {
        let (a, b, _) = two_gateways();
        let count = AtomicU32::new(0);
        let p = Policy::default();
        assert!(matches!(
            charge(&a, "k", 1, &count, &p, 201).await,
            Answer::Executed { .. }
        ));
        // `b` learns the record from the store's replay, then answers from memory: the
        // store counts one replay, not four.
        for _ in 0..4 {
            match charge(&b, "k", 1, &count, &p, 201).await {
                Answer::Replayed(r) => {
                    assert_eq!(r.response, Some(StoredResponse::new(201, "ch_1")));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(stored_replays(&a, "k").await, 1);
        assert!(matches!(
            charge(&b, "k", 2, &count, &p, 201).await,
            Answer::Mismatch(_)
        ));
        assert_eq!(stored_replays(&a, "k").await, 1);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(b.cache().map(CompletedCache::len), Some(1));

        // What `b` executes itself is cached when stored; a released key is not.
        assert!(matches!(
            charge(&b, "own", 1, &count, &p, 201).await,
            Answer::Executed {
                kept: Kept::Stored,
                ..
            }
        ));
        assert!(matches!(
            charge(&b, "busy", 1, &count, &p, 503).await,
            Answer::Executed {
                kept: Kept::Released,
                ..
            }
        ));
        assert_eq!(b.cache().map(CompletedCache::len), Some(2));
        assert!(matches!(
            charge(&b, "busy", 1, &count, &p, 201).await,
            Answer::Executed {
                kept: Kept::Stored,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn a_cached_record_is_not_replayed_past_its_retention() {
        let (a, b, clock) = two_gateways();
        let count = AtomicU32::new(0);
        let p = Policy {
            retention: Duration::from_secs(60),
            ..Policy::default()
        };
        assert!(matches!(
            charge(&b, "k", 1, &count, &p, 201).await,
            Answer::Executed { .. }
        ));
        clock.advance(Duration::from_secs(61));
        // Expired for the store and the cache alike: the key is fresh again, on either
        // gateway, and the new result replaces the old one in the cache.
        match charge(&b, "k", 1, &count, &p, 201).await {
            Answer::Executed { response, .. } => {
                assert_eq!(response, StoredResponse::new(201, "ch_2"));
            }
            other => panic!("{other:?}"),
        }
        match charge(&a, "k", 1, &count, &p, 201).await {
            Answer::Replayed(r) => assert_eq!(r.response, Some(StoredResponse::new(201, "ch_2"))),
            other => panic!("{other:?}"),
        }
        match charge(&b, "k", 1, &count, &p, 201).await {
            Answer::Replayed(r) => assert_eq!(r.response, Some(StoredResponse::new(201, "ch_2"))),
            other => panic!("{other:?}"),
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn not_processed_statuses_release_the_key() {
        let (engine, _) = setup();
        let count = AtomicU32::new(0);
        let p = Policy::default();
        for status in [429, 503] {
            let key = format!("k{status}");
            assert!(matches!(
                charge(&engine, &key, 1, &count, &p, status).await,
                Answer::Executed {
                    kept: Kept::Released,
                    ..
                }
            ));
            // Released: the retry executes.
            assert!(matches!(
                charge(&engine, &key, 1, &count, &p, 200).await,
                Answer::Executed {
                    kept: Kept::Stored,
                    ..
                }
            ));
        }
        // A 500 is a result like any other: kept and replayed (Stripe's rule).
        assert!(matches!(
            charge(&engine, "k500", 1, &count, &p, 500).await,
            Answer::Executed {
                kept: Kept::Stored,
                ..
            }
        ));
        assert!(matches!(
            charge(&engine, "k500", 1, &count, &p, 500).await,
            Answer::Replayed(_)
        ));
        assert_eq!(count.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn not_sent_releases_and_unknown_abandons_at_once() {
        let (engine, clock) = setup();
        let p = Policy::default();
        let run = |key: &'static str, effect: Effect| {
            let engine = &engine;
            let p = &p;
            async move {
                engine
                    .run(Scope::anonymous(), k(key), fp(1), p, || async {
                        (effect, ())
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        assert!(matches!(
            run("a", Effect::NotSent).await,
            Answer::NotSent(())
        ));
        assert!(matches!(
            engine.store().get(&Scope::anonymous(), &k("a")).await,
            Ok(None)
        ));
        assert!(matches!(
            run("b", Effect::Unknown).await,
            Answer::Unknown(())
        ));
        let rec = engine
            .store()
            .get(&Scope::anonymous(), &k("b"))
            .await
            .ok()
            .flatten();
        assert_eq!(
            rec.map(|r| r.state(clock.now())),
            Some(RecordState::Abandoned)
        );
        assert!(matches!(
            run("b", Effect::NotSent).await,
            Answer::Abandoned(_)
        ));
    }

    #[tokio::test]
    async fn abandoned_retry_policy_executes_again() {
        let (engine, _) = setup();
        let p = Policy {
            on_abandoned: AbandonedPolicy::Retry,
            ..Policy::default()
        };
        let first = engine.run(Scope::anonymous(), k("k"), fp(1), &p, || async {
            (Effect::Unknown, ())
        });
        assert!(matches!(first.await, Ok(Answer::Unknown(()))));
        let count = AtomicU32::new(0);
        assert!(matches!(
            charge(&engine, "k", 1, &count, &p, 200).await,
            Answer::Executed {
                kept: Kept::Stored,
                ..
            }
        ));
        let rec = engine
            .store()
            .get(&Scope::anonymous(), &k("k"))
            .await
            .ok()
            .flatten();
        assert_eq!(rec.map(|r| r.attempts), Some(2));
    }

    #[tokio::test]
    async fn oversized_bodies_are_stored_as_a_digest_but_returned_whole() {
        let (engine, _) = setup();
        let p = Policy {
            max_stored_body: 8,
            ..Policy::default()
        };
        let body = b"0123456789".to_vec();
        let run = engine.run(Scope::anonymous(), k("big"), fp(1), &p, || async {
            (Effect::Done(StoredResponse::new(200, body.clone())), ())
        });
        match run.await {
            Ok(Answer::Executed {
                response,
                kept: Kept::Stored,
                ..
            }) => {
                assert_eq!(response.body, StoredBody::Full(body.clone().into()));
            }
            other => panic!("{other:?}"),
        }
        let rec = engine
            .store()
            .get(&Scope::anonymous(), &k("big"))
            .await
            .ok()
            .flatten();
        let want = StoredBody::Omitted {
            len: 10,
            sha256: Sha256::digest(&body).into(),
        };
        assert_eq!(rec.and_then(|r| r.response).map(|r| r.body), Some(want));
    }

    /// The memory store, with faults scripted per test.
    #[derive(Debug, Clone, Default)]
    struct Scripted {
        inner: MemoryStore,
        /// `extend` waits until the effect has made progress (and says it is extending): if
        /// the heartbeat paused the effect while extending, the effect would never finish.
        extend_waits_for_effect: bool,
        extending: Arc<std::sync::atomic::AtomicBool>,
        progressed: Arc<tokio::sync::Notify>,
        /// A non-zero `extend` lands this long after it is sent, even if its caller stops
        /// waiting (a request already on the wire to a server).
        extends_land_after: Option<Duration>,
        /// The next completions that fail; with `failed_completions_land`, each is applied
        /// first (the answer is lost on the way back, not the write).
        completion_failures: Arc<AtomicU32>,
        failed_completions_land: bool,
        /// Extends sent.
        extends: Arc<AtomicU32>,
    }

    impl Store for Scripted {
        async fn claim(&self, r: ClaimRequest) -> Result<Claim, StoreError> {
            self.inner.claim(r).await
        }
        async fn complete(
            &self,
            s: &Scope,
            k: &Key,
            t: FencingToken,
            r: StoredResponse,
        ) -> Result<Record, StoreError> {
            let fail = self
                .completion_failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !fail {
                return self.inner.complete(s, k, t, r).await;
            }
            if self.failed_completions_land {
                let _ = self.inner.complete(s, k, t, r).await;
            }
            Err(StoreError::Unavailable("disk busy".into()))
        }
        async fn release(&self, s: &Scope, k: &Key, t: FencingToken) -> Result<(), StoreError> {
            self.inner.release(s, k, t).await
        }
        async fn extend(
            &self,
            s: &Scope,
            k: &Key,
            t: FencingToken,
            l: Duration,
        ) -> Result<Timestamp, StoreError> {
            self.extends.fetch_add(1, Ordering::SeqCst);
            if self.extend_waits_for_effect {
                let progressed = self.progressed.notified();
                self.extending.store(true, Ordering::SeqCst);
                progressed.await;
            }
            match self.extends_land_after {
                Some(after) if !l.is_zero() => {
                    let (inner, s, k) = (self.inner.clone(), s.clone(), k.clone());
                    let sent = tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        inner.extend(&s, &k, t, l).await
                    });
                    sent.await
                        .unwrap_or_else(|e| Err(StoreError::Unavailable(e.to_string().into())))
                }
                _ => self.inner.extend(s, k, t, l).await,
            }
        }
        async fn get(&self, s: &Scope, k: &Key) -> Result<Option<Record>, StoreError> {
            self.inner.get(s, k).await
        }
        async fn purge_expired(&self, n: usize) -> Result<usize, StoreError> {
            self.inner.purge_expired(n).await
        }
        async fn resolve(
            &self,
            s: &Scope,
            k: &Key,
            r: crate::store::Resolution,
        ) -> Result<Option<Record>, StoreError> {
            self.inner.resolve(s, k, r).await
        }
    }

    #[tokio::test]
    async fn a_slow_heartbeat_never_pauses_the_effect() {
        let store = Scripted {
            extend_waits_for_effect: true,
            ..Scripted::default()
        };
        let engine = Engine::new(store.clone());
        let p = Policy {
            lease: Duration::from_millis(30),
            ..Policy::default()
        };
        let run = engine.run(Scope::anonymous(), k("k"), fp(1), &p, || async {
            // Work that needs to be polled while an extend is pending, and tells it so.
            while !store.extending.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            store.progressed.notify_one();
            (Effect::Done(StoredResponse::new(200, "ok")), ())
        });
        // A deadlock detector, not a speed check: paused, the effect would never finish.
        let answer = tokio::time::timeout(Duration::from_secs(10), run).await;
        assert!(
            matches!(answer, Ok(Ok(Answer::Executed { .. }))),
            "{answer:?}"
        );
    }

    /// A request whose effect is in progress sees InFlight, and the heartbeat keeps it so past
    /// the lease; a dropped execution (a panic, a hung-up client) leaves the key abandoned,
    /// never released. Real time: the heartbeat runs on tokio's timer.
    #[tokio::test]
    async fn heartbeat_holds_the_key_and_a_dropped_execution_abandons_it() {
        let engine = Engine::new(MemoryStore::new());
        let p = Policy {
            lease: Duration::from_millis(150),
            ..Policy::default()
        };
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let slow = {
            let engine = engine.clone();
            let p = p.clone();
            tokio::spawn(async move {
                engine
                    .run(Scope::anonymous(), k("slow"), fp(1), &p, || async move {
                        let _ = started_tx.send(());
                        tokio::time::sleep(Duration::from_millis(600)).await;
                        (Effect::Done(StoredResponse::new(200, "done")), ())
                    })
                    .await
            })
        };
        let _ = started.await;
        tokio::time::sleep(Duration::from_millis(400)).await; // well past one lease
        let count = AtomicU32::new(0);
        assert!(matches!(
            charge(&engine, "slow", 1, &count, &p, 200).await,
            Answer::InFlight(_)
        ));
        slow.abort(); // the execution is dropped mid-effect
        let _ = slow.await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(matches!(
            charge(&engine, "slow", 1, &count, &p, 200).await,
            Answer::Abandoned(_)
        ));
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    /// The one claim loop's waiting: a duplicate of an in-flight execution in this process
    /// is woken when the result is stored and replays it; one whose first execution released
    /// the key runs its own effect; without a wait it is answered InFlight at once.
    #[tokio::test]
    async fn duplicates_wait_for_the_first_then_replay_or_run_their_own() {
        let engine = Engine::new(MemoryStore::new());
        let waits = Policy {
            wait: Some(Duration::from_secs(10)),
            ..Policy::default()
        };
        for (first_status, dup_executes) in [(201, false), (503, true)] {
            let key = format!("w{first_status}");
            let count = Arc::new(AtomicU32::new(0));
            let (started_tx, started) = tokio::sync::oneshot::channel();
            let first = {
                let (engine, waits, count, key) =
                    (engine.clone(), waits.clone(), count.clone(), key.clone());
                tokio::spawn(async move {
                    let run = engine.run(Scope::anonymous(), k(&key), fp(1), &waits, || async {
                        let _ = started_tx.send(());
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        count.fetch_add(1, Ordering::SeqCst);
                        (Effect::Done(StoredResponse::new(first_status, "first")), ())
                    });
                    run.await.map(|a| a.outcome())
                })
            };
            let _ = started.await;
            let dup = engine.run(Scope::anonymous(), k(&key), fp(1), &waits, || async {
                count.fetch_add(1, Ordering::SeqCst);
                (Effect::Done(StoredResponse::new(200, "dup")), "ran")
            });
            match dup.await.unwrap() {
                Answer::Replayed(r) if !dup_executes => {
                    assert_eq!(r.response, Some(StoredResponse::new(201, "first")));
                }
                Answer::Executed { value, .. } if dup_executes => assert_eq!(value, "ran"),
                other => panic!("{first_status}: {other:?}"),
            }
            assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed);
            assert_eq!(count.load(Ordering::SeqCst), 1 + u32::from(dup_executes));
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let blocker = {
            let (engine, waits) = (engine.clone(), waits.clone());
            tokio::spawn(async move {
                let run = engine.run(Scope::anonymous(), k("c"), fp(1), &waits, || async {
                    let _ = rx.await;
                    (Effect::Done(StoredResponse::new(200, "ok")), ())
                });
                run.await.map(|a| a.outcome())
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let at_once = Policy::default();
        let no_wait = engine.run(Scope::anonymous(), k("c"), fp(1), &at_once, || async {
            (Effect::Done(StoredResponse::new(200, "no")), ())
        });
        assert!(matches!(no_wait.await, Ok(Answer::InFlight(_))));
        let _ = tx.send(());
        assert_eq!(blocker.await.unwrap().unwrap(), Outcome::Executed);
    }

    /// An engine over another handle on the store (a serving thread's) shares the waiters
    /// and the cache: a duplicate through it is woken by the execution through the first,
    /// not left to a poll that here would take 30 s, and replays from the shared cache.
    #[tokio::test]
    async fn an_engine_with_another_store_handle_shares_waiters_and_cache() {
        let store = MemoryStore::new();
        let a = Engine::new(store.clone())
            .with_poll_interval(Duration::from_secs(30))
            .with_cache_bytes(1 << 20);
        let b = a.with_store(store);
        let waits = Policy {
            wait: Some(Duration::from_secs(60)),
            ..Policy::default()
        };
        // A result stored through `a` is in `b`'s cache before `b` has asked for anything.
        let stored = a.run(Scope::anonymous(), k("h0"), fp(1), &waits, || async {
            (Effect::Done(StoredResponse::new(201, "h0")), ())
        });
        assert_eq!(stored.await.unwrap().outcome(), Outcome::Executed);
        assert_eq!(b.cache().map(CompletedCache::len), Some(1), "one cache");
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let first = {
            let (a, waits) = (a.clone(), waits.clone());
            tokio::spawn(async move {
                let run = a.run(Scope::anonymous(), k("h"), fp(1), &waits, || async {
                    let _ = started_tx.send(());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    (Effect::Done(StoredResponse::new(201, "first")), ())
                });
                run.await.map(|answer| answer.outcome())
            })
        };
        let _ = started.await;
        let dup = b.run(Scope::anonymous(), k("h"), fp(1), &waits, || async {
            (Effect::Done(StoredResponse::new(200, "dup")), ())
        });
        match tokio::time::timeout(Duration::from_secs(5), dup).await {
            Ok(Ok(Answer::Replayed(r))) => {
                assert_eq!(r.response, Some(StoredResponse::new(201, "first")));
            }
            other => panic!("the duplicate is woken and replays, got {other:?}"),
        }
        assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed);
        assert_eq!(b.cache().map(CompletedCache::len), Some(2));
    }

    /// A binding finishes over another handle than the one that claimed (`Execution::over`):
    /// the record is completed, and the claiming handle's engine replays it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_execution_is_finished_over_another_handle_of_its_engine() {
        let store = MemoryStore::new();
        let engine = Engine::new(store.clone());
        let other = engine.with_store(store);
        let p = Policy::default();
        let done = begin_new(&engine, "o", &p)
            .await
            .over(&other)
            .finish(Effect::Done(StoredResponse::new(200, "ok")), ())
            .await;
        assert!(
            matches!(
                done,
                Answer::Executed {
                    kept: Kept::Stored,
                    ..
                }
            ),
            "{done:?}"
        );
        let replay = engine.run(Scope::anonymous(), k("o"), fp(1), &p, || async {
            unreachable!("a completed key does not run")
        });
        let replay: Answer<()> = replay.await.unwrap();
        assert!(matches!(replay, Answer::Replayed(_)), "{replay:?}");
    }

    /// An engine of another family would wake other waiters and fill another cache.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[should_panic(expected = "Execution::over takes a handle on the engine")]
    async fn an_execution_is_not_finished_over_a_strangers_engine() {
        let store = MemoryStore::new();
        let engine = Engine::new(store.clone());
        let stranger = Engine::new(store);
        let execution = begin_new(&engine, "s", &Policy::default()).await;
        drop(execution.over(&stranger));
    }

    /// `begin` and `finish` are `run` in two halves, for a binding whose function runs on
    /// its own thread: the lease is kept alive meanwhile (past several leases), a duplicate
    /// sees it in flight, `finish` stores the result for replays, and an execution dropped
    /// unfinished leaves the key abandoned, never released.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn begin_and_finish_are_run_in_two_halves() {
        let engine = Engine::new(MemoryStore::new());
        let p = Policy {
            lease: Duration::from_millis(60),
            ..Policy::default()
        };
        let begun = engine
            .begin::<()>(Scope::anonymous(), k("b"), fp(1), &p)
            .await
            .unwrap();
        let Begun::Execute(execution) = begun else {
            panic!("{begun:?}")
        };
        assert_eq!(execution.lease().attempt, 1);
        // The caller's function runs elsewhere, for well over one lease.
        tokio::time::sleep(Duration::from_millis(300)).await;
        still_in_flight(&engine, "b", &p).await;
        let done = execution
            .finish(Effect::Done(StoredResponse::new(200, "ok")), 7)
            .await;
        assert!(matches!(
            done,
            Answer::Executed {
                value: 7,
                kept: Kept::Stored,
                ..
            }
        ));
        let again = engine
            .begin::<()>(Scope::anonymous(), k("b"), fp(1), &p)
            .await
            .unwrap();
        assert!(matches!(again, Begun::Answered(Answer::Replayed(_))));

        let dropped = engine
            .begin::<()>(Scope::anonymous(), k("d"), fp(1), &p)
            .await
            .unwrap();
        assert!(matches!(dropped, Begun::Execute(_)));
        drop(dropped);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = engine
            .begin::<()>(Scope::anonymous(), k("d"), fp(1), &p)
            .await
            .unwrap();
        assert!(
            matches!(after, Begun::Answered(Answer::Abandoned(_))),
            "{after:?}"
        );
    }
    /// Begins a call of a new key, which executes.
    async fn begin_new<S: Store + Clone + std::fmt::Debug>(
        engine: &Engine<S>,
        key: &str,
        p: &Policy,
    ) -> Execution<S> {
        match engine
            .begin::<()>(Scope::anonymous(), k(key), fp(1), p)
            .await
        {
            Ok(Begun::Execute(execution)) => execution,
            other => panic!("a new key executes: {other:?}"),
        }
    }

    /// Finishes `execution` with a result, which is stored.
    async fn finish_stored<S: Store>(execution: Execution<S>) {
        let done = execution
            .finish(Effect::Done(StoredResponse::new(200, "ok")), ())
            .await;
        assert!(
            matches!(
                done,
                Answer::Executed {
                    kept: Kept::Stored,
                    ..
                }
            ),
            "{done:?}"
        );
    }

    fn multi_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A duplicate of `key` is told its call is still in flight: the lease is alive.
    async fn still_in_flight<S: Store + Clone + std::fmt::Debug>(
        engine: &Engine<S>,
        key: &str,
        p: &Policy,
    ) {
        let dup = engine
            .begin::<()>(Scope::anonymous(), k(key), fp(1), p)
            .await
            .unwrap();
        assert!(
            matches!(dup, Begun::Answered(Answer::InFlight(_))),
            "the lease ran out: {dup:?}"
        );
    }

    /// A begun call that ends within the first third of its lease starts no heartbeat at all
    /// (the language packages' calls, nearly all): no extend, nothing left armed. One that
    /// runs longer is extended from then on, and not after it finishes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_heartbeat_starts_only_when_a_begun_call_outlives_a_third_of_its_lease() {
        let store = Scripted::default();
        let engine = Engine::new(store.clone());
        let p = Policy {
            lease: Duration::from_millis(900),
            ..Policy::default()
        };
        for i in 0..50 {
            begin_new(&engine, &format!("short-{i}"), &p)
                .await
                .finish(Effect::Done(StoredResponse::new(200, "ok")), ())
                .await;
        }
        // Each took itself out of the map as it finished, well before it was due.
        assert_eq!(engine.heartbeats.pending(), 0);
        // Past the moment the first of them would have been extended.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(store.extends.load(Ordering::SeqCst), 0);

        let long = begin_new(&engine, "long", &p).await;
        let claimed_until = long.lease().expires_at;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let extended = store.extends.load(Ordering::SeqCst);
        assert!(
            extended >= 3,
            "{extended} extends in 1.5 s of a 0.9 s lease"
        );
        let record = store.get(&Scope::anonymous(), &k("long")).await.unwrap();
        assert!(
            record.is_some_and(|r| r.lease_expires_at > claimed_until),
            "the lease was not extended"
        );
        long.finish(Effect::Done(StoredResponse::new(200, "ok")), ())
            .await;
        let after_finish = store.extends.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(store.extends.load(Ordering::SeqCst), after_finish);
        assert_eq!(engine.heartbeats.pending(), 0);
    }

    /// The driver that starts heartbeats runs on the runtime of the call that started it; when
    /// that runtime is gone, the next call starts one on its own, so a long call on the new
    /// runtime is still kept alive.
    #[test]
    fn heartbeats_go_on_when_the_first_runtime_is_gone() {
        let store = MemoryStore::new();
        let engine = Engine::new(store.clone());
        let p = Policy {
            lease: Duration::from_millis(300),
            ..Policy::default()
        };
        let first = multi_thread_runtime();
        first.block_on(async {
            begin_new(&engine, "a", &p)
                .await
                .finish(Effect::Done(StoredResponse::new(200, "ok")), ())
                .await;
        });
        drop(first);
        multi_thread_runtime().block_on(async {
            let e = begin_new(&engine, "b", &p).await;
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            still_in_flight(&engine, "b", &p).await;
            finish_stored(e).await;
        });
    }

    /// A call armed on one runtime while the driver runs on another is kept alive when the
    /// driver's runtime shuts down in the middle of the call: the driver's drop starts the
    /// heartbeat on the call's own runtime.
    #[test]
    fn a_call_outlives_the_runtime_its_driver_ran_on() {
        let engine = Engine::new(MemoryStore::new());
        // Long enough that the driver's runtime is gone before the heartbeat is due, even on
        // a loaded machine, so only the driver's drop can start it.
        let p = Policy {
            lease: Duration::from_millis(1_500),
            ..Policy::default()
        };
        let (driver_runtime, call_runtime) = (multi_thread_runtime(), multi_thread_runtime());
        driver_runtime.block_on(async {
            begin_new(&engine, "a", &p)
                .await
                .finish(Effect::Done(StoredResponse::new(200, "ok")), ())
                .await;
        });
        let call = call_runtime.block_on(begin_new(&engine, "b", &p));
        assert_eq!(engine.heartbeats.pending(), 1);
        drop(driver_runtime);
        assert_eq!(
            engine.heartbeats.pending(),
            0,
            "the driver's drop started it"
        );
        call_runtime.block_on(async {
            tokio::time::sleep(Duration::from_millis(2_000)).await;
            still_in_flight(&engine, "b", &p).await;
            finish_stored(call).await;
        });
    }

    /// On a current-thread runtime the heartbeat could not run while the caller's function
    /// does: `begin` refuses before it claims anything, so no key is left behind.
    #[test]
    fn begin_refuses_a_current_thread_runtime_before_claiming() {
        let store = MemoryStore::new();
        let engine = Engine::new(store.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let p = Policy::default();
        let begun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(engine.begin::<()>(Scope::anonymous(), k("c"), fp(1), &p))
        }));
        assert!(begun.is_err());
        let held = rt.block_on(store.get(&Scope::anonymous(), &k("c")));
        assert!(matches!(held, Ok(None)), "{held:?}");
    }

    /// An unknown outcome stays abandoned: a heartbeat extend that was on the wire when the
    /// effect ended lands before the engine marks the record abandoned, not after (where it
    /// would revive the record as in flight, and a retry would get a conflict instead of
    /// outcome-unknown). Both halves: `run`, and `begin` / `finish`. With correct code the
    /// timing cannot make it fail; on a loaded machine it may miss a regression, not flake.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_heartbeat_never_revives_an_unknown_outcome() {
        let store = MemoryStore::new();
        let engine = Engine::new(Scripted {
            inner: store.clone(),
            extends_land_after: Some(Duration::from_millis(200)),
            ..Scripted::default()
        });
        let p = Policy {
            lease: Duration::from_millis(600),
            ..Policy::default()
        };
        let state = |key: &'static str| {
            let store = store.clone();
            async move {
                let rec = store.get(&Scope::anonymous(), &k(key)).await.unwrap();
                rec.map(|r| r.state(SystemClock.now()))
            }
        };
        // The first extend is sent at 200 ms and lands at 400 ms; the effect ends at 250 ms.
        // Revived by it, the record would read in flight until 1000 ms: look at 550 ms.
        let ran = engine.run(Scope::anonymous(), k("r"), fp(1), &p, || async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            (Effect::Unknown, ())
        });
        assert!(matches!(ran.await, Ok(Answer::Unknown(()))));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state("r").await, Some(RecordState::Abandoned));
        let Begun::Execute(execution) = engine
            .begin::<()>(Scope::anonymous(), k("b"), fp(1), &p)
            .await
            .unwrap()
        else {
            panic!("not acquired")
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(matches!(
            execution.finish(Effect::Unknown, ()).await,
            Answer::Unknown(())
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state("b").await, Some(RecordState::Abandoned));
    }

    /// A completion that fails for a moment (a busy SQLite file, a store failing over) is
    /// retried while the lease allows, instead of leaving an executed effect as an unknown
    /// outcome; one that landed although its answer was lost is recognised by its token.
    /// A store down for longer than half the lease still loses it, and says so.
    #[tokio::test]
    async fn a_completion_that_fails_for_a_moment_is_retried_not_lost() {
        for (failures, lands, stored) in [(3, false, true), (1, true, true), (1_000, false, false)]
        {
            let inner = MemoryStore::new();
            let store = Scripted {
                inner: inner.clone(),
                completion_failures: Arc::new(AtomicU32::new(failures)),
                failed_completions_land: lands,
                ..Scripted::default()
            };
            let engine = Engine::new(store);
            let p = Policy {
                lease: Duration::from_secs(1),
                ..Policy::default()
            };
            let run = engine.run(Scope::anonymous(), k("f"), fp(1), &p, || async {
                (Effect::Done(StoredResponse::new(201, "ch_1")), ())
            });
            match run.await.unwrap() {
                Answer::Executed {
                    kept: Kept::Stored, ..
                } => assert!(stored, "{failures} {lands}"),
                Answer::Executed {
                    kept: Kept::Lost(_),
                    ..
                } => assert!(!stored, "{failures} {lands}"),
                other => panic!("{other:?}"),
            }
            let rec = inner.get(&Scope::anonymous(), &k("f")).await.unwrap();
            assert_eq!(
                rec.and_then(|r| r.response).is_some(),
                stored,
                "{failures} {lands}"
            );
        }
    }
}
