//! idem's engine for a host language: what the Python (`clients/python`) and Node.js
//! (`clients/js`) packages bind, so that neither holds a second implementation of the state
//! machine ([design §7](docs/design.md#7-the-runtime-side)).
//!
//! A binding's function runs on the host's own thread, outside any Rust future, so this crate
//! offers the engine in two blocking halves over plain values:
//!
//! 1. [`Store::begin`] derives nothing and decides everything: it claims the key (waiting for
//!    a duplicate in flight, as every front end does) and answers either a [`Ticket`] (run
//!    the function) or a [`Prior`] answer (a replay, a conflict, a mismatch, an unknown
//!    outcome).
//! 2. [`Ticket::finish`] keeps what the function reported: its encoded result, "not run"
//!    (the key is released), or "unknown" (the record is abandoned at once).
//!
//! The heartbeat runs on the process's runtime ([`host()`]) while the function runs. Stores are
//! opened once per URL per process and shared by every thread; a forked child gets a runtime
//! and connections of its own. A blocking call on a Redis store makes its round trips on the
//! calling thread, over a connection lent to it for the call (`driven.rs`).
//!
//! Key derivation with a subset of the arguments ([`fields`]) lives here too, so both
//! languages select fields by the same rules; and the HTTP core for the languages' web
//! middleware ([`http`]), so an ASGI, WSGI, Express, Fastify or Hono service answers a keyed
//! request exactly as the tower layer and `idem serve` do.

pub mod call;
mod driven;
pub mod fields;
pub mod host;
pub mod http;

pub use call::{Claimed, Prior, PriorKind, Report, Saved, Started, Store, Ticket, ToolPolicy};
pub use fields::{FieldError, KeyFields};
pub use host::{HostError, after_fork, before_fork, host, shutdown};
pub use idem_stores::DEFAULT_STORE;

/// Parses arguments given as JSON text; integers beyond 2^53 and lone surrogates are errors
/// (docs/key-derivation.md), never roundings.
pub fn parse_args(text: &str) -> Result<serde_json::Value, EmbedError> {
    Ok(idem_keys::parse_args(text)?)
}

/// Why a binding's call failed before anything ran.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// The store URL is malformed.
    #[error(transparent)]
    StoreUrl(#[from] idem_stores::StoreUrlError),
    /// The store could not be opened, read or written: nothing ran (fail closed).
    #[error("{0}")]
    Store(#[from] idem_core::StoreError),
    /// The process's runtime could not be started.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A policy value that would let one key run twice, or never replay.
    #[error(transparent)]
    Policy(#[from] idem_core::PolicyError),
    /// The key is not a valid idempotency key.
    #[error(transparent)]
    Key(#[from] idem_core::KeyError),
    /// The key could not be derived.
    #[error(transparent)]
    Derive(#[from] idem_keys::DeriveError),
    /// A SQLite store in a process forked from one that had SQLite open
    /// (the [`host`](mod@crate::host) module explains why).
    #[error(
        "this process was forked from process {parent}, which had a SQLite store open; SQLite's \
         locks do not survive fork() (https://www.sqlite.org/howtocorrupt.html), so idem will \
         not use SQLite here rather than risk the store. Start workers with the 'spawn' or \
         'forkserver' method (multiprocessing.set_start_method(\"forkserver\")), or use a \
         postgres:// or redis:// store, which work across fork()"
    )]
    ForkedSqlite {
        /// The process that had SQLite open.
        parent: u32,
    },
    /// A value the host passed is not one of the accepted ones.
    #[error("{0}")]
    Value(String),
    /// A key field is not in the arguments.
    #[error(transparent)]
    Field(#[from] FieldError),
}

/// Derives the key of an intent ([`idem_keys::derive`]), from the whole arguments or, with
/// `fields`, from only the named ones ([`KeyFields::select`]).
pub fn derive_key(
    scope: &str,
    tool: &str,
    args: &serde_json::Value,
    ordinal: u64,
    secret: Option<&[u8]>,
    fields: Option<&KeyFields>,
) -> Result<idem_core::Key, EmbedError> {
    let args = key_args(args, fields)?;
    Ok(idem_keys::derive(scope, tool, &args, ordinal, secret)?)
}

/// What a key and its fingerprint are taken over: the key fields' selection, or the whole
/// arguments.
pub(crate) fn key_args<'a>(
    args: &'a serde_json::Value,
    fields: Option<&KeyFields>,
) -> Result<std::borrow::Cow<'a, serde_json::Value>, FieldError> {
    Ok(match fields {
        Some(f) => std::borrow::Cow::Owned(f.select(args)?),
        None => std::borrow::Cow::Borrowed(args),
    })
}
