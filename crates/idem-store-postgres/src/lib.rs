//! idem's shared store on PostgreSQL.
//!
//! Many gateways (or many instances of a service) share one database: a claim is one
//! statement that PostgreSQL's unique index makes atomic, every later write is fenced by the
//! lease's token, and time can come from the database so the instances agree on one clock.
//! [`PgStore::claim_in`] and [`PgStore::complete_in`] run inside a transaction of the
//! service's own, so its side effect and the record commit together
//! ([design §5](docs/design.md#5-unknown-outcomes)).
//!
//! ```text
//! postgres://user@host:5432/db?schema=idem
//! ```

mod batch;
mod claims;
mod completions;
mod inner;
mod leases;
mod listing;
mod maintenance;
mod options;
mod prepared;
mod refusals;
mod replay_writer;
mod replays;
mod schema;
mod server;
mod sql;
mod store;
mod transactional;

pub use options::{
    DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, Durability, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL,
    KEEPALIVE_RETRIES, MAX_POOL_SIZE, PgOptions, PgUrlError, Pooler,
};
pub use schema::{NoSchema, SCHEMA_VERSION};
pub use store::PgStore;
pub use transactional::TxClaim;
