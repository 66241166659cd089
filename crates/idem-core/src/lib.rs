//! idem's core: what every part of idem agrees on.
//!
//! - [`key`]: the idempotency key and its header form ([design §1](docs/design.md#1-words)).
//! - [`scope`]: whose keys these are.
//! - [`fingerprint`]: what makes a repeated key the same request.
//! - [`record`]: what a store keeps for one key; [`report`]: its story as JSON.
//! - [`machine`]: the record's state machine ([design §2](docs/design.md#2-the-records-life),
//!   [§3](docs/design.md#3-what-a-request-with-a-key-gets)), as pure functions.
//! - [`store`]: the `Store` contract every backend implements, and the metered wrapper the
//!   engine puts around every store.
//! - [`memory`]: the in-memory backend, which applies [`machine`] under a lock per shard.
//! - [`policy`]: tool classes and per-route or per-tool policy, validated once for every
//!   configuration file.
//! - [`engine`]: the one claim loop: run a side effect at most once per key, over any store,
//!   with in-process waiting for duplicates.
//! - [`problem`]: the names of refusals, shared by every protocol.
//! - [`outcome`]: what became of each request, counted the same way everywhere.
//! - [`span`]: the tracing span of each keyed request or tool call, and its attributes.
//! - [`clock`]: time, injected so tests can move it.
//!
//! The behaviour all of this follows is specified in `docs/design.md`; doc comments across the
//! workspace cite its sections as `[design §N](docs/design.md#...)`, paths from the repository
//! root.
//!
//! This crate depends on no web framework and no database driver (only the `http` types, for
//! scopes named by request headers); the HTTP layer, the gateway, the MCP proxy and each heavy
//! store live in their own crates.

pub mod clock;
pub mod engine;
pub mod fingerprint;
pub mod jcs;
pub mod key;
pub mod machine;
pub mod memory;
pub mod outcome;
pub mod policy;
pub mod problem;
pub mod record;
pub mod report;
pub mod scope;
pub mod span;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use engine::{Answer, Begun, Effect, Engine, Execution, Kept};
pub use fingerprint::Fingerprint;
pub use key::{Key, KeyError};
pub use memory::MemoryStore;
pub use outcome::Outcome;
pub use policy::{Policy, PolicyError, ToolClass};
pub use problem::ProblemType;
pub use record::{CompletedBy, FencingToken, Record, RecordState, StoredBody, StoredResponse};
pub use scope::{Anonymous, Scope, ScopeError, ScopeHeaders, ScopeHeadersError};
pub use store::{
    AbandonedPolicy, Claim, ClaimRequest, DEFAULT_RETENTION, Lease, ListRecords, Listed, Listing,
    RecordFilter, Resolution, Stale, Store, StoreError,
};
