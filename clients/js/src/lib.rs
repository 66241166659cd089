//! The native half of the `idem-runtime` npm package: [`idem_embed`]'s engine and key
//! derivation, bound to Node.js with napi-rs ([design §7](../../../docs/design.md#7-the-runtime-side)).
//!
//! This crate decides nothing: the state machine is idem-core's, the derivation idem-keys',
//! the store's opening and the fork-aware runtime idem-embed's. It converts values at the
//! boundary and keeps every call that may block off Node's event loop, in the store's lane
//! (`tool::Lane`): a `memory:` store's on the calling thread; a SQLite store's on libuv's
//! thread pool (an [`napi::bindgen_prelude::AsyncTask`]); a PostgreSQL or Redis store's as
//! tasks on idem's runtime that settle a promise (`settled_later`), as is every claim that
//! waits for a duplicate in flight. Opening a store goes to the pool.
//! The JavaScript side (`index.js`) holds the scope context, the codec and the typed errors.
//!
//! Arguments cross as JSON text (`JSON.stringify` on the JavaScript side): one conversion,
//! and the same parser ([`idem_keys::parse_args`]) that refuses integers beyond 2^53 and lone
//! surrogates for the CLI.

use std::sync::{Arc, Mutex, PoisonError};

use napi::bindgen_prelude::{Object, ToNapiValue};
use napi::{Env, JsDeferred};

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

/// How a promise made by [`settled_later`] is settled: once, from any thread.
type Resolver<V> = Box<dyn FnOnce(Env) -> napi::Result<V> + Send>;

/// A promise not yet settled; `None` once it is.
type Pending<V> = Arc<Mutex<Option<JsDeferred<V, Resolver<V>>>>>;

/// The promise of one [`settled_later`] call, to settle from any thread.
struct Settle<V: ToNapiValue + 'static>(Pending<V>);

impl<V: ToNapiValue + Send + 'static> Settle<V> {
    /// Settles the promise with `outcome` (made a JavaScript value back on the event loop).
    fn settle(self, outcome: napi::Result<V>) {
        let deferred = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        match (deferred, outcome) {
            (Some(d), Ok(value)) => d.resolve(Box::new(move |_env| Ok(value))),
            (Some(d), Err(e)) => d.reject(e),
            (None, _) => {}
        }
    }
}

/// Starts work that settles the returned promise later, from another thread: `start` gets the
/// promise's [`Settle`] and hands it to the work. If `start` fails instead, the promise is
/// rejected with its error, so a caller always gets a promise that settles.
///
/// Why not libuv's thread pool (an `AsyncTask`): a call there blocks a pool thread on idem's
/// runtime, two hops (event loop → pool thread → runtime, and back) where a task on the
/// runtime needs one, and a duplicate waiting for a call in flight held its pool thread, so
/// four of them (the pool's size) queued the first call's `finish`, the write that would end
/// their wait, behind them.
fn settled_later<'env, V, S>(env: &'env Env, start: S) -> napi::Result<Object<'env>>
where
    V: ToNapiValue + Send + 'static,
    S: FnOnce(Settle<V>) -> napi::Result<()>,
{
    let (deferred, promise) = env.create_deferred::<V, Resolver<V>>()?;
    let slot = Arc::new(Mutex::new(Some(deferred)));
    if let Err(e) = start(Settle(slot.clone())) {
        Settle(slot).settle(Err(e));
    }
    Ok(promise)
}
