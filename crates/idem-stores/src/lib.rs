//! Open any idem store by URL: `memory:`, `sqlite:PATH`, `postgres://...[?schema=NAME]` or
//! `redis://...[?prefix=NAME]`.
//!
//! The libraries (the engine, the tower layer, the gateway, the MCP proxy) are generic over
//! [`idem_core::Store`]; something has to turn the text an operator wrote into one backend.
//! That choice lives here, once, rather than in each program that needs it (the `idem`
//! binary today, the Python and TypeScript bindings next), so that every front end accepts
//! the same URLs, refuses them with the same words and never prints a password.
//!
//! - [`StoreUrl`]: a parsed URL whose `Display` and `Debug` hide secrets; [`StoreUrlError`]
//!   says why one was refused, without repeating a secret either.
//! - [`StoreUrl::open`] and [`StoreUrl::open_existing`] connect and give an [`AnyStore`],
//!   one enum that implements `Store` by dispatching to the backend chosen at run time.
//! - [`DEFAULT_STORE`]: the store used when none is named.
//!
//! The backend crates are re-exported ([`sqlite`], [`postgres`], [`redis`]) because their
//! types are the payloads of [`AnyStore`]'s variants: a caller that matches on one (to print
//! a PostgreSQL schema, say) can name what it finds without depending on the backend itself.

mod any;
mod url;

pub use any::AnyStore;
pub use url::{DEFAULT_STORE, NoStoreFile, StoreUrl, StoreUrlError, redact};

pub use idem_store_postgres as postgres;
pub use idem_store_redis as redis;
pub use idem_store_sqlite as sqlite;
