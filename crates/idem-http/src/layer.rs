//! [`IdempotencyLayer`]: one engine and one configuration, shared by every service it wraps.

use std::sync::Arc;

use idem_core::{Engine, Store};
use tower_layer::Layer;

use crate::config::Config;
use crate::front::Front;
use crate::service::{Idempotency, Shared};

/// Makes unsafe requests that carry an `Idempotency-Key` execute at most once
/// ([design §3](docs/design.md#3-what-a-request-with-a-key-gets)).
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
                engine: Engine::new(store)
                    .with_poll_interval(config.poll_interval)
                    .with_cache_bytes(config.cache_bytes),
                front: Front::new(config),
            }),
        }
    }

    /// This layer over another handle on the same store ([`Store::for_this_runtime`]),
    /// sharing its configuration, in-process waiters and completed-record cache.
    #[must_use]
    pub fn with_store(&self, store: St) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                engine: self.shared.engine.with_store(store),
                front: self.shared.front.clone(),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        self.shared.engine.store()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        self.shared.front.config()
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, self.shared.clone())
    }
}
