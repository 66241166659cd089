//! idem's embedded default store: one SQLite file, no server to install.
//!
//! # Durability without collapsing throughput
//! A claim must be on disk before `claim` returns, because the side effect runs next
//! ([design §9](docs/design.md#9-performance-shape) ). One fsync per claim caps a disk at a few
//! thousand claims a second, so writes go through one writer thread that commits whatever has
//! queued up while the previous commit was being synced: many concurrent claims, one transaction,
//! one fsync (group commit). Nothing waits for a timer; a lone claim commits at once.
//!
//! Every `claim` goes to the writer thread. It reads the batch's claims first, without the
//! write lock, and answers those a read settles (a replay, a lease in flight, another
//! fingerprint): a replay waits for no write lock and costs no fsync (replay counts are
//! written at most every 250 ms under `synchronous=NORMAL`). The rest, nearly always fresh keys, are
//! written under the lock, where the claim decides again. While this process's own write
//! waits for another process's lock, a claim asks a reader thread first, so a replay is not
//! queued behind that wait. `get` runs on reader threads with their own connections, grouped
//! into read transactions as the writer groups commits, and never waits for the writer: in
//! WAL mode readers see the last commit. An operator's listing runs alone on tokio's blocking
//! pool.
//!
//! # Several processes
//! Several processes may open one file: each has its own writer, and SQLite's file lock
//! (`BEGIN IMMEDIATE`) serialises their transactions, so a claim stays atomic across them.
//! All must be on one host (WAL needs shared memory), not on a network file system.
//!
//! # Bounded time
//! Every operation answers within [`SqliteOptions::op_timeout`] (5 s by default;
//! `sqlite:PATH?timeout=2s`): past it the caller gets `StoreError::Unavailable`, whatever holds
//! the writer or a read up (another process's lock, a slow disk, a frozen file system), and
//! the writer does not grant a claim to a caller that gave up
//! ([design §6](docs/design.md#6-a-store-failure-fails-closed)).
//!
//! # Runtime
//! The async methods need a tokio runtime with its timer (every operation is bounded); the
//! store's own threads do the file work, so any runtime flavour will do.

mod checkpoint;
mod queue;
mod readers;
mod row;
mod schema;
mod stopping;
mod store;
pub mod testing;
mod writer;

pub use schema::SCHEMA_VERSION;
pub use store::{DEFAULT_TIMEOUT, SqliteOptions, SqliteStore, WriterStats};
