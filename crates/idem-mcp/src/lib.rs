//! idem's MCP proxy: makes any MCP server's side-effecting tools safe to retry
//! ([design §7](docs/design.md#7-the-runtime-side), [§8](docs/design.md#8-mcp)).
//!
//! MCP has no idempotency key. The proxy sits in front of an MCP server, in the server's own
//! trust domain, and adds one: each effect tool gets a required `idempotency_key` argument, and
//! a `tools/call` with a key already used returns the stored `CallToolResult` (marked
//! `_meta.idem.replayed`) instead of running the tool again.
//!
//! - [`policy`]: which tools are effects (MCP annotations, overridden by a TOML file), and
//!   how their keys behave.
//! - [`schema`]: adding `idempotency_key` to input schemas, and taking it out of arguments.
//! - [`call`]: one effect call over the engine: claim, forward, store, replay, refuse.
//! - [`proxy`]: the rmcp `ServerHandler` that holds an rmcp client of the upstream.
//! - [`stdio`], [`http`]: the two transports (stdio to the client and a spawned upstream;
//!   streamable HTTP on both sides).
//!
//! The example MCP server to try it on (`idem example-mcp`) is not here: it lives with the
//! example payment API in `idem-demo`, so the proxy's library carries no example's database.
//!
//! # Cancel safety
//! A client that cancels a call or hangs up does not cancel a call already forwarded: it runs
//! in a task of its own, its result is stored, and a retry replays it ([`call`]).

pub mod call;
pub mod http;
pub mod policy;
pub mod proxy;
pub mod schema;
pub mod stdio;

pub use call::{Forwarded, Guard};
pub use policy::{Policies, ToolPolicy};
pub use proxy::{Proxy, ScopeBy};
