//! The model: executors, the store, the clock and an operator, as one state machine whose
//! every step is one nondeterministic choice (a plain [`stateright::Model`], not actors: the
//! store is linearizable, so a message-passing network would only add orderings that one
//! atomic step per store call already covers, and lost replies are modelled directly).

use idem_core::store::{AbandonedPolicy, Claim, ClaimRequest, Resolution};
use idem_core::{FencingToken, Fingerprint, Key, Record, RecordState, Scope, Timestamp};
use stateright::Model;

use crate::properties;
use crate::store::{OPERATOR_RESULT, ResultId, Stored, at, response_of, result_id, ticks};

/// How far the check explores. Every combination of steps within these bounds is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Executors competing for the key (N >= 3 in the checks).
    pub executors: usize,
    /// Claims each executor may make: its first attempt plus retries after a crash, a lost
    /// reply or a refusal.
    pub claims: u8,
    /// Lease length in ticks.
    pub lease: u8,
    /// Retention of completed records in ticks.
    pub retention: u8,
    /// The clock stops here.
    pub horizon: u8,
}

impl Bounds {
    /// The bounds `cargo test` (debug) checks in seconds.
    pub const SMALL: Bounds = Bounds {
        executors: 3,
        claims: 1,
        lease: 1,
        retention: 2,
        horizon: 4,
    };

    /// The bounds the release-mode check explores: retries, leases that need a heartbeat to
    /// outlast a tick, and a horizon past a completion's retention.
    pub const FULL: Bounds = Bounds {
        executors: 3,
        claims: 2,
        lease: 2,
        retention: 2,
        horizon: 6,
    };
}

/// The protocol for one (scope, key) under one abandoned policy.
#[derive(Debug, Clone)]
pub struct ProtocolModel {
    /// How far to explore.
    pub bounds: Bounds,
    /// What a claim of an abandoned record does.
    pub policy: AbandonedPolicy,
    /// Check only the property of this name (see [`crate::check_each`]).
    pub only: Option<&'static str>,
    req: ClaimRequest,
}

impl ProtocolModel {
    /// The model of `policy` within `bounds`.
    pub fn new(policy: AbandonedPolicy, bounds: Bounds) -> Self {
        let req = ClaimRequest {
            scope: Scope::anonymous(),
            // A constant, visible-ASCII key: `Key::new` cannot refuse it.
            key: Key::new("model-key").unwrap_or_else(|e| unreachable!("{e}")),
            fingerprint: Fingerprint::from_bytes([7; 32]),
            lease: ticks(bounds.lease),
            retention: ticks(bounds.retention),
            on_abandoned: policy,
        };
        ProtocolModel {
            bounds,
            policy,
            only: None,
            req,
        }
    }

    /// Whether a result completed at `completed` is still inside its retention at `now`,
    /// counted from the completion (design §2), not from the claim.
    pub fn retained(&self, completed: u8, now: u8) -> bool {
        u16::from(now) < u16::from(completed) + u16::from(self.bounds.retention)
    }
}

/// One executor, from its caller's side.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Exec {
    /// The caller wants the result and claims (again) while it has claims left.
    Waiting {
        /// Claims left.
        claims_left: u8,
    },
    /// Holds a lease (as far as it knows).
    Holding {
        /// The fencing token it was granted.
        token: u64,
        /// The lease end it last heard of (the claim's, or a heartbeat's it got the reply to).
        lease_end: u8,
        /// Whether the effect has started.
        started: bool,
        /// Whether the lease was a takeover of an existing record (under `retry`).
        takeover: bool,
        /// Claims left after this one.
        claims_left: u8,
    },
    /// Got a result: its own, or a replay.
    Done {
        /// Whose result.
        result: ResultId,
        /// Whether it came as a replay of a stored result.
        replayed: bool,
    },
}

/// What the checker knows that no participant does: the history the properties judge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Effect starts since the key's record life began (a fresh claim after absence, a
    /// release, an operator's release, or the end of a completion's retention ends a life).
    pub effects: u8,
    /// The first result stored in this life, and when it was stored.
    pub completed: Option<(ResultId, u8)>,
    /// A claim acquired over a record whose lease had not ended, or that was completed.
    pub early_takeover: bool,
    /// An effect started again in one life under a lease that was not a takeover.
    pub reexecution_without_abandonment: bool,
    /// The stored result differed from the first one stored in this life.
    pub result_changed: bool,
    /// A complete, release or extend whose token was not the live, uncompleted record's
    /// changed the store.
    pub stale_write_changed: bool,
    /// A claim inside a completion's retention did not answer that result.
    pub wrong_replay: bool,
}

/// The whole system at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The clock, in ticks.
    pub now: u8,
    /// What the store holds.
    pub store: Stored,
    /// The next fencing token to grant (a counter; tokens are inputs of `machine::claim`).
    pub next_token: u64,
    /// The executors.
    pub execs: Vec<Exec>,
    /// The checker's history.
    pub ghost: Ghost,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock advances one tick.
    Tick,
    /// An executor claims the key; the store applies it, and the reply may be lost.
    Claim {
        /// Which executor.
        exec: usize,
        /// The store applied the call but the executor never hears.
        reply_lost: bool,
    },
    /// An executor holding a live lease starts the effect.
    StartEffect {
        /// Which executor.
        exec: usize,
    },
    /// A heartbeat: `extend` under the executor's token.
    Heartbeat {
        /// Which executor.
        exec: usize,
        /// The store applied the call but the executor never hears.
        reply_lost: bool,
    },
    /// `complete` under the executor's token, with the result of its execution.
    Complete {
        /// Which executor.
        exec: usize,
        /// The store applied the call but the executor never hears.
        reply_lost: bool,
    },
    /// `release` under the executor's token, before the effect started. Heard or not, its
    /// caller is left without a result, so a lost reply is the same step.
    Release {
        /// Which executor.
        exec: usize,
    },
    /// The executor crashes; its caller restarts as a new attempt.
    Crash {
        /// Which executor.
        exec: usize,
    },
    /// The operator resolves an abandoned record as "did not happen".
    ResolveRelease,
    /// The operator resolves an abandoned record by storing a result.
    ResolveComplete,
    /// The store's purge of expired records runs.
    Purge,
}

fn lease_end_tick(t: Timestamp) -> u8 {
    u8::try_from(t.as_millis()).unwrap_or(u8::MAX)
}

/// A fenced call with this token may change nothing: the record is gone, completed, or holds
/// another token.
fn is_stale(live: Option<&Record>, token: u64) -> bool {
    live.is_none_or(|r| r.token.as_u64() != token || r.completed_at.is_some())
}

impl ProtocolModel {
    fn claim(&self, s: &mut State, e: usize, reply_lost: bool) -> Option<()> {
        let Exec::Waiting { claims_left } = s.execs[e] else {
            return None;
        };
        let claims_left = claims_left.checked_sub(1)?;
        let now = s.now;
        let prior = s.store.read(now);
        let answer = s
            .store
            .claim(&self.req, now, FencingToken::from_u64(s.next_token));
        if let Claim::Acquired(_) = answer {
            s.next_token += 1;
            if prior
                .as_ref()
                .is_some_and(|p| p.completed_at.is_some() || p.lease_expires_at > at(now))
            {
                s.ghost.early_takeover = true;
            }
        }
        if let Some((r, c)) = s.ghost.completed
            && self.retained(c, now)
        {
            let replayed = match &answer {
                Claim::Completed(rec) => rec.response.as_ref().and_then(result_id),
                _ => None,
            };
            if replayed != Some(r) {
                s.ghost.wrong_replay = true;
            }
        }
        s.execs[e] = match answer {
            _ if reply_lost => Exec::Waiting { claims_left },
            Claim::Acquired(lease) => Exec::Holding {
                token: lease.token.as_u64(),
                lease_end: lease_end_tick(lease.expires_at),
                started: false,
                takeover: prior.is_some(),
                claims_left,
            },
            Claim::Completed(rec) => match rec.response.as_ref().and_then(result_id) {
                Some(result) => Exec::Done {
                    result,
                    replayed: true,
                },
                None => Exec::Waiting { claims_left },
            },
            Claim::InFlight(_) | Claim::Abandoned(_) | Claim::Mismatch(_) => {
                Exec::Waiting { claims_left }
            }
        };
        Some(())
    }

    /// Applies a fenced call (`complete`, `release`, `extend`) and notes whether a stale token
    /// changed the store.
    fn fenced<T>(
        s: &mut State,
        token: u64,
        call: impl FnOnce(&mut Stored, FencingToken, u8) -> T,
    ) -> T {
        let before = s.store.clone();
        let stale = is_stale(before.read(s.now).as_ref(), token);
        let out = call(&mut s.store, FencingToken::from_u64(token), s.now);
        if stale && s.store != before {
            s.ghost.stale_write_changed = true;
        }
        out
    }

    fn step(&self, s: &mut State, action: Action) -> Option<()> {
        let now = s.now;
        match action {
            Action::Tick => s.now = now.checked_add(1).filter(|t| *t <= self.bounds.horizon)?,
            Action::Claim { exec, reply_lost } => self.claim(s, exec, reply_lost)?,
            Action::StartEffect { exec } => {
                let Exec::Holding {
                    started: started @ false,
                    lease_end,
                    takeover,
                    ..
                } = &mut s.execs[exec]
                else {
                    return None;
                };
                // An executor starts its effect inside its lease; one that starts after its
                // lease ended is what no lease protocol can stop (the effect would have to check
                // the token itself).
                if *lease_end <= now {
                    return None;
                }
                *started = true;
                if s.ghost.effects > 0 && !*takeover {
                    s.ghost.reexecution_without_abandonment = true;
                }
                s.ghost.effects = s.ghost.effects.saturating_add(1);
            }
            Action::Heartbeat { exec, reply_lost } => {
                let Exec::Holding { token, .. } = s.execs[exec] else {
                    return None;
                };
                let lease = self.req.lease;
                let got = Self::fenced(s, token, |st, t, now| st.extend(t, lease, now));
                if let (Ok(end), false, Exec::Holding { lease_end, .. }) =
                    (got, reply_lost, &mut s.execs[exec])
                {
                    *lease_end = lease_end_tick(end);
                }
            }
            Action::Complete { exec, reply_lost } => {
                let Exec::Holding {
                    token,
                    started: true,
                    claims_left,
                    ..
                } = s.execs[exec]
                else {
                    return None;
                };
                let done = Self::fenced(s, token, |st, t, now| {
                    st.complete(t, response_of(token), now)
                });
                if done.is_ok() && s.ghost.completed.is_none() {
                    s.ghost.completed = Some((token, now));
                }
                s.execs[exec] = match (done, reply_lost) {
                    (Ok(_), false) => Exec::Done {
                        result: token,
                        replayed: false,
                    },
                    _ => Exec::Waiting { claims_left },
                };
            }
            Action::Release { exec } => {
                let Exec::Holding {
                    token,
                    started: false,
                    claims_left,
                    ..
                } = s.execs[exec]
                else {
                    return None;
                };
                if Self::fenced(s, token, |st, t, now| st.release(t, now)).is_ok() {
                    s.ghost.effects = 0;
                }
                s.execs[exec] = Exec::Waiting { claims_left };
            }
            Action::Crash { exec } => {
                let Exec::Holding { claims_left, .. } = s.execs[exec] else {
                    return None;
                };
                s.execs[exec] = Exec::Waiting { claims_left };
            }
            Action::ResolveRelease => {
                s.store
                    .resolve(Resolution::Release, now, FencingToken::from_u64(0))
                    .ok()?;
                s.ghost.effects = 0;
            }
            Action::ResolveComplete => {
                let fresh = FencingToken::from_u64(s.next_token);
                let resolution = Resolution::Complete(response_of(OPERATOR_RESULT));
                s.store.resolve(resolution, now, fresh).ok()?;
                s.next_token += 1;
                if s.ghost.completed.is_none() {
                    s.ghost.completed = Some((OPERATOR_RESULT, now));
                }
            }
            Action::Purge => {
                s.store.purge(now).then_some(())?;
            }
        }
        self.observe(s);
        Some(())
    }

    /// After every step: a completion's retention that ended ends the record's life, and a
    /// stored result that differs from the first one is noted.
    fn observe(&self, s: &mut State) {
        if let Some((_, c)) = s.ghost.completed
            && !self.retained(c, s.now)
        {
            s.ghost.completed = None;
            s.ghost.effects = 0;
        }
        if let (Some((first, _)), Some(rec)) = (s.ghost.completed, s.store.read(s.now))
            && let Some(resp) = &rec.response
            && result_id(resp) != Some(first)
        {
            s.ghost.result_changed = true;
        }
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            store: Stored::default(),
            next_token: 1,
            execs: vec![
                Exec::Waiting {
                    claims_left: self.bounds.claims
                };
                self.bounds.executors
            ],
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A state that breaks a property ends its path. The checker keeps the last path it saw
        // break a property, and the ghost's flags stay set, so without this the trace reported
        // would run on past the step that broke the property.
        if properties::violated(self, s) {
            return;
        }
        if s.now < self.bounds.horizon {
            actions.push(Action::Tick);
        }
        for (exec, e) in s.execs.iter().enumerate() {
            match e {
                Exec::Waiting { claims_left } if *claims_left > 0 => {
                    for reply_lost in [false, true] {
                        actions.push(Action::Claim { exec, reply_lost });
                    }
                }
                Exec::Holding { started, .. } => {
                    if *started {
                        for reply_lost in [false, true] {
                            actions.push(Action::Complete { exec, reply_lost });
                        }
                    } else {
                        actions.push(Action::StartEffect { exec });
                        actions.push(Action::Release { exec });
                    }
                    for reply_lost in [false, true] {
                        actions.push(Action::Heartbeat { exec, reply_lost });
                    }
                    actions.push(Action::Crash { exec });
                }
                Exec::Waiting { .. } | Exec::Done { .. } => {}
            }
        }
        if s.store
            .read(s.now)
            .is_some_and(|r| r.state(at(s.now)) == RecordState::Abandoned)
        {
            // The operator is truthful: "did not happen" only when no effect ran in this life.
            // An operator who releases an effect that happened asks for a re-execution.
            if s.ghost.effects == 0 {
                actions.push(Action::ResolveRelease);
            }
            actions.push(Action::ResolveComplete);
        }
        if s.store.raw().is_some() {
            actions.push(Action::Purge);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        self.step(&mut s, action)?;
        Some(s)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        let mut all = properties::all(self.policy);
        if let Some(name) = self.only {
            all.retain(|p| p.name == name);
        }
        all
    }
}
