//! idem's OpenTelemetry traces ([design §13](docs/design.md#13-observability)).
//!
//! The spans themselves are plain `tracing` spans opened by the front ends
//! ([`idem_core::span`](../idem_core/span/index.html)) and filled in by the engine. This crate
//! connects them to OpenTelemetry:
//!
//! - [`propagate`]: the W3C trace context: a keyed request's span continues the caller's
//!   trace (`traceparent` on the way in), and the upstream call continues the span's (on the
//!   way out). Both are no-ops until a propagator is installed, which only [`export`] does.
//! - [`export`] (feature `export`, the `idem` binary): the OTLP exporter, on only when the
//!   standard `OTEL_*` variables ask for it.

pub mod propagate;

#[cfg(feature = "export")]
pub mod export;

pub use propagate::{continue_remote, inject};
