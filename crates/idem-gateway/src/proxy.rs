//! Forwarding to the upstream: a pooled hyper client (TLS with rustls for an `https://`
//! upstream), RFC 9110 proxy hygiene, and the line between "never sent" and "sent, no answer"
//! that decides whether a key is released ([design §4](docs/design.md#4-which-results-are-kept)).

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, bail};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use idem_http::{Body, Executed, Problem, ProblemFormat};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tower::Service;

use crate::config::Settings;

/// The client's address, put into request extensions by the server. Made once per
/// connection, with the address already written as the `X-Forwarded-For` value the proxy
/// adds to each of its requests.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    addr: SocketAddr,
    forwarded_for: Option<HeaderValue>,
}

impl ClientAddr {
    /// The client at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        ClientAddr {
            addr,
            forwarded_for: HeaderValue::from_str(&addr.ip().to_string()).ok(),
        }
    }

    /// The client's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The connector `idem serve` reaches its upstream with: TCP, and TLS for an `https://` one.
pub type UpstreamConnector = HttpsConnector<HttpConnector>;

/// A service that forwards requests to one upstream, connecting to it with `C` (a tower
/// `Service<Uri>` yielding connections): [`UpstreamConnector`] in `idem serve`; a simulated
/// network in the deterministic simulation (`tests/simulation/`).
///
/// A handle on what it shares: tower clones a service for every request it calls (the layer
/// once, the proxy once more for the forward's future), and one reference count is all such
/// a clone costs, where copying the client, the upstream's URL and the settings was several.
#[derive(Debug)]
pub struct Proxy<C = UpstreamConnector> {
    shared: Arc<Forwarding<C>>,
}

impl<C> Clone for Proxy<C> {
    fn clone(&self) -> Self {
        Proxy {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// What every clone of a [`Proxy`] forwards with.
#[derive(Debug)]
struct Forwarding<C> {
    client: Client<C, Body>,
    upstream: Uri,
    timeout: Duration,
    body_read: Duration,
    /// Whether `[upstream] ca_file` (or `--upstream-ca`) was given.
    has_ca_file: bool,
    /// How the gateway's own refusals are written: as the layer writes its own.
    problems: ProblemFormat,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded in either direction.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Where `name` is in [`HOP_BY_HOP`]: compared as strings, which is cheaper than comparing
/// `HeaderName`s for the custom ones.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    HOP_BY_HOP.iter().position(|h| h.as_str() == name.as_str())
}

/// Whether a token of a `Connection` value needs no removal of its own: a hop-by-hop name
/// (removed anyway) or `close`, in any case. nginx sends `Connection: keep-alive` with every
/// answer; this keeps that from being parsed into a header name, which allocates.
fn goes_anyway(token: &str) -> bool {
    token.eq_ignore_ascii_case("close")
        || HOP_BY_HOP
            .iter()
            .any(|h| token.eq_ignore_ascii_case(h.as_str()))
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
/// (`transfer-encoding` is left to hyper, which frames each side itself.) Most messages carry
/// none, or only `Connection: keep-alive` or `close`, so one pass over the names finds which
/// are there; only those are removed, and nothing is allocated unless `Connection` names a
/// header that is not hop-by-hop itself.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let present = headers
        .keys()
        .filter_map(hop_by_hop_index)
        .fold(0u8, |mask, i| mask | 1 << i);
    if present == 0 {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|token| !goes_anyway(token))
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for (i, name) in HOP_BY_HOP.into_iter().enumerate() {
        if present & 1 << i != 0 {
            headers.remove(name);
        }
    }
}

/// Reads a PEM file of CA certificates; an unreadable file, or one without a certificate,
/// is an error that names it.
pub fn load_ca_file(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read the upstream CA file {}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "the upstream CA file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    Ok(certs)
}

/// The TLS configuration for an `https://` upstream: the CAs of `ca_file`, or else the
/// system's; the server name (SNI, and the name checked) is the upstream's host.
fn tls_config(https: bool, ca_file: Option<&Path>) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in load_ca_file(path)? {
                roots
                    .add(cert)
                    .with_context(|| format!("the upstream CA file {}", path.display()))?;
            }
        }
        // An http:// upstream never uses them: the system's store is not read.
        None if !https => {}
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                bail!(
                    "no CA certificates found on this system{why}; give the upstream's CA with [upstream] ca_file or --upstream-ca"
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS configuration")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The TLS error in a client error's chain, if the connection failed in the handshake.
fn tls_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // An `io::Error` wraps another error (the TLS stream's io::Error, wrapped again by the
        // connector); its `source()` would skip a level, so it is opened with `get_ref()`.
        next = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// Idle upstream connections kept, across every serving thread's pool.
const MAX_IDLE_UPSTREAM: usize = 256;

/// Idle upstream connections a pool may keep however many threads share them out.
const MIN_IDLE_PER_POOL: usize = 16;

impl Proxy {
    /// A proxy to the configured upstream (scheme, authority and optional path prefix).
    /// Fails if an `https://` upstream has no CA certificates to trust.
    pub fn new(settings: &Settings) -> anyhow::Result<Self> {
        let upstream = settings.upstream.clone();
        let timeout = settings.upstream_timeout;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        http.enforce_http(false);
        let https = upstream.scheme() == Some(&http::uri::Scheme::HTTPS);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(https, settings.upstream_ca_file.as_deref())?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Proxy::with_connector(settings, connector))
    }
}

impl<C: Connect + Clone + Send + Sync + 'static> Proxy<C> {
    /// A proxy to `settings`' upstream that opens its connections with `connector`, which
    /// alone decides how (and whether) TCP and TLS are used: the rest (the pool, timeouts,
    /// the line between "never sent" and "sent, no answer") is the same as [`Proxy::new`]'s.
    pub fn with_connector(settings: &Settings, connector: C) -> Self {
        let timeout = settings.upstream_timeout;
        // Idle connections are retired before the upstream's keep-alive timeout would close
        // them under a request; one it closed anyway while the request waited to be written
        // is retried on a new connection by the client (`retry_canceled_requests`, on by
        // default): that request was never written.
        // `pool_idle_timeout = "0s"`: a connection per request. Each serving thread has a
        // pool of its own (`threads`), so the 256 idle connections are shared out among them.
        let max_idle = if settings.pool_idle_timeout.is_zero() {
            0
        } else {
            (MAX_IDLE_UPSTREAM / settings.threads.max(1)).max(MIN_IDLE_PER_POOL)
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(settings.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(max_idle)
            .retry_canceled_requests(true)
            .build(connector);
        Proxy {
            shared: Arc::new(Forwarding {
                client,
                upstream: settings.upstream.clone(),
                timeout,
                body_read: settings.body_read_timeout,
                has_ca_file: settings.upstream_ca_file.is_some(),
                problems: settings.layer.problems.clone(),
            }),
        }
    }

    fn upstream_authority(&self) -> String {
        self.shared
            .upstream
            .authority()
            .map_or_else(|| self.shared.upstream.to_string(), ToString::to_string)
    }

    /// The upstream URL of a request: the upstream's prefix, then the request's path and query
    /// exactly as they came, which are only forwarded when they cannot climb out of the prefix
    /// or read differently upstream ([`idem_http::screen_path`]; the layer screened them
    /// already, this keeps the proxy safe on its own). An absolute-form target is forwarded
    /// by its path, like the origin form; the other forms name no path.
    fn target(&self, uri: &Uri) -> Result<Uri, Unforwardable> {
        let root = http::uri::PathAndQuery::from_static("/");
        let pq = match uri.path_and_query() {
            Some(pq) if pq.path().starts_with('/') => pq,
            None if uri.scheme().is_some() => &root,
            _ => {
                return Err(Unforwardable::Refused(Problem::RequestInvalid(format!(
                    "The request target {:?} is not a path (origin or absolute form), so there is nothing to forward",
                    uri.to_string()
                ))));
            }
        };
        idem_http::screen_path(uri.path())
            .map_err(|e| Unforwardable::Refused(Problem::RequestInvalid(e.to_string())))?;
        let prefix = self.shared.upstream.path().trim_end_matches('/');
        let mut parts = self.shared.upstream.clone().into_parts();
        // Without a prefix the request's own path and query are forwarded as they are: a
        // clone of shared bytes, not a string to format and parse again.
        let pq = if prefix.is_empty() {
            Ok(pq.clone())
        } else {
            // The text as it came: `PathAndQuery`'s `Display` would add a `/` before a
            // query alone (`http://x?a=1`), which the prefix must not get.
            format!("{prefix}{}", pq.as_str())
                .parse()
                .map_err(http::Error::from)
        };
        let built = pq.and_then(|pq| {
            parts.path_and_query = Some(pq);
            Uri::from_parts(parts).map_err(http::Error::from)
        });
        built.map_err(Unforwardable::Unbuildable)
    }

    /// The gateway's own refusal of a request it will not forward: nothing was sent, so a key
    /// the layer claimed for it is released.
    fn refuse(&self, problem: &Problem) -> Response<Body> {
        self.failure(problem, Executed::NotSent)
    }

    /// The gateway's own answer, in the layer's envelope, telling the layer whether anything
    /// was sent.
    fn failure(&self, problem: &Problem, executed: Executed) -> Response<Body> {
        let mut resp = problem.render(&self.shared.problems).map(|bytes| {
            http_body_util::Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync()
        });
        resp.extensions_mut().insert(executed);
        resp
    }

    async fn forward(self, mut req: Request<Body>) -> Response<Body> {
        if req.method() == Method::CONNECT {
            return self.refuse(&Problem::MethodNotAllowed(req.method().to_string()));
        }
        let target = match self.target(req.uri()) {
            Ok(t) => t,
            Err(Unforwardable::Refused(problem)) => return self.refuse(&problem),
            Err(Unforwardable::Unbuildable(e)) => {
                return self.failure(
                    &Problem::UpstreamUnreachable(format!("cannot build the upstream URL: {e}")),
                    Executed::NotSent,
                );
            }
        };
        let original_host = req.headers().get(header::HOST).cloned();
        let client = req.extensions_mut().remove::<ClientAddr>();
        *req.uri_mut() = target;
        let headers = req.headers_mut();
        strip_hop_by_hop(headers);
        // The upstream sees its own authority as Host, and the original in X-Forwarded-Host.
        // What a client claims about forwarding is not passed on as if the gateway said it.
        headers.remove(header::HOST);
        headers.remove(header::FORWARDED);
        headers.remove(X_FORWARDED_HOST);
        if let Some(host) = original_host {
            headers.insert(X_FORWARDED_HOST, host);
        }
        if let Some(ip) = client.and_then(|c| c.forwarded_for) {
            // Every prior line, in order (a list may arrive split over several); one that is
            // not text makes the whole list untrustworthy, so it is replaced by the client's.
            let prior: Option<Vec<&str>> = headers
                .get_all(X_FORWARDED_FOR)
                .iter()
                .map(|v| v.to_str().ok())
                .collect();
            let value = match prior {
                Some(prior) if !prior.is_empty() => HeaderValue::from_str(&format!(
                    "{}, {}",
                    prior.join(", "),
                    ip.to_str().unwrap_or_default()
                )),
                _ => Ok(ip),
            };
            if let Ok(v) = value {
                headers.insert(X_FORWARDED_FOR, v);
            }
        }
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        // The upstream's spans join the keyed request's trace (when traces are exported).
        idem_telemetry::inject(headers);

        // A body streamed from the client (no key: the layer buffered keyed ones already) must
        // arrive within `body_read`; past it the upstream sees the body fail, and the client's
        // connection, its body unread, is closed after the answer.
        let req = req.map(|body| {
            Deadline::new(
                body,
                tokio::time::Instant::now() + self.shared.body_read,
                || Box::new(BodyTimedOut),
            )
            .boxed_unsync()
        });
        let deadline = tokio::time::Instant::now() + self.shared.timeout;
        match tokio::time::timeout_at(deadline, self.shared.client.request(req)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                // The HTTP version is the hop's, as the hop-by-hop headers are: the client's
                // connection speaks HTTP/1.1 whatever the upstream spoke (hyper answers an
                // HTTP/1.0 client in HTTP/1.0 by itself). Kept, an HTTP/1.0 upstream's
                // version made the answer HTTP/1.0 and closed the client's connection.
                parts.version = http::Version::HTTP_11;
                // The timeout covers the whole exchange: a body that stalls after the headers
                // fails at the same deadline, and the layer marks the outcome unknown.
                let body = Deadline::new(body, deadline, || {
                    "the upstream's response body did not arrive in time".into()
                });
                Response::from_parts(parts, body.boxed_unsync())
            }
            // The client's body was too slow: the upstream saw part of it, so whether it acted
            // is unknown (a keyed request's body was buffered before, so none gets here).
            Ok(Err(e)) if in_chain::<BodyTimedOut>(&e) => {
                tracing::info!(timeout = ?self.shared.body_read, "a request body did not arrive in time; cut off upstream");
                let mut resp = self.refuse(&Problem::BodyTimeout(self.shared.body_read));
                resp.extensions_mut().insert(Executed::Unknown);
                resp
            }
            // The TLS handshake failed, in the connector: nothing was sent.
            Ok(Err(e)) if e.is_connect() && tls_error(&e).is_some() => {
                let tls = tls_error(&e).map(ToString::to_string).unwrap_or_default();
                let hint = tls_error(&e).map_or("", |tls| tls_hint(tls, self.shared.has_ca_file));
                self.failure(
                    &Problem::UpstreamUnreachable(format!("TLS with the upstream at {} failed: {tls}{hint}; nothing was sent, so a retry is safe", self.upstream_authority())),
                    Executed::NotSent,
                )
            }
            // Nothing reached the upstream: a retry is safe, so the key is released.
            Ok(Err(e)) if e.is_connect() => self.failure(
                &Problem::UpstreamUnreachable(format!("could not connect to the upstream at {}: {}; nothing was sent, so a retry is safe", self.upstream_authority(), cause(&e))),
                Executed::NotSent,
            ),
            // Sent, then the connection failed: the upstream may have acted.
            Ok(Err(e)) => self.failure(
                &Problem::UpstreamFailed(format!("the connection to the upstream at {} failed after the request was sent ({}); whether it acted is unknown", self.upstream_authority(), cause(&e))),
                Executed::Unknown,
            ),
            Err(_) => self.failure(
                &Problem::UpstreamTimeout(format!("the upstream at {} did not answer within {:?}; whether it acted is unknown", self.upstream_authority(), self.shared.timeout)),
                Executed::Unknown,
            ),
        }
    }
}

/// What to add to a failed TLS handshake's message: how to trust a private CA, only when the
/// certificate's issuer is unknown and no CA file was given (a wrong name or an expired
/// certificate is not fixed by one).
fn tls_hint(e: &rustls::Error, has_ca_file: bool) -> &'static str {
    match e {
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
            if !has_ca_file =>
        {
            " (to trust a private CA, give it with [upstream] ca_file or --upstream-ca)"
        }
        _ => "",
    }
}

/// Why a request has no upstream URL.
#[derive(Debug)]
enum Unforwardable {
    /// The request target is not one to forward: the client gets this problem.
    Refused(Problem),
    /// The URL could not be put together.
    Unbuildable(http::Error),
}

/// A body that fails with `late()` once `at` has passed, whether it is waiting for data then or
/// has more ready. The timer is armed only once the body has to wait: a body that is all there
/// (every keyed request's, buffered by the layer, and most small answers) never touches the
/// timer wheel.
struct Deadline<B> {
    inner: B,
    at: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    late: fn() -> idem_http::BoxError,
}

impl<B> Deadline<B> {
    fn new(inner: B, at: tokio::time::Instant, late: fn() -> idem_http::BoxError) -> Self {
        Deadline {
            inner,
            at,
            sleep: None,
            late,
        }
    }
}

/// The error of a client's request body that did not arrive within `body_read`.
#[derive(Debug)]
struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client's request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimedOut {}

/// Whether an error of type `E` is in `e`'s chain of sources.
fn in_chain<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<E>() {
            return true;
        }
        next = err.source();
    }
    false
}

impl<B> http_body::Body for Deadline<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<idem_http::BoxError>,
{
    type Data = Bytes;
    type Error = idem_http::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            // A body that always has data ready is held to the deadline too: a clock read,
            // not the timer wheel.
            if tokio::time::Instant::now() >= self.at {
                return Poll::Ready(Some(Err((self.late)())));
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let at = self.at;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err((self.late)()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The innermost cause of a client error ("Connection refused (os error 111)"), not the
/// client's own wrapping of it.
fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

impl<C: Connect + Clone + Send + Sync + 'static> Service<Request<Body>> for Proxy<C> {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body with another frame always ready, or never one.
    struct Endless(bool);

    impl http_body::Body for Endless {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            if self.0 {
                Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"x")))))
            } else {
                Poll::Pending
            }
        }
    }

    #[tokio::test]
    async fn a_body_deadline_holds_whether_data_is_ready_or_not() {
        let past = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let now = tokio::time::Instant::now();
        let late = || -> idem_http::BoxError { "late".into() };
        // Data is ready on every poll: still cut off once the deadline has passed.
        let mut flood = Deadline::new(Endless(true), past, late);
        assert!(matches!(flood.frame().await, Some(Err(_))));
        // Waiting for data past the deadline.
        let mut stalled = Deadline::new(Endless(false), now + Duration::from_millis(20), late);
        assert!(matches!(stalled.frame().await, Some(Err(_))));
        // Before the deadline, frames pass, and no timer is armed while they are ready.
        let mut early = Deadline::new(Endless(true), now + Duration::from_secs(60), late);
        for _ in 0..3 {
            assert!(matches!(early.frame().await, Some(Ok(_))));
        }
        assert!(early.sleep.is_none());
    }

    #[test]
    fn the_private_ca_hint_is_only_for_an_unknown_issuer_without_a_ca_file() {
        use rustls::CertificateError as C;
        let hint = |c: C, has| tls_hint(&rustls::Error::InvalidCertificate(c), has);
        assert!(hint(C::UnknownIssuer, false).contains("ca_file"));
        assert_eq!(hint(C::UnknownIssuer, true), "");
        assert_eq!(hint(C::Expired, false), "");
        assert_eq!(hint(C::NotValidForName, false), "");
        assert_eq!(tls_hint(&rustls::Error::DecryptError, false), "");
    }

    #[test]
    fn each_upstream_problem_has_its_own_title_and_status() {
        let title = |p: Problem| {
            let resp = p.to_response("urn:idem:problem:");
            let doc: serde_json::Value = serde_json::from_slice(resp.body()).expect("json");
            (
                resp.status().as_u16(),
                doc["type"].clone(),
                doc["title"].clone(),
            )
        };
        let (status, kind, unreachable) = title(Problem::UpstreamUnreachable("x".into()));
        assert_eq!(
            (status, kind.as_str()),
            (502, Some("urn:idem:problem:upstream-unreachable"))
        );
        assert_eq!(unreachable, "Upstream unreachable");
        let (status, _, failed) = title(Problem::UpstreamFailed("x".into()));
        assert_eq!(status, 502);
        assert!(
            failed
                .as_str()
                .is_some_and(|t| t.contains("after the request was sent"))
        );
        let (status, _, late) = title(Problem::UpstreamTimeout("x".into()));
        assert_eq!(status, 504);
        assert!(late.as_str().is_some_and(|t| t.contains("in time")));
    }

    #[test]
    fn hop_by_hop_headers_go_including_those_connection_names() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("idempotency-key", HeaderValue::from_static("k"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["idempotency-key", "authorization"]);

        // Every one of the list goes, by its index; a message with none is left alone.
        for name in HOP_BY_HOP {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            h.insert("content-type", HeaderValue::from_static("application/json"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name}");
            assert!(h.contains_key("content-type"));
        }
        // Connection naming hop-by-hop headers only, as nginx's `keep-alive` does.
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Keep-Alive, TE"));
        h.append("connection", HeaderValue::from_static("x-named"));
        h.insert("x-named", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-kept"]);
    }

    #[test]
    fn targets_keep_path_query_and_prefix() {
        let p = |up: &str| {
            let file = crate::FileConfig::parse(&format!("upstream = {up:?}")).unwrap();
            Proxy::new(&Settings::resolve(file, crate::Overrides::default()).unwrap()).unwrap()
        };
        let uri: Uri = "/v1/charges?x=1".parse().unwrap();
        let t = |proxy: Proxy| {
            proxy
                .target(&uri)
                .map(|u| u.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            t(p("http://127.0.0.1:3000")),
            "http://127.0.0.1:3000/v1/charges?x=1"
        );
        assert_eq!(
            t(p("http://127.0.0.1:3000/api/")),
            "http://127.0.0.1:3000/api/v1/charges?x=1"
        );
        // An absolute-form target with a query and no path: the prefix gets the query alone.
        let query_only = |up: &str| {
            p(up)
                .target(&"http://elsewhere?a=1".parse().unwrap())
                .map(|u| u.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            query_only("http://127.0.0.1:3000/api"),
            "http://127.0.0.1:3000/api?a=1"
        );
        assert_eq!(
            query_only("http://127.0.0.1:3000"),
            "http://127.0.0.1:3000/?a=1"
        );
    }

    #[test]
    fn targets_never_leave_the_prefix() {
        let file = crate::FileConfig::parse("upstream = \"http://127.0.0.1:3000/api\"").unwrap();
        let proxy =
            Proxy::new(&Settings::resolve(file, crate::Overrides::default()).unwrap()).unwrap();
        let t = |target: &str| proxy.target(&target.parse().unwrap());
        for bad in [
            "/../admin",
            "/v1/%2E%2E/%2e%2e/admin",
            "/v1\\..\\admin",
            "*",
            "example.com:443",
        ] {
            assert!(
                matches!(
                    t(bad),
                    Err(Unforwardable::Refused(Problem::RequestInvalid(_)))
                ),
                "{bad}"
            );
        }
        let ok = |target: &str| t(target).map(|u| u.to_string()).unwrap_or_default();
        assert_eq!(ok("/v1/a%2Fb"), "http://127.0.0.1:3000/api/v1/a%2Fb");
        assert_eq!(
            ok("http://elsewhere/v1/x?y"),
            "http://127.0.0.1:3000/api/v1/x?y"
        );
    }
}
