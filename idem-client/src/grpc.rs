//! Retrying gRPC calls with one idempotency key: a tower layer for tonic channels.
//!
//! [`IdempotentRetryLayer`] wraps a `tonic::transport::Channel` (or any
//! service a generated tonic client accepts) in [`IdempotentRetry`], which
//! sends every call with an `idempotency-key` metadata entry and retries it
//! with the same key and the same message bytes, by the same [`RetryPolicy`]
//! as the HTTP client: its backoff, its attempt limit, its deadline and its
//! per-attempt timeout.
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_client::grpc::{self, IdempotentRetryLayer};
//! use idem_client::{IdempotencyKey, ResponseExt, RetryPolicy};
//! use tonic::codegen::http::uri::PathAndQuery;
//! use tower::ServiceBuilder;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
//! let policy = RetryPolicy::default().deadline(Duration::from_secs(10));
//! let channel = ServiceBuilder::new()
//!     .layer(IdempotentRetryLayer::new(policy))
//!     .service(channel);
//! // A generated client takes it as it takes the channel: `PaymentsClient::new(channel)`.
//! let mut client = tonic::client::Grpc::new(channel);
//! client.ready().await?;
//! // The key the pending work was stored with.
//! let key = IdempotencyKey::new("order-7")?;
//! let request = grpc::with_key(tonic::Request::new("charge 25 EUR".to_owned()), key);
//! let path = PathAndQuery::from_static("/payments.Payments/Charge");
//! let codec = tonic_prost::ProstCodec::<String, String>::default();
//! let response = client.unary(request, path, codec).await?;
//! println!("{} attempt(s), replayed: {}", response.attempts(), response.replayed());
//! # Ok(()) }
//! ```
//!
//! # The key
//!
//! The key set with [`with_key`] is sent on every attempt, as the RFC 8941
//! string the HTTP client sends. A call without one keeps an
//! `idempotency-key` entry the caller put in its metadata by hand, and
//! otherwise gets a fresh [`IdempotencyKey::random`] minted before its first
//! attempt: its retries are then safe, but a retry after a crash is not, so
//! store the key with the pending work and pass it with [`with_key`] (see the
//! [crate docs](crate#keeping-the-key-with-the-pending-work)). Every call is
//! keyed, so [`RetryPolicy::missing_key`](crate::RetryPolicy::missing_key)
//! plays no part here.
//!
//! # What is retried
//!
//! | answer | retried? | wait |
//! |---|---|---|
//! | an error of the channel (connection refused or reset, lost before the answer); a per-attempt timeout | yes | backoff |
//! | `UNAVAILABLE` | yes | `grpc-retry-pushback-ms` if sent, else backoff |
//! | `ABORTED` with `idempotency-problem: <in progress>` ([`IN_PROGRESS_PROBLEM`](crate::IN_PROGRESS_PROBLEM)), idem's "still running" | yes | `grpc-retry-pushback-ms` if sent, else backoff |
//! | a negative `grpc-retry-pushback-ms` (gRFC A6: "do not retry") | never | – |
//! | any other `ABORTED`, `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, any other code | never | – |
//! | a response that carries a message | never | – |
//!
//! The pushback is capped by [`RetryPolicy::retry_after_cap`](crate::RetryPolicy::retry_after_cap),
//! as `Retry-After` is. When the attempt limit is reached, or the next wait
//! would pass the deadline, the last answer is returned as it is (an
//! `UNAVAILABLE` stays an `UNAVAILABLE`) or, if it got none, the channel's
//! last error. An attempt still running at the deadline is cut off with
//! `DEADLINE_EXCEEDED`. [`ResponseExt`] reads the attempts and
//! `idempotent-replayed` off a [`tonic::Response`].
//!
//! The status is read where the server put it: in the response headers (a
//! trailers-only answer, how tonic and most servers send errors), or in the
//! trailers that follow headers without a message. The layer reads the body
//! up to its first message or its trailers, whichever comes first, and hands
//! on what it read with the rest: a message means the call was answered, so
//! nothing after it changes the decision, and a server-streaming answer keeps
//! streaming.
//!
//! # Streaming requests
//!
//! The request body is buffered once when it is complete at the call, which
//! a unary or server-streaming call's one message always is (so is a client
//! stream given as a finished list). A request stream still being produced
//! (client or bidirectional streaming) cannot be sent twice: such a call is
//! sent once, unretried, with the key, and without the deadline.
//!
//! # Tracing
//!
//! Each call is one `idempotent_call` span (the RPC path, the key's log tag,
//! and at the end the attempts and the code, when the status came before any
//! message); each attempt is one event in it: `retrying` with the reason and
//! the wait, `answered`, or `giving up` with the reason.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt as _, Full};
use idem_core::header::{
    GRPC_RETRY_PUSHBACK_MS, IDEMPOTENCY_KEY, IDEMPOTENCY_PROBLEM, IDEMPOTENT_REPLAYED,
};
use idem_core::problem::types::IN_PROGRESS;
use idem_core::IdempotencyKey;
use tonic::body::Body;
use tonic::{Code, Status};
use tower_service::Service;
use tracing::Instrument;

use crate::middleware::structured_field_string;
use crate::policy::RetryPolicy;
use crate::response::{Attempts, ResponseExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `request` with `key` as its idempotency key, sent on every attempt by
/// [`IdempotentRetry`]. Pass the key the pending work was stored with.
///
/// The key travels as a typed request extension, and replaces an
/// `idempotency-key` metadata entry set by hand.
///
/// ```
/// use idem_client::{grpc, IdempotencyKey};
///
/// let request = grpc::with_key(tonic::Request::new(()), IdempotencyKey::new("order-7").unwrap());
/// assert_eq!(request.extensions().get::<IdempotencyKey>().unwrap().as_str(), "order-7");
/// ```
pub fn with_key<T>(mut request: tonic::Request<T>, key: IdempotencyKey) -> tonic::Request<T> {
    request.extensions_mut().insert(key);
    request
}

/// The tower layer that wraps a tonic channel in [`IdempotentRetry`].
///
/// ```
/// use idem_client::grpc::IdempotentRetryLayer;
/// use idem_client::RetryPolicy;
///
/// # #[tokio::main] async fn main() {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let channel = tower::ServiceBuilder::new()
///     .layer(IdempotentRetryLayer::new(RetryPolicy::default().max_attempts(3)))
///     .service(channel);
/// let _client = tonic::client::Grpc::new(channel);
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotentRetryLayer {
    policy: RetryPolicy,
}

impl IdempotentRetryLayer {
    /// A layer whose services retry by `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

impl<S> tower_layer::Layer<S> for IdempotentRetryLayer {
    type Service = IdempotentRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentRetry {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// A gRPC channel that keys every call and retries it with the same key and
/// message; made by [`IdempotentRetryLayer`]. See the [module docs](self) for
/// what is retried.
///
/// ```no_run
/// use idem_client::grpc::{IdempotentRetry, IdempotentRetryLayer};
/// use idem_client::RetryPolicy;
/// use tonic::transport::{Channel, Endpoint};
/// use tower::Layer;
///
/// # async fn run() -> Result<(), tonic::transport::Error> {
/// let channel = Endpoint::from_static("http://127.0.0.1:50051").connect().await?;
/// let channel: IdempotentRetry<Channel> = IdempotentRetryLayer::new(RetryPolicy::default()).layer(channel);
/// let _client = tonic::client::Grpc::new(channel);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct IdempotentRetry<S> {
    inner: S,
    policy: RetryPolicy,
}

impl<S, B> Service<http::Request<Body>> for IdempotentRetry<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service polled ready goes to this call; a clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (mut parts, body) = request.into_parts();
        let key = match parts.extensions.get::<IdempotencyKey>() {
            Some(key) => Some(key.clone()),
            None if parts.headers.contains_key(IDEMPOTENCY_KEY) => None,
            None => Some(IdempotencyKey::random()),
        };
        if let Some(key) = &key {
            parts
                .headers
                .insert(IDEMPOTENCY_KEY, structured_field_string(key));
        }
        let span = tracing::info_span!(
            "idempotent_call",
            rpc = parts.uri.path(),
            key = key.map(|k| k.log_tag()).unwrap_or_default(),
            attempts = tracing::field::Empty,
            code = tracing::field::Empty,
        );
        let policy = self.policy.clone();
        Box::pin(call(inner, policy, parts, body).instrument(span))
    }
}

/// Why an attempt is worth another, and the wait the server asked for.
struct Retry {
    reason: &'static str,
    pushback: Option<Duration>,
}

impl Retry {
    fn after_backoff(reason: &'static str) -> Option<Self> {
        Some(Self {
            reason,
            pushback: None,
        })
    }
}

/// One logical call: as many attempts as the policy allows.
async fn call<S, B>(
    mut inner: S,
    policy: RetryPolicy,
    parts: http::request::Parts,
    body: Body,
) -> Result<http::Response<Body>, BoxError>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let message = match buffer_now(body)? {
        Buffered::Complete(message) => message,
        Buffered::Streaming(body) => {
            tracing::debug!("a streaming request: sent once");
            record(1, None);
            let mut response = inner
                .call(http::Request::from_parts(parts, Body::new(body)))
                .await
                .map_err(Into::into)?
                .map(Body::new);
            response.extensions_mut().insert(Attempts(1));
            return Ok(response);
        }
    };
    let started = Instant::now();
    let deadline = policy.call_deadline();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        if attempt > 1 {
            poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(Into::into)?;
        }
        let request =
            http::Request::from_parts(parts.clone(), Body::new(Full::new(message.clone())));
        let remaining = deadline.saturating_sub(started.elapsed());
        let timeout = policy
            .per_attempt_timeout()
            .filter(|timeout| *timeout < remaining);
        let sent =
            tokio::time::timeout(timeout.unwrap_or(remaining), send(&mut inner, request)).await;
        let (outcome, retry, code) = match sent {
            Ok(sent) => sent,
            Err(_) => match timeout {
                Some(timeout) => {
                    let status = Status::deadline_exceeded(format!(
                        "attempt {attempt} got no answer within its timeout of {timeout:?}"
                    ));
                    (Err(status.into()), Retry::after_backoff("timed out"), None)
                }
                None => {
                    tracing::warn!(attempt, "attempt cut off: the deadline passed");
                    record(attempt, Some(Code::DeadlineExceeded));
                    return Err(Status::deadline_exceeded(format!(
                        "no answer within the deadline of {deadline:?} (attempt {attempt} was cut off); \
                         the operation may have happened, retry later with the same idempotency key"
                    ))
                    .into());
                }
            },
        };
        let Some(retry) = retry else {
            record(attempt, code);
            return match outcome {
                Ok(response) => {
                    tracing::info!(attempt, code = code.map(i32::from), "answered");
                    Ok(with_attempts(response, attempt))
                }
                Err(error) => {
                    tracing::warn!(attempt, %error, "failed; not retried");
                    Err(error)
                }
            };
        };
        let wait = match retry.pushback {
            Some(asked) => asked.min(policy.retry_after_limit()),
            None => policy.backoff_delay(attempt),
        };
        let why = if attempt >= policy.attempts_allowed() {
            "attempt limit reached"
        } else if started.elapsed() + wait >= deadline {
            "the next wait would pass the deadline"
        } else {
            tracing::info!(
                attempt,
                reason = retry.reason,
                wait_ms = wait.as_millis() as u64,
                pushback = retry.pushback.is_some(),
                "retrying"
            );
            tokio::time::sleep(wait).await;
            continue;
        };
        tracing::warn!(
            attempt,
            reason = retry.reason,
            wait_ms = wait.as_millis() as u64,
            "giving up: {why}"
        );
        record(attempt, code);
        return outcome.map(|response| with_attempts(response, attempt));
    }
}

/// One attempt: its outcome, whether it is worth another, and the code if the
/// status came before any message.
async fn send<S, B>(
    inner: &mut S,
    request: http::Request<Body>,
) -> (
    Result<http::Response<Body>, BoxError>,
    Option<Retry>,
    Option<Code>,
)
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let response = match inner.call(request).await {
        Ok(response) => response.map(Body::new),
        Err(error) => {
            return (
                Err(error.into()),
                Retry::after_backoff("transport error"),
                None,
            )
        }
    };
    // A trailers-only answer: the status is in the headers.
    if let Some(code) = grpc_code(response.headers()) {
        let retry = classify(code, response.headers());
        return (Ok(response), retry, Some(code));
    }
    let (parts, mut body) = response.into_parts();
    let first = loop {
        match body.frame().await {
            Some(Ok(frame)) if frame.data_ref().is_some_and(Bytes::is_empty) => continue,
            Some(Ok(frame)) => break Some(frame),
            Some(Err(status)) => {
                let retry = Retry::after_backoff("connection lost before the answer");
                return (Err(status.into()), retry, None);
            }
            None => break None,
        }
    };
    let trailers = first.as_ref().and_then(Frame::trailers_ref);
    let code = trailers.and_then(grpc_code);
    let retry = trailers
        .zip(code)
        .and_then(|(trailers, code)| classify(code, trailers));
    let body = Body::new(Resumed { first, rest: body });
    (Ok(http::Response::from_parts(parts, body)), retry, code)
}

/// Whether a status is worth another attempt, and the pushback it asks for.
fn classify(code: Code, metadata: &HeaderMap) -> Option<Retry> {
    let pushback = metadata
        .get(GRPC_RETRY_PUSHBACK_MS)
        .and_then(|v| v.to_str().ok()?.trim().parse::<i64>().ok());
    let reason = match code {
        // gRFC A6: a negative pushback means "do not retry".
        _ if pushback.is_some_and(|ms| ms < 0) => return None,
        Code::Unavailable => "UNAVAILABLE",
        Code::Aborted
            if metadata
                .get(IDEMPOTENCY_PROBLEM)
                .is_some_and(|v| v == IN_PROGRESS) =>
        {
            "ABORTED: in progress"
        }
        _ => return None,
    };
    Some(Retry {
        reason,
        pushback: pushback.map(|ms| Duration::from_millis(ms.unsigned_abs())),
    })
}

fn grpc_code(headers: &HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()))
}

fn with_attempts(mut response: http::Response<Body>, attempt: u32) -> http::Response<Body> {
    response.extensions_mut().insert(Attempts(attempt));
    response
}

/// Fills in the call's span once it ends.
fn record(attempts: u32, code: Option<Code>) {
    let span = tracing::Span::current();
    span.record("attempts", attempts);
    if let Some(code) = code {
        span.record("code", i32::from(code));
    }
}

/// A request body as it stands when the call starts.
enum Buffered {
    /// Every byte of it, to send on every attempt.
    Complete(Bytes),
    /// A stream still being produced: what came so far, then the rest.
    Streaming(Resumed),
}

/// Reads what `body` has ready without waiting: all of it for a unary call.
/// gRPC requests carry no trailers, only messages.
fn buffer_now(mut body: Body) -> Result<Buffered, Status> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut message = BytesMut::new();
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(frame)) => {
                if let Ok(data) = frame?.into_data() {
                    message.extend_from_slice(&data);
                }
            }
            Poll::Ready(None) => return Ok(Buffered::Complete(message.freeze())),
            Poll::Pending => {
                let first = (!message.is_empty()).then(|| Frame::data(message.freeze()));
                return Ok(Buffered::Streaming(Resumed { first, rest: body }));
            }
        }
    }
}

/// A body of which a first frame was already read: that frame, then the rest.
struct Resumed {
    first: Option<Frame<Bytes>>,
    rest: Body,
}

impl http_body::Body for Resumed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.first.take() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None => Pin::new(&mut self.rest).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }
}

/// The attempts [`IdempotentRetry`] made, and `idempotent-replayed: true` in
/// the response metadata.
///
/// ```
/// use idem_client::ResponseExt;
///
/// let mut response = tonic::Response::new(());
/// assert_eq!(response.attempts(), 1);
/// assert!(!response.replayed());
/// response.metadata_mut().insert("idempotent-replayed", "true".parse().unwrap());
/// assert!(response.replayed());
/// ```
impl<T> ResponseExt for tonic::Response<T> {
    fn attempts(&self) -> u32 {
        self.extensions().get::<Attempts>().map_or(1, |a| a.0)
    }

    fn replayed(&self) -> bool {
        self.metadata()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }
}
