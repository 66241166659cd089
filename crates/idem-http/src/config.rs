//! [`Config`]: what the layer needs to know besides the store.

use std::time::Duration;

use http::HeaderName;
use http::header::AUTHORIZATION;

use crate::policy::Routes;
use crate::problem::DEFAULT_PROBLEM_BASE;

/// What the layer needs to know besides the store.
#[derive(Debug, Clone)]
pub struct Config {
    /// Per-route policy; unlisted routes honour a key when one is sent.
    pub routes: Routes,
    /// Headers whose values name the caller ([design §1](docs/design.md#1-words)): their hash is
    /// the scope. A request with none of them is in the anonymous scope.
    pub scope_headers: Vec<HeaderName>,
    /// Base of problem type URIs.
    pub problem_base: String,
    /// How often a waiting duplicate re-reads the store when the first request runs in
    /// another process (in this process it is woken instead).
    pub poll_interval: Duration,
    /// The most of a response the layer buffers. A larger response cannot be stored or
    /// returned whole: the client gets 502 and the outcome is marked unknown.
    pub max_response_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            routes: Routes::default(),
            scope_headers: vec![AUTHORIZATION],
            problem_base: DEFAULT_PROBLEM_BASE.to_owned(),
            poll_interval: Duration::from_millis(25),
            max_response_bytes: 64 * 1024 * 1024,
        }
    }
}
