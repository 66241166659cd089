//! One module per subcommand.

pub(crate) mod gc;
pub(crate) mod inspect;
pub(crate) mod resolve;
pub(crate) mod serve;
