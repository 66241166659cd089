//! The Lua scripts, each the shared prelude followed by its body, and [`Invocation`]: one call
//! of a script.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

use crate::layout::Shard;

const PRELUDE: &str = include_str!("lua/prelude.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// The scripts, loaded into Redis on first use (EVALSHA, falling back to loading the script).
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

/// One call of a script: `EVALSHA`, its hash, its keys and arguments, written straight into
/// the command that is sent. (The redis crate's `ScriptInvocation` keeps each key and
/// argument in a vector of its own and copies them into the command at the call: for a claim
/// and its completion, about 25 allocations of the ~110 a Redis new key made in the gateway;
/// docs/benchmarks.md, issue 33, "Redis replies and script calls".)
pub(crate) struct Invocation<'s> {
    script: &'s Script,
    cmd: Cmd,
}

impl<'s> Invocation<'s> {
    /// A call over `keys` (Redis Cluster routes it by the first), with room for `args` more
    /// arguments: numbers and short strings, and `bytes` more for a long one (a response).
    pub(crate) fn new(script: &'s Script, keys: &[&str], args: usize, bytes: usize) -> Self {
        let room = keys.iter().map(|k| k.len()).sum::<usize>() + 64 + 24 * args + bytes;
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args, room);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys);
        Invocation { script, cmd }
    }

    /// A call over one record: its key, then its shard's two indexes (the keys every script
    /// that changes a record's state keeps true in the same step).
    pub(crate) fn on_record(
        script: &'s Script,
        shard: &Shard,
        record: &str,
        args: usize,
        bytes: usize,
    ) -> Self {
        Invocation::new(script, &[record, shard.live(), shard.expiry()], args, bytes)
    }

    /// Adds `ARGV[i]`, the next argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Runs the script; on `NOSCRIPT` (the server restarted or flushed its scripts), loads it
    /// and runs it once more, as the redis crate's own invocation does.
    pub(crate) async fn invoke(&self, con: &mut impl ConnectionLike) -> RedisResult<Value> {
        match self.cmd.query_async(con).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(con).await?;
                self.cmd.query_async(con).await
            }
            answer => answer,
        }
    }
}
