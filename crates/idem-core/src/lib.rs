//! idem's core: what every part of idem agrees on.
//!
//! - [`key`]: the idempotency key and its header form (DESIGN §1).
//! - [`scope`]: whose keys these are.
//! - [`fingerprint`]: what makes a repeated key the same request.
//! - [`record`]: what a store keeps for one key; [`report`]: its story as JSON.
//! - [`machine`]: the record's state machine (DESIGN §2, §3), as pure functions.
//! - [`store`]: the `Store` contract every backend implements, and the in-memory backend.
//! - [`engine`]: run a side effect at most once per key, over any store.
//! - [`clock`]: time, injected so tests can move it.
//!
//! This crate depends on no web framework and no database driver; the HTTP layer, the
//! gateway and each heavy store live in their own crates.

pub mod clock;
pub mod engine;
pub mod fingerprint;
pub mod key;
pub mod machine;
pub mod record;
pub mod report;
pub mod scope;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use engine::{Answer, Effect, Engine, Kept, Policy};
pub use fingerprint::Fingerprint;
pub use key::{Key, KeyError};
pub use record::{CompletedBy, FencingToken, Record, RecordState, StoredBody, StoredResponse};
pub use scope::{Scope, ScopeError};
pub use store::memory::MemoryStore;
pub use store::{
    AbandonedPolicy, Claim, ClaimRequest, DEFAULT_RETENTION, Lease, Resolution, Stale, Store,
    StoreError,
};
