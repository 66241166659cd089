//! `idem serve`: a reverse proxy that puts idem in front of a service written in any language.
//!
//! Requests go through [`idem_http::IdempotencyLayer`] to a [`proxy::Proxy`] that forwards them
//! upstream with a pooled hyper client. The proxy tells the layer when a request surely never
//! reached the upstream (connection refused: the key is released, 502) and when it was sent
//! but no answer came (timeout or reset: the record becomes abandoned, 504/502), per
//! [design §4](docs/design.md#4-which-results-are-kept).
//!
//! - [`config`]: the TOML file, flags and environment, validated into [`config::Settings`].
//! - [`proxy`]: forwarding upstream.
//! - [`admin`]: `/healthz`, `/metrics`, `/keys/{key}`, and the admin page under `/ui`.
//! - [`server`]: listeners, background purge, graceful shutdown.
//! - [`listener`]: where connections come from (TCP, or a simulated network).
//! - `threads`: the threads that serve the connections, each with its own runtime and
//!   upstream pool.

pub mod admin;
pub mod config;
pub mod listener;
pub mod proxy;
pub mod server;
mod threads;

pub use config::{FileConfig, Overrides, Settings};
pub use listener::Listener;
pub use server::{Bound, Listeners, serve, serve_on};
