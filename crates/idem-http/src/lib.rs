//! idem over HTTP: [`IdempotencyLayer`], a tower layer that makes unsafe requests carrying an
//! `Idempotency-Key` execute at most once, over any idem [`Store`](idem_core::Store).
//!
//! For each request the layer follows [design §3](docs/design.md#3-what-a-request-with-a-key-gets):
//! a request the inner service could read differently from the routes is refused
//! ([`screen`]); safe methods pass through; the key is read and validated; the body is
//! buffered (bounded) and fingerprinted; then [`idem_core::Engine::run`] claims the key and runs the inner service only if
//! the claim acquired (waiting for an in-flight duplicate where the route says so), and its
//! response is stored (or the key released, for 429/503) and returned. The layer only parses and
//! maps answers to HTTP; the claim loop is the engine's. A repeat gets the stored
//! response with `Idempotent-Replayed: true`. Refusals are RFC 9457 problem documents
//! ([`Problem`]). Store failures answer 503 and never run the inner service.
//!
//! - [`layer`]: [`IdempotencyLayer`]; [`config`]: its [`Config`].
//! - [`service`]: [`Idempotency`], the service, and the [`Executed`] marker for proxies.
//! - [`policy`]: per-route policy ([`Routes`], [`RoutePolicy`], [`PathPattern`]).
//! - [`problem`]: the problem documents.
//! - [`capture`]: what of a response is stored and replayed.
//! - [`encoding`]: a body as the fingerprint reads it, decoded from its `Content-Encoding`.
//! - [`target`]: the target a framework routes, from the one a client wrote ([`origin_form`]).
//!
//! # Cancel safety
//! If the request future is dropped while the inner service runs (the client hung up) or the
//! inner service panics, the key is not released: the effect may have happened. The lease runs
//! out and the record reads as abandoned ([design §5](docs/design.md#5-unknown-outcomes)).
//!
//! # Metrics
//! Through the `metrics` facade: `idem_requests_total{outcome}` (executed, replayed, conflict,
//! mismatch, missing, invalid, store_error, outcome_unknown, not_sent, passthrough),
//! `idem_store_call_seconds{op}`, `idem_store_errors_total{op}`,
//! `idem_abandoned_records_total`, `idem_completions_lost_total`, `idem_purged_records_total`.

pub mod capture;
pub mod config;
pub mod encoding;
pub mod file;
pub mod front;
pub mod layer;
pub mod policy;
pub mod problem;
pub mod service;
pub mod target;

pub use capture::REPLAYED;
pub use config::Config;
pub use file::FileConfig;
pub use front::{Admission, BodyError, Captured, Front, Keyed};
pub use idem_core::engine::DEFAULT_CACHE_BYTES;
pub use idem_core::{Anonymous, ScopeHeaders};
pub use layer::IdempotencyLayer;
pub use policy::{
    PathPattern, PatternError, Route, RouteId, RoutePolicy, Routes, Unmatched, screen, screen_path,
};
pub use problem::{DEFAULT_PROBLEM_BASE, Problem, ProblemFormat, ProblemTemplate, TemplateError};
pub use service::{Body, BoxError, Executed, Idempotency};
pub use target::origin_form;
