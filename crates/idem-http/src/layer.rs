//! [`IdempotencyLayer`]: configuration, shared by every service it wraps.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::header::AUTHORIZATION;
use idem_core::{Engine, Store};
use tower_layer::Layer;

use crate::metered::MeteredStore;
use crate::policy::Routes;
use crate::problem::DEFAULT_PROBLEM_BASE;
use crate::service::Idempotency;
use crate::waiters::Waiters;

/// What the layer needs to know besides the store.
#[derive(Debug, Clone)]
pub struct Config {
    /// Per-route policy; unlisted routes honour a key when one is sent.
    pub routes: Routes,
    /// Headers whose values name the caller (DESIGN §1): their hash is the scope. A request
    /// with none of them is in the anonymous scope.
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

/// What every [`Idempotency`] service built by one layer shares.
#[derive(Debug)]
pub(crate) struct Shared<St> {
    pub(crate) engine: Engine<MeteredStore<St>>,
    pub(crate) config: Config,
    pub(crate) waiters: Arc<Waiters>,
}

/// Makes unsafe requests that carry an `Idempotency-Key` execute at most once (DESIGN §3).
///
/// ```
/// use axum::{Router, routing::post};
/// use idem_core::MemoryStore;
/// use idem_http::{Config, IdempotencyLayer, PathPattern, RoutePolicy, Routes};
///
/// let routes = Routes::default().route(
///     Some(http::Method::POST),
///     PathPattern::new("/v1/charges").unwrap(),
///     RoutePolicy::requiring_key(),
/// );
/// let config = Config { routes, ..Config::default() };
/// let app: Router = Router::new()
///     .route("/v1/charges", post(|| async { "charged" }))
///     .layer(IdempotencyLayer::new(MemoryStore::new(), config));
/// ```
#[derive(Debug)]
pub struct IdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `store`.
    pub fn new(store: St, config: Config) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                engine: Engine::new(MeteredStore::new(store)),
                config,
                waiters: Arc::default(),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        self.shared.engine.store().get_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, self.shared.clone())
    }
}
