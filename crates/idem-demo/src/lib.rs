//! `idem demo`: the failure idem exists for, reproduced on real parts and prevented.
//!
//! - [`api`]: an example payment API that is not idempotent (`idem example-api`).
//! - [`mcp_server`]: the same kind of service as an MCP server, whose `charge_card` is not
//!   idempotent either (`idem example-mcp`), to put `idem mcp` in front of.
//! - [`link`]: a lossy link that loses responses after the far side acted.
//! - [`run`](mod@run): the two runs (naive retries; keys at intent with the gateway in front)
//!   and the report, with charges counted from the API's database.

pub mod api;
pub mod link;
pub mod mcp_server;
pub mod run;

pub use run::{Options, Report, RunReport, run};
