//! The native half of the `idem-runtime` npm package: [`idem_embed`]'s engine and key
//! derivation, bound to Node.js with napi-rs ([design §7](../../../docs/design.md#7-the-runtime-side)).
//!
//! This crate decides nothing: the state machine is idem-core's, the derivation idem-keys',
//! the store's opening and the fork-aware runtime idem-embed's. It converts values at the
//! boundary and moves every call that may block off Node's event loop: opening a store,
//! `begin` and `finish` onto libuv's thread pool (an [`napi::bindgen_prelude::AsyncTask`]),
//! and a `begin` that waits for a duplicate in flight onto a thread of its own
//! (`on_own_thread`).
//! The JavaScript side (`index.js`) holds the scope context, the codec and the typed errors.
//!
//! Arguments cross as JSON text (`JSON.stringify` on the JavaScript side): one conversion,
//! and the same parser ([`idem_keys::parse_args`]) that refuses integers beyond 2^53 and lone
//! surrogates for the CLI.

use napi::Env;
use napi::bindgen_prelude::{Object, ToNapiValue};

mod derive;
mod http;
mod ticket;
mod tool;

pub use derive::{check_key_fields, derive_key};
pub use http::{Admission, Begun, HttpExecution, HttpFront, HttpKeyed, HttpReply, open_http_front};
pub use ticket::Ticket;
pub use tool::{BeginOutcome, OpenStore, Store, Tool, ToolOptions, open_store, shutdown};

/// A JavaScript `Error` with `code` set to `kind`, so the JavaScript side can map it to one of
/// its typed errors (`IdemError`'s subclasses) without parsing the message.
fn js_error(kind: &str, message: impl std::fmt::Display) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, format!("{kind}: {message}"))
}

/// The kind of an [`idem_embed::EmbedError`]: `store` (the store could not be used: nothing
/// ran) or `invalid` (a value the caller passed is wrong).
fn embed_error(e: &idem_embed::EmbedError) -> napi::Error {
    use idem_embed::EmbedError as E;
    let kind = match e {
        E::Store(_) | E::Host(_) => "store",
        _ => "invalid",
    };
    js_error(kind, e)
}

/// Runs `work` on a new thread and settles the returned promise with its result, made into a
/// JavaScript value by `to_js` back on the event loop. For waits only.
///
/// Not libuv's thread pool (`AsyncTask`): with duplicates waiting there for a call in flight,
/// as many as the pool has threads (4 by default), the first call's `finish`, the store write
/// that would wake them, queued behind them until their wait ran out. Every call on a thread
/// of its own measured 0.5 – 1.3 ms slower per SQLite or Redis call than the pool (thread
/// start and a promise settled from another thread), so only a claim that must wait pays it.
fn on_own_thread<'env, T, V, W, J>(env: &'env Env, work: W, to_js: J) -> napi::Result<Object<'env>>
where
    T: Send + 'static,
    V: ToNapiValue + 'static,
    W: FnOnce() -> napi::Result<T> + Send + 'static,
    J: FnOnce(T) -> napi::Result<V> + Send + 'static,
{
    let (deferred, promise) = env.create_deferred()?;
    std::thread::Builder::new()
        .name("idem-call".into())
        .spawn(move || match work() {
            Ok(value) => deferred.resolve(move |_env| to_js(value)),
            Err(e) => deferred.reject(e),
        })
        .map_err(|e| {
            js_error(
                "store",
                format!("could not start a thread for the call: {e}"),
            )
        })?;
    Ok(promise)
}
