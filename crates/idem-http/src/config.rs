//! [`Config`]: what the layer needs to know besides the store.

use std::time::Duration;

use idem_core::engine::DEFAULT_CACHE_BYTES;
use idem_core::{Anonymous, ScopeHeaders};

use crate::policy::Routes;
use crate::problem::ProblemFormat;

/// What the layer needs to know besides the store.
#[derive(Debug, Clone)]
pub struct Config {
    /// Per-route policy; unlisted routes honour a key when one is sent.
    pub routes: Routes,
    /// Which headers (and cookies) name the caller ([design §1](docs/design.md#1-words)):
    /// their hash is the scope, and a stored response is replayed only within it. By default
    /// `authorization`, `proxy-authorization`, `cookie`, `x-api-key`, `api-key` and
    /// `x-auth-token`.
    pub scope: ScopeHeaders,
    /// What a keyed request that carries none of them gets: refused with 400
    /// `principal-missing` (the default), or accepted in the one shared `anonymous` scope,
    /// where `Set-Cookie` and the like are never stored ([design §4](docs/design.md#4-which-results-are-kept)).
    pub anonymous: Anonymous,
    /// How refusals are written: RFC 9457 documents with type URIs under a base (the
    /// default, `urn:idem:problem:`), Stripe's error envelope, or a template.
    pub problems: ProblemFormat,
    /// How often a waiting duplicate re-reads the store when the first request runs in
    /// another process (in this process it is woken instead).
    pub poll_interval: Duration,
    /// The most of a response the layer buffers. A larger response cannot be stored or
    /// returned whole: the client gets 502 and the outcome is marked unknown.
    pub max_response_bytes: usize,
    /// How long a keyed request's body may take to arrive once the layer starts buffering it
    /// (the headers have been read by then); past it the client gets 408 `body-timeout`, with
    /// `Connection: close`, and nothing is claimed. `None` (the default): no bound here, the
    /// server's own.
    pub body_read: Option<Duration>,
    /// The bound in bytes of the cache of completed records that answers replays without a
    /// store round trip ([design §9](docs/design.md#9-performance-shape)); 0 turns it off.
    /// The cache reads expiry from the system clock.
    pub cache_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            routes: Routes::default(),
            scope: ScopeHeaders::default(),
            anonymous: Anonymous::Refuse,
            problems: ProblemFormat::default(),
            poll_interval: Duration::from_millis(25),
            max_response_bytes: 64 * 1024 * 1024,
            body_read: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}
