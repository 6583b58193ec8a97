//! A retrying HTTP client that keeps its idempotency key.
//!
//! The client's half of idempotency: mint a key once per logical operation,
//! before the first attempt; store it with the pending work; send it on every
//! attempt; retry only what is worth retrying, with the same key and the same
//! body. [`IdempotentRetry`] does the sending and retrying as a
//! [`reqwest_middleware`] middleware; [`IdempotencyKey`] is the key type idem
//! services use too (from `idem-core`, shared with `idem-runtime`), so
//! [`IdempotencyKey::random`] mints a key and [`IdempotencyKey::child`]
//! derives the key of a downstream step exactly as an idem service does.
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_client::{IdempotencyKey, RequestBuilderExt, ResponseExt, RetryPolicy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = idem_client::client(
//!     reqwest::Client::new(),
//!     RetryPolicy::default().deadline(Duration::from_secs(20)),
//! );
//! // Minted once and stored with the pending work (see below), then sent on every attempt.
//! let key = IdempotencyKey::random();
//! let response = client
//!     .post("http://127.0.0.1:8080/payments")
//!     .idempotency_key(key)
//!     .header("content-type", "application/json")
//!     .body(r#"{"amount_cents":2500,"currency":"EUR","destination":"acct_42"}"#)
//!     .send()
//!     .await?;
//! println!("{} in {} attempt(s), replayed: {}", response.status(), response.attempts(), response.replayed());
//! # Ok(()) }
//! ```
//!
//! # What is retried
//!
//! A request is retried only when a retry cannot run it twice: it carries an
//! [`IdempotencyKey`] (attached with [`RequestBuilderExt::idempotency_key`],
//! a typed request extension), or its method is idempotent by definition
//! (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`). A keyless `POST` or
//! `PATCH` is sent once, or refused up front with [`MissingKey::Refuse`].
//!
//! The key goes out as an RFC 8941 string, `Idempotency-Key: "<key>"`, on
//! every attempt, with the same body bytes. A body that cannot be sent twice
//! (a stream) is refused before the first attempt with
//! [`ClientError::BodyNotReplayable`].
//!
//! | answer | retried? | wait |
//! |---|---|---|
//! | connection refused, reset, lost before the answer; timeout | yes | backoff |
//! | 408, 425, 429, any 5xx | yes | `Retry-After` if sent, else backoff |
//! | 409 with idem's in-progress problem type ([`IN_PROGRESS_PROBLEM`]) | yes | `Retry-After` |
//! | any other 409 with `Retry-After` | only with [`RetryPolicy::retry_any_conflict_with_retry_after`] | `Retry-After` |
//! | 422, any other 4xx, 1xx-3xx | never | – |
//!
//! `Retry-After` is read as seconds or an HTTP date, and capped by
//! [`RetryPolicy::retry_after_cap`]. Without it the wait is exponential
//! backoff with full jitter ([`RetryPolicy::backoff`]). A call ends after
//! [`RetryPolicy::max_attempts`] attempts, or when the next wait would pass
//! its [`RetryPolicy::deadline`]: then the last answer is returned as it is
//! (a 503 stays a 503), or, if the last attempt got no answer,
//! [`ClientError::GaveUp`]. An attempt still running at the deadline is cut
//! off with [`ClientError::DeadlineExceeded`].
//!
//! Every answer carries the number of attempts it took and whether the server
//! replayed it (`Idempotent-Replayed: true`): see [`ResponseExt`].
//!
//! # Tracing
//!
//! Each logical call is one `idempotent_call` span (method, URL without query,
//! the key's log tag, and at the end the attempts and status); each attempt is
//! one event in it: `retrying` with the reason and the wait, `answered`, or
//! `giving up` with the reason. Raw keys are never logged.
//!
//! # Keeping the key with the pending work
//!
//! A key minted in memory dies with the process, and a retry after a crash
//! would then carry a new key and charge twice. So the key is part of the
//! intent, stored in the same transaction that records it:
//!
//! 1. In one local transaction, insert the pending work *with* a fresh
//!    `IdempotencyKey::random()`, and commit.
//! 2. Send the call with that key.
//! 3. On an answer, record it against the pending row (done, or failed for
//!    good on a 4xx). On no answer, leave the row pending.
//! 4. On restart (or from a sweeper), resend every pending row with its
//!    stored key; the server replays what it already did.
//!
//! The `pending_payment` example of the idem repository does this against
//! SQLite and the payments service.
//!
//! # gRPC
//!
//! With the `tonic` feature, `grpc::IdempotentRetryLayer` does the same for
//! tonic channels: every call goes out with an `idempotency-key` metadata
//! entry (`grpc::with_key`, or a fresh key), and `UNAVAILABLE`, idem's
//! in-progress `ABORTED` and connection failures are retried with the same
//! key and message by the same [`RetryPolicy`], honouring
//! `grpc-retry-pushback-ms`. [`ResponseExt`] reads the attempts and replays
//! off a `tonic::Response` too. See the `grpc` module.
//!
//! # Compared with `reqwest-retry` (0.9)
//!
//! | | `idem-client` | `reqwest-retry` (`RetryTransientMiddleware`) |
//! |---|---|---|
//! | connection errors, timeouts, a connection lost before the answer | retried | retried |
//! | 5xx, 408, 429 | retried | retried |
//! | 425 Too Early | retried | not retried |
//! | 409 Conflict | idem's in-progress 409 retried (any 409 with `Retry-After` by configuration) | never retried |
//! | 422 and other 4xx | never retried | never retried |
//! | `Retry-After` | honoured: seconds or HTTP date, capped | ignored; its own backoff only |
//! | backoff | exponential, full jitter | exponential with jitter (`retry-policies`) |
//! | limits | attempt limit and an overall deadline | attempt limit or total duration |
//! | non-idempotent requests | retried only with a key; keyless ones sent once or refused | retried like any other |
//! | idempotency keys | one key per logical call, the same on every attempt, as an RFC 8941 string | none |
//! | streaming bodies | refused before sending when a retry is possible ([`ClientError::BodyNotReplayable`]); sent once when not | always refused before sending |
//! | attempts | on every answer ([`ResponseExt::attempts`]) and on its own errors ([`ClientError::attempts`]) | on errors only (`RetryError::WithRetries`) |
//! | replays | `Idempotent-Replayed` read by [`ResponseExt::replayed`] | not read |

mod error;
#[cfg(feature = "tonic")]
pub mod grpc;
mod middleware;
mod policy;
mod response;
mod retry_after;

pub use error::{ClientError, RetryReason};
pub use idem_core::header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use idem_core::problem::types::IN_PROGRESS as IN_PROGRESS_PROBLEM;
pub use idem_core::Step;
pub use idem_core::{child_key, IdempotencyKey, KeyError};
pub use middleware::IdempotentRetry;
pub use policy::{MissingKey, RetryPolicy};
pub use response::{Attempts, RequestBuilderExt, ResponseExt};
pub use retry_after::parse_retry_after;
pub use {reqwest, reqwest_middleware};

/// `inner` with [`IdempotentRetry`] on `policy` as its middleware.
///
/// ```
/// let client = idem_client::client(reqwest::Client::new(), idem_client::RetryPolicy::default());
/// let _request = client.get("http://127.0.0.1:8080/healthz");
/// ```
pub fn client(
    inner: reqwest::Client,
    policy: RetryPolicy,
) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(inner)
        .with(IdempotentRetry::new(policy))
        .build()
}
