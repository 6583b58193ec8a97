//! Why a logical call failed without an HTTP answer to show for it.

use std::fmt;
use std::time::Duration;

/// Why an attempt was retried (or would have been, had the attempt limit or
/// the deadline allowed another).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// The connection could not be made (refused, unreachable, DNS).
    Connect,
    /// The attempt timed out.
    Timeout,
    /// The connection broke after the request went out and before a complete
    /// answer came back: the server may have done the work, so only the key
    /// makes the retry safe.
    ConnectionLost,
    /// A status worth retrying: 408, 425, 429 or any 5xx.
    Status(u16),
    /// idem's 409: another attempt with this key is still running.
    InProgress,
    /// A 409 with `Retry-After`, retried by configuration.
    Conflict,
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryReason::Connect => f.write_str("connection failed"),
            RetryReason::Timeout => f.write_str("timed out"),
            RetryReason::ConnectionLost => f.write_str("connection lost before the answer"),
            RetryReason::Status(status) => write!(f, "status {status}"),
            RetryReason::InProgress => f.write_str("409 in progress"),
            RetryReason::Conflict => f.write_str("409 with Retry-After"),
        }
    }
}

/// An error of the retrying middleware. It reaches the caller as
/// [`reqwest_middleware::Error::Middleware`]; [`ClientError::of`] finds it.
///
/// ```
/// use idem_client::ClientError;
///
/// let error = reqwest_middleware::Error::middleware(ClientError::BodyNotReplayable {
///     method: "POST".into(),
///     url: "http://127.0.0.1:8080/payments".into(),
/// });
/// assert!(matches!(ClientError::of(&error), Some(ClientError::BodyNotReplayable { .. })));
/// ```
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A non-idempotent request without a key, under [`MissingKey::Refuse`](crate::MissingKey::Refuse).
    #[error("{method} {url} has no idempotency key, and a retry without one could run it twice; mint one with IdempotencyKey::random() before the first attempt, store it with the pending work, and attach it with .idempotency_key(key)")]
    MissingKey {
        /// The request's method.
        method: String,
        /// The request's URL, without query or credentials.
        url: String,
    },
    /// The body is a stream, which cannot be sent a second time. Refused
    /// before anything was sent.
    #[error("{method} {url} has a streaming body, which cannot be sent again on a retry; nothing was sent. Send the body as bytes, a string or JSON so every attempt carries the same bytes")]
    BodyNotReplayable {
        /// The request's method.
        method: String,
        /// The request's URL, without query or credentials.
        url: String,
    },
    /// The deadline passed while an attempt was still running; that attempt
    /// was abandoned. The operation may or may not have happened: retry
    /// later with the same key to find out.
    #[error("{method} {url}: no answer within the deadline of {deadline:?} (attempt {attempts} was cut off); the operation may have happened, retry later with the same idempotency key")]
    DeadlineExceeded {
        /// The request's method.
        method: String,
        /// The request's URL, without query or credentials.
        url: String,
        /// Attempts made, the abandoned one included.
        attempts: u32,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// Every attempt allowed failed without an HTTP answer; `source` is the
    /// last attempt's error.
    #[error("{method} {url}: gave up after {attempts} attempt(s), the last {reason}; the operation may have happened, retry later with the same idempotency key")]
    GaveUp {
        /// The request's method.
        method: String,
        /// The request's URL, without query or credentials.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// Why the last attempt failed.
        reason: RetryReason,
        /// The last attempt's error.
        #[source]
        source: reqwest_middleware::Error,
    },
}

impl ClientError {
    /// The [`ClientError`] inside a middleware error, if that is what it is.
    pub fn of(error: &reqwest_middleware::Error) -> Option<&ClientError> {
        match error {
            reqwest_middleware::Error::Middleware(error) => error.downcast_ref(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// How many attempts were made before this error (0 when refused up front).
    pub fn attempts(&self) -> u32 {
        match self {
            ClientError::MissingKey { .. } | ClientError::BodyNotReplayable { .. } => 0,
            ClientError::DeadlineExceeded { attempts, .. }
            | ClientError::GaveUp { attempts, .. } => *attempts,
        }
    }
}
