//! The native half of the `idem-runtime` npm package: [`idem_embed`]'s engine and key
//! derivation, bound to Node.js with napi-rs ([design §7](../../../docs/design.md#7-the-runtime-side)).
//!
//! This crate decides nothing: the state machine is idem-core's, the derivation idem-keys',
//! the store's opening and the fork-aware runtime idem-embed's. It converts values at the
//! boundary and moves every call that may block (opening a store, `begin`, which may wait for
//! a duplicate in flight, and `finish`) onto libuv's thread pool as an [`napi::bindgen_prelude::AsyncTask`],
//! so Node's event loop never waits on a store. The JavaScript side (`index.js`) holds the
//! scope context, the codec and the typed errors.
//!
//! Arguments cross as JSON text (`JSON.stringify` on the JavaScript side): one conversion,
//! and the same parser ([`idem_keys::parse_args`]) that refuses integers beyond 2^53 and lone
//! surrogates for the CLI.

mod derive;
mod ticket;
mod tool;

pub use derive::{check_key_fields, derive_key};
pub use ticket::{Finish, Ticket};
pub use tool::{Begin, BeginOutcome, OpenStore, Store, Tool, ToolOptions, open_store};

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
