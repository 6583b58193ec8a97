//! What a caller attaches to a request and reads from its answer.

use idem_core::header::IDEMPOTENT_REPLAYED;
use idem_core::IdempotencyKey;

/// A response extension: how many attempts the logical call took (1 when it
/// was not retried). Read it with [`ResponseExt::attempts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts(pub u32);

/// What the retrying client tells about an answer: a `reqwest::Response`,
/// or with the `tonic` feature a `tonic::Response` (see the `grpc` module).
///
/// ```no_run
/// use idem_client::{IdempotencyKey, RequestBuilderExt, ResponseExt, RetryPolicy};
///
/// # async fn run() -> Result<(), reqwest_middleware::Error> {
/// let client = idem_client::client(reqwest::Client::new(), RetryPolicy::default());
/// let response = client
///     .post("http://127.0.0.1:8080/payments")
///     .idempotency_key(IdempotencyKey::random())
///     .body(r#"{"amount_cents":2500,"currency":"EUR","destination":"acct_42"}"#)
///     .send()
///     .await?;
/// println!("{} after {} attempt(s), replayed: {}", response.status(), response.attempts(), response.replayed());
/// # Ok(()) }
/// ```
pub trait ResponseExt {
    /// How many attempts the call took, the successful one included (1 for a
    /// response that did not come through [`IdempotentRetry`](crate::IdempotentRetry)).
    fn attempts(&self) -> u32;
    /// Whether the server answered from its store: `Idempotent-Replayed: true`,
    /// i.e. an earlier attempt with this key did the work.
    fn replayed(&self) -> bool;
}

impl ResponseExt for reqwest::Response {
    fn attempts(&self) -> u32 {
        self.extensions().get::<Attempts>().map_or(1, |a| a.0)
    }

    fn replayed(&self) -> bool {
        self.headers()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }
}

/// Attaches an idempotency key to a request of a [`ClientWithMiddleware`](reqwest_middleware::ClientWithMiddleware).
pub trait RequestBuilderExt {
    /// Sends `key` as `Idempotency-Key` on every attempt, and lets the
    /// request be retried. Attach the key the pending work was stored with.
    ///
    /// The key travels as a typed request extension; it replaces an
    /// `Idempotency-Key` header set by hand. A header set by hand without
    /// this extension is sent as it is, but does not make the request retryable.
    fn idempotency_key(self, key: IdempotencyKey) -> Self;
}

impl RequestBuilderExt for reqwest_middleware::RequestBuilder {
    fn idempotency_key(self, key: IdempotencyKey) -> Self {
        self.with_extension(key)
    }
}
