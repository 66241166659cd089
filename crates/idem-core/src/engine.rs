//! The engine: run a side effect at most once per (scope, key), over any [`Store`].
//!
//! This is DESIGN §3 and §4 without HTTP: claim the key; execute only when acquired; keep the
//! lease alive while the effect runs; then store the result, release the key, or leave the
//! outcome unknown, depending on what the effect reports. The tower layer, the gateway and the
//! MCP proxy are adapters around [`Engine::run`]; they decide how to turn an [`Answer`] into a
//! response.
//!
//! # Cancel safety
//! Dropping the future of [`Engine::run`] while the effect runs (a client hung up, a panic
//! unwound through it) does not release the key: the effect may have happened. The heartbeat
//! stops with it, the lease runs out, and the record reads as abandoned (DESIGN §5).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{FencingToken, Record, StoredBody, StoredResponse};
use crate::scope::Scope;
use crate::store::{AbandonedPolicy, Claim, ClaimRequest, DEFAULT_RETENTION, Store, StoreError};

/// How the engine treats one route or tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a claim holds the key without a heartbeat. The heartbeat extends it every
    /// third of this while the effect runs, so it bounds how long a crashed executor blocks
    /// the key, not how long an effect may take.
    pub lease: Duration,
    /// How long a completed result is replayed.
    pub retention: Duration,
    /// What a retry of an abandoned record does (DESIGN §5).
    pub on_abandoned: AbandonedPolicy,
    /// Statuses that mean "not processed, try again": the key is released, not kept (§4).
    pub release_statuses: Vec<u16>,
    /// Bodies longer than this are stored as length and digest only (§4).
    pub max_stored_body: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lease: Duration::from_secs(30),
            retention: DEFAULT_RETENTION,
            on_abandoned: AbandonedPolicy::Reject,
            release_statuses: vec![429, 503],
            max_stored_body: 1024 * 1024,
        }
    }
}

/// What the effect reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// It ran and answered this.
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
    /// will read as abandoned (or holds the other executor's result); logged by the caller.
    Lost(StoreError),
}

/// The engine's answer to one request.
#[derive(Debug)]
pub enum Answer {
    /// This request executed the effect.
    Executed {
        /// What the effect answered, whole (even when only a digest was stored).
        response: StoredResponse,
        /// What became of it.
        kept: Kept,
    },
    /// The effect reported [`Effect::NotSent`]; the key was released.
    NotSent,
    /// The effect reported [`Effect::Unknown`]; the record is abandoned.
    Unknown,
    /// A result was stored for the same request: replay `record.response`.
    Replayed(Record),
    /// Another executor holds the key for the same request.
    InFlight(Record),
    /// The key was used for another request.
    Mismatch(Record),
    /// An earlier execution's outcome is unknown and the policy is to reject.
    Abandoned(Record),
}

/// Runs effects at most once per key, over a store.
#[derive(Debug, Clone)]
pub struct Engine<S> {
    store: S,
}

impl<S: Store> Engine<S> {
    /// An engine over `store`.
    pub const fn new(store: S) -> Self {
        Engine { store }
    }

    /// The store.
    pub const fn store(&self) -> &S {
        &self.store
    }

    /// Claims (scope, key) for `fingerprint` and runs `effect` only if the claim acquired.
    ///
    /// Fails closed: an error means the store could not be used and the effect did not run.
    pub async fn run<F, Fut>(
        &self,
        scope: Scope,
        key: Key,
        fingerprint: Fingerprint,
        policy: &Policy,
        effect: F,
    ) -> Result<Answer, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Effect>,
    {
        let req = ClaimRequest {
            scope: scope.clone(),
            key: key.clone(),
            fingerprint,
            lease: policy.lease,
            retention: policy.retention,
            on_abandoned: policy.on_abandoned,
        };
        let lease = match self.store.claim(req).await? {
            Claim::Acquired(lease) => lease,
            Claim::Completed(r) => return Ok(Answer::Replayed(r)),
            Claim::InFlight(r) => return Ok(Answer::InFlight(r)),
            Claim::Mismatch(r) => return Ok(Answer::Mismatch(r)),
            Claim::Abandoned(r) => return Ok(Answer::Abandoned(r)),
        };
        let outcome = self
            .with_heartbeat(&scope, &key, lease.token, policy.lease, effect())
            .await;
        Ok(match outcome {
            Effect::Done(response) => {
                let kept = self
                    .keep(&scope, &key, lease.token, policy, &response)
                    .await;
                Answer::Executed { response, kept }
            }
            Effect::NotSent => {
                if let Err(e) = self.store.release(&scope, &key, lease.token).await {
                    tracing::warn!(error = %e, key = %key, "could not release a key whose request was never sent; it will read as abandoned");
                }
                Answer::NotSent
            }
            Effect::Unknown => {
                // A lease of zero ends now: the record reads as abandoned from this moment.
                if let Err(e) = self
                    .store
                    .extend(&scope, &key, lease.token, Duration::ZERO)
                    .await
                {
                    tracing::warn!(error = %e, key = %key, "could not mark an unknown outcome abandoned; it will be once its lease ends");
                }
                Answer::Unknown
            }
        })
    }

    async fn keep(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        policy: &Policy,
        response: &StoredResponse,
    ) -> Kept {
        if policy.release_statuses.contains(&response.status) {
            return match self.store.release(scope, key, token).await {
                Ok(()) => Kept::Released,
                Err(e) => Kept::Lost(e),
            };
        }
        let stored = bounded(response, policy.max_stored_body);
        match self.store.complete(scope, key, token, stored).await {
            Ok(_) => Kept::Stored,
            Err(e) => Kept::Lost(e),
        }
    }

    /// Polls `effect` to completion while a heartbeat extends the lease every third of it.
    /// The two run side by side: a slow `extend` (a busy store) never pauses the effect.
    async fn with_heartbeat<T>(
        &self,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
        lease: Duration,
        effect: impl Future<Output = T>,
    ) -> T {
        let mut effect = pin!(effect);
        let every = (lease / 3).max(Duration::from_millis(10));
        let heartbeat = async {
            loop {
                tokio::time::sleep(every).await;
                match self.store.extend(scope, key, token, lease).await {
                    Ok(_) => {}
                    // Someone else holds the key now (a takeover, an operator): its result
                    // wins; ours will be refused when we try to store it. Stop beating.
                    Err(e) if e.is_stale() => return,
                    // The store is down: keep trying; the lease may still be saved.
                    Err(e) => tracing::warn!(error = %e, key = %key, "heartbeat failed"),
                }
            }
        };
        tokio::select! {
            out = &mut effect => out,
            () = heartbeat => effect.await,
        }
    }
}

/// The response as stored: whole, or status and headers with a digest of an oversized body.
pub fn bounded(response: &StoredResponse, max_body: usize) -> StoredResponse {
    match &response.body {
        StoredBody::Full(b) if b.len() > max_body => StoredResponse {
            status: response.status,
            headers: response.headers.clone(),
            body: StoredBody::Omitted {
                len: b.len() as u64,
                sha256: Sha256::digest(b).into(),
            },
        },
        _ => response.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::clock::{Clock, ManualClock, Timestamp};
    use crate::record::Record;
    use crate::record::RecordState;
    use crate::store::memory::MemoryStore;
    use crate::store::{Claim, ClaimRequest};

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
    ) -> Answer {
        let run = engine.run(Scope::anonymous(), k(key), fp(n), policy, || async {
            let id = count.fetch_add(1, Ordering::SeqCst) + 1;
            Effect::Done(StoredResponse::new(status, format!("ch_{id}")))
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
                    .run(Scope::anonymous(), k(key), fp(1), p, || async { effect })
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        assert!(matches!(run("a", Effect::NotSent).await, Answer::NotSent));
        assert!(matches!(
            engine.store().get(&Scope::anonymous(), &k("a")).await,
            Ok(None)
        ));
        assert!(matches!(run("b", Effect::Unknown).await, Answer::Unknown));
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
            Effect::Unknown
        });
        assert!(matches!(first.await, Ok(Answer::Unknown)));
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
            Effect::Done(StoredResponse::new(200, body.clone()))
        });
        match run.await {
            Ok(Answer::Executed {
                response,
                kept: Kept::Stored,
            }) => {
                assert_eq!(response.body, StoredBody::Full(body.clone()));
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

    /// A store whose `extend` waits until the effect has made progress: if the heartbeat
    /// paused the effect while extending, this would never finish.
    #[derive(Clone)]
    struct ExtendWaitsForEffect {
        inner: MemoryStore,
        extending: Arc<std::sync::atomic::AtomicBool>,
        progressed: Arc<tokio::sync::Notify>,
    }

    impl Store for ExtendWaitsForEffect {
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
            self.inner.complete(s, k, t, r).await
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
            let progressed = self.progressed.notified();
            self.extending.store(true, Ordering::SeqCst);
            progressed.await;
            self.inner.extend(s, k, t, l).await
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
        let store = ExtendWaitsForEffect {
            inner: MemoryStore::new(),
            extending: Arc::default(),
            progressed: Arc::default(),
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
            Effect::Done(StoredResponse::new(200, "ok"))
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
                        Effect::Done(StoredResponse::new(200, "done"))
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
}
