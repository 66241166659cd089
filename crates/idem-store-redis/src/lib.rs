//! idem's shared store on Redis.
//!
//! Every transition is one Lua script over one key, so it is atomic and fenced by the
//! lease's token inside Redis, and each script touches a single slot (it works on Redis
//! Cluster). Time comes from Redis's clock unless a clock is injected, so gateways agree on
//! when a lease ends. Retention is Redis's own expiry, plus a check of the stored expiry on
//! every read; an index of completed records lets `purge_expired` (and `idem gc`) delete
//! expired records before Redis gets to them.
//!
//! ```text
//! redis://127.0.0.1:6379/0?prefix=idem
//! ```
//!
//! A server whose configuration can lose an acknowledged claim (no AOF, or AOF without
//! `appendfsync always`) or evict a record is refused at connect, unless the URL says
//! `durability=volatile` ([`Durability`]).

mod connection;
mod durability;
mod layout;
mod listing;
mod options;
mod reply;
mod scripts;
mod store;

pub use options::{
    CLUSTER_SCHEME, DEFAULT_PREFIX, Durability, RedisOptions, RedisUrlError, Server,
};
pub use store::RedisStore;
