//! The Lua scripts, each the shared prelude followed by its body.

use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// The scripts, loaded into Redis on first use (EVALSHA, falling back to EVAL).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
    pub(crate) extend: Script,
    pub(crate) get: Script,
    pub(crate) resolve: Script,
    pub(crate) purge: Script,
    pub(crate) held: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            claim: script(include_str!("lua/claim.lua")),
            complete: script(include_str!("lua/complete.lua")),
            release: script(include_str!("lua/release.lua")),
            extend: script(include_str!("lua/extend.lua")),
            get: script(include_str!("lua/get.lua")),
            resolve: script(include_str!("lua/resolve.lua")),
            purge: script(include_str!("lua/purge.lua")),
            held: script(include_str!("lua/held.lua")),
        }
    }
}
