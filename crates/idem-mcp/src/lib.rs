//! idem's MCP proxy: makes any MCP server's side-effecting tools safe to retry
//! ([design §7](docs/design.md#7-the-runtime-side), [§8](docs/design.md#8-mcp)).
//!
//! MCP has no idempotency key. The proxy sits in front of an MCP server, in the server's own
//! trust domain, and adds one: a `tools/call` of an effect tool with a key already used
//! returns the stored result (marked `_meta.idem.replayed`) instead of running the tool again.
//! The key comes from the runtime (`_meta.idempotency_key`, SEP-3182's `idempotencyKey`), from
//! the model (an `idempotency_key` argument the proxy adds to the tool's schema), or is derived
//! by the proxy, as the tool's policy says.
//!
//! The proxy relays the protocol rather than rebuilding it: every message it does not
//! interpret passes as the bytes it came in.
//!
//! - [`rpc`]: JSON-RPC messages as the relay reads them, with a size bound.
//! - [`inbound`]: what a client message is, read fail-closed: a message that any parser
//!   could read another way is refused, never relayed.
//! - [`policy`]: which tools are effects (MCP annotations, overridden by a TOML file), and
//!   how their keys and errors behave.
//! - [`schema`]: the `idempotency_key` property in input schemas, and where a call's key is
//!   read from.
//! - [`call`]: one effect call over the engine: claim, forward, store, replay, refuse.
//! - [`proxy`]: what the proxy interprets, whatever the transport.
//! - [`stdio`], [`http`]: the two transports (stdio to the client and a spawned upstream;
//!   streamable HTTP on both sides, `https://` upstreams included).
//!
//! The example MCP server to try it on (`idem example-mcp`) is not here: it lives with the
//! example payment API in `idem-demo`, so the proxy's library carries no example's database.
//!
//! # Cancel safety
//! A client that cancels a call or hangs up does not cancel a call already forwarded: it runs
//! in a task of its own, under an id of the proxy's (the client's cancellation names an id
//! the upstream never saw), its result is stored, and a retry replays it ([`call`]).

pub mod call;
pub mod http;
pub mod inbound;
pub mod policy;
pub mod proxy;
pub mod rpc;
pub mod schema;
pub mod stdio;

pub use call::{Forwarded, Guard};
pub use policy::{KeySource, Policies, ToolPolicy};
pub use proxy::Proxy;
