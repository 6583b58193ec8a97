//! Idempotency as a tower layer (feature `axum`), for services that cannot
//! take the attribute: a hand-written tower stack, a hyper service, a tonic
//! server with many methods.
//!
//! [`IdempotencyLayer`] claims each request it has a step for before the
//! inner service runs, and stores what that service answers; the service
//! does its business writes through [`Tx`], the claim's transaction, which
//! the layer commits with the stored answer. A retry with the same key gets
//! the stored answer, byte for byte, plus `idempotent-replayed: true`.
//!
//! The protocol is the attribute's: the key is the `idempotency-key` header
//! (gRPC: metadata entry), the scope a header (`x-tenant-id` unless
//! [`IdempotencyLayer::with_scope_header`] or
//! [`IdempotencyLayer::with_scope`] says otherwise), and refusals, in-progress
//! and store errors are answered as problem details over HTTP and as the
//! statuses of the `grpc` module (feature `tonic`) for `application/grpc` requests. Which
//! answers are stored: HTTP statuses by [`StoredStatuses`], gRPC codes by
//! `StoredCodes` (the status read from the trailers). A gRPC answer is
//! stored only when it is a single uncompressed message or a status; a
//! streamed one is passed through and rolled back.
//!
//! **The fingerprint** is the method, the path and the raw body bytes, or
//! what [`IdempotencyLayer::with_fingerprint`] computes from them. Against
//! `#[derive(Fingerprint)]` this loses the request's structure: a field that
//! does not change the operation (a timestamp, a trace id in the body:
//! `#[fingerprint(skip)]`), a reordered JSON object or map, or a message
//! encoded by another client library all count as another request, and the
//! retry is refused as a reused key. Fingerprint the parsed body yourself
//! where that matters.
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem_runtime::tower::{IdempotencyLayer, Tx};
//! use idem_runtime::{Engine, Step};
//! use sqlx::Sqlite;
//!
//! const CREATE_ORDER: Step = Step::new("create-order.v1");
//!
//! async fn create_order(mut tx: Tx<Sqlite>) -> &'static str {
//!     sqlx::query("INSERT INTO orders (sku) VALUES ('sku-1')")
//!         .execute(&mut *tx)
//!         .await
//!         .unwrap();
//!     "created"
//! }
//!
//! fn app(engine: Engine<Sqlite>) -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .layer(IdempotencyLayer::new(engine, CREATE_ORDER))
//! }
//! ```

mod answer;
mod tx;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::BodyExt;
use tracing::Instrument;

pub use tx::{NoTransaction, Tx};

use crate::engine::{Claim, Engine};
use crate::fingerprint::FingerprintHasher;
use crate::http::KeptHeaders;
use crate::outcome::{Outcome, ReplayError, StoredResponse, StoredStatuses};
use crate::store::Backend;
use crate::{Operation, Scope, Step};
use answer::Protocol;

/// The largest body the layer reads by default: 4 MiB, gRPC's default
/// message limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How the layer reads a request's scope.
type ScopeFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;

/// How the layer fingerprints a request: its head and its raw body.
pub type FingerprintFn = fn(&Parts, &[u8], &mut FingerprintHasher);

/// A tower layer that makes the requests it has a step for idempotent; see
/// the [module](self) docs.
///
/// ```
/// use idem_runtime::tower::IdempotencyLayer;
/// use idem_runtime::{Engine, Step};
/// use sqlx::Sqlite;
///
/// const CHARGE_CARD: Step = Step::new("charge-card.v1");
///
/// fn layer(engine: Engine<Sqlite>) -> IdempotencyLayer<Sqlite> {
///     // Only `Charge` is claimed; every other method passes through.
///     IdempotencyLayer::for_paths(engine, [("/idem.payments.v1.Payments/Charge", CHARGE_CARD)])
///         .with_scope_header("x-tenant-id")
///         .with_max_body_bytes(64 * 1024)
/// }
/// ```
pub struct IdempotencyLayer<DB: Backend> {
    engine: Engine<DB>,
    config: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    steps: Steps,
    scope: ScopeFn,
    scope_header: Option<&'static str>,
    fingerprint: FingerprintFn,
    max_body_bytes: usize,
    kept: KeptHeaders,
    statuses: StoredStatuses,
    #[cfg(feature = "tonic")]
    codes: crate::grpc::StoredCodes,
}

#[derive(Clone)]
enum Steps {
    Every(&'static str),
    ByPath(Arc<[(String, &'static str)]>),
}

impl<DB: Backend> Clone for IdempotencyLayer<DB> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: self.config.clone(),
        }
    }
}

impl<DB: Backend> IdempotencyLayer<DB> {
    /// Every request through the layer is claimed under `step`.
    pub fn new(engine: Engine<DB>, step: Step) -> Self {
        Self::with_steps(engine, Steps::Every(step.name()))
    }

    /// Requests whose path is listed are claimed under its step; the others
    /// pass through untouched (a gRPC method's path is
    /// `/package.Service/Method`).
    pub fn for_paths<'a>(
        engine: Engine<DB>,
        routes: impl IntoIterator<Item = (&'a str, Step)>,
    ) -> Self {
        let routes = routes
            .into_iter()
            .map(|(path, step)| (path.to_owned(), step.name()))
            .collect();
        Self::with_steps(engine, Steps::ByPath(routes))
    }

    fn with_steps(engine: Engine<DB>, steps: Steps) -> Self {
        let config = Config {
            steps,
            scope: header_scope("x-tenant-id"),
            scope_header: Some("x-tenant-id"),
            fingerprint: raw_request,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            kept: KeptHeaders::DEFAULT,
            statuses: StoredStatuses::DEFAULT,
            #[cfg(feature = "tonic")]
            codes: crate::grpc::StoredCodes::default(),
        };
        Self {
            engine,
            config: Arc::new(config),
        }
    }

    fn configure(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// The scope is this header's value (`x-tenant-id` by default); a
    /// request without it is refused (400, gRPC `INVALID_ARGUMENT`).
    pub fn with_scope_header(self, name: &'static str) -> Self {
        self.configure(|config| {
            config.scope = header_scope(name);
            config.scope_header = Some(name);
        })
    }

    /// The scope is what `scope` reads from the request's head (an
    /// authenticated principal an earlier layer put in the extensions, say);
    /// `None` refuses the request.
    pub fn with_scope(
        self,
        scope: impl Fn(&Parts) -> Option<Scope> + Send + Sync + 'static,
    ) -> Self {
        self.configure(|config| {
            config.scope = Arc::new(scope);
            config.scope_header = None;
        })
    }

    /// The fingerprint is what `fingerprint` writes, instead of the method,
    /// the path and the raw body.
    pub fn with_fingerprint(self, fingerprint: FingerprintFn) -> Self {
        self.configure(|config| config.fingerprint = fingerprint)
    }

    /// Bodies over `max` bytes are refused (413, gRPC `RESOURCE_EXHAUSTED`)
    /// before anything is claimed.
    pub fn with_max_body_bytes(self, max: usize) -> Self {
        self.configure(|config| config.max_body_bytes = max)
    }

    /// The response headers (gRPC: metadata entries) kept with the answer.
    pub fn with_kept_headers(self, kept: KeptHeaders) -> Self {
        self.configure(|config| config.kept = kept)
    }

    /// The HTTP statuses stored and replayed.
    pub fn with_stored_statuses(self, statuses: StoredStatuses) -> Self {
        self.configure(|config| config.statuses = statuses)
    }

    /// The gRPC codes stored and replayed.
    #[cfg(feature = "tonic")]
    pub fn with_stored_codes(self, codes: crate::grpc::StoredCodes) -> Self {
        self.configure(|config| config.codes = codes)
    }
}

impl<S, DB: Backend> ::tower_layer::Layer<S> for IdempotencyLayer<DB> {
    type Service = IdempotencyService<S, DB>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            engine: self.engine.clone(),
            config: self.config.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around `S`. `S` receives the
/// request with its body read ([`Body`]) and, when the request was claimed,
/// its [`Tx`] in the extensions.
pub struct IdempotencyService<S, DB: Backend> {
    inner: S,
    engine: Engine<DB>,
    config: Arc<Config>,
}

impl<S: Clone, DB: Backend> Clone for IdempotencyService<S, DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            engine: self.engine.clone(),
            config: self.config.clone(),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, DB, B, RB> ::tower_service::Service<Request<B>> for IdempotencyService<S, DB>
where
    S: ::tower_service::Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    DB: Backend,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone takes the next request; this call keeps the service that
        // was polled ready.
        let next = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, next);
        Box::pin(claimed(
            ready,
            self.engine.clone(),
            self.config.clone(),
            request,
        ))
    }
}

/// One request through the layer.
async fn claimed<S, DB, B, RB>(
    mut inner: S,
    engine: Engine<DB>,
    config: Arc<Config>,
    request: Request<B>,
) -> Result<Response<Body>, S::Error>
where
    S: ::tower_service::Service<Request<Body>, Response = Response<RB>>,
    DB: Backend,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let Some(step) = config.step_for(parts.uri.path()) else {
        let response = inner
            .call(Request::from_parts(parts, Body::new(body)))
            .await?;
        return Ok(response.map(Body::new));
    };
    let protocol = Protocol::of(&parts.headers);
    let key = match protocol.key(&parts.headers) {
        Ok(key) => key,
        Err(refusal) => return Ok(*refusal),
    };
    let Some(scope) = (config.scope)(&parts) else {
        return Ok(protocol.no_scope(config.scope_header));
    };
    let body = match http_body_util::Limited::new(body, config.max_body_bytes)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) => return Ok(protocol.unreadable_body(error, config.max_body_bytes)),
    };
    let mut hasher = FingerprintHasher::new(step);
    (config.fingerprint)(&parts, &body, &mut hasher);
    let op = Operation::with_fingerprint(scope, key, step, hasher.finish());
    let span = crate::http::operation_span(&op);
    async move {
        let guard = match engine.claim(&op).await {
            Ok(Claim::Execute(guard)) => guard,
            Ok(Claim::Replay(replay)) => {
                return Ok(match replay.decode::<StoredResponse>() {
                    Ok(answer) => protocol.render(answer.value, answer.via),
                    Err(error) => protocol.error(error),
                })
            }
            Err(error) => return Ok(protocol.error(error)),
        };
        let slot = tx::TxSlot::new(guard);
        parts.extensions.insert(slot.clone());
        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        let response = inner
            .call(Request::from_parts(parts, Body::from(body)))
            .await?;
        let answer = answer::Collected::read(response).await;
        let Some(guard) = slot.take() else {
            tracing::error!(
                "the service kept its Tx past its answer; the claim rolls back when it is dropped"
            );
            return Ok(answer.into_response());
        };
        let stored = answer.to_stored(protocol, &config);
        match guard.commit(Decided(stored.clone())).await {
            Ok(committed) => Ok(match stored {
                Some(stored) => protocol.render(stored, committed.via),
                None => answer.into_response(),
            }),
            Err(error) => Ok(protocol.error(error)),
        }
    }
    .instrument(span)
    .await
}

impl Config {
    fn step_for(&self, path: &str) -> Option<&'static str> {
        match &self.steps {
            Steps::Every(step) => Some(step),
            Steps::ByPath(routes) => routes
                .iter()
                .find(|(route, _)| route == path)
                .map(|(_, step)| *step),
        }
    }
}

/// The scope read from header `name`.
fn header_scope(name: &'static str) -> ScopeFn {
    Arc::new(move |parts: &Parts| {
        let value = parts.headers.get(name)?.to_str().ok()?.trim();
        (!value.is_empty()).then(|| Scope::tenant(value))
    })
}

/// The default fingerprint: the method, the path and the raw body.
fn raw_request(parts: &Parts, body: &[u8], hasher: &mut FingerprintHasher) {
    hasher.write_str(parts.method.as_str());
    hasher.write_str(parts.uri.path());
    hasher.write_bytes(body);
}

/// The layer's decision, stored as it is (or not at all).
struct Decided(Option<StoredResponse>);

impl Outcome for Decided {
    fn to_stored(&self) -> Option<StoredResponse> {
        self.0.clone()
    }

    fn from_stored(stored: StoredResponse) -> Result<Self, ReplayError> {
        Ok(Self(Some(stored)))
    }
}
