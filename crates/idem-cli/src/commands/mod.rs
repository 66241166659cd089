//! One module per subcommand.

pub(crate) mod demo;
pub(crate) mod gc;
pub(crate) mod inspect;
pub(crate) mod key;
pub(crate) mod mcp;
pub(crate) mod migrate;
pub(crate) mod resolve;
pub(crate) mod serve;
