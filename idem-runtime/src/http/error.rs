//! [`IdemError`] as an HTTP response: problem details, with `Retry-After` where a retry helps.

use axum::response::{IntoResponse, Response};

use super::problem::{types, with_retry_after};
use super::trace::{label, record_outcome};
use crate::error::IdemError;
use crate::problem::Problem;

/// The problem body for an engine error.
///
/// ```
/// use idem_runtime::{IdemError, Problem};
/// let problem = Problem::from(&IdemError::Mismatch);
/// assert_eq!(problem.status, 422);
/// assert!(problem.detail.contains("new key"));
/// ```
impl From<&IdemError> for Problem {
    fn from(error: &IdemError) -> Self {
        let (type_, title, detail) = match error {
            IdemError::Mismatch => (
                types::KEY_REUSED,
                "Idempotency-Key reused with a different request",
                "This key was already used for a request with a different body. Nothing was executed. \
                 Retry with the original body to get the original answer, or send a new key for a new operation."
                    .to_owned(),
            ),
            IdemError::InProgress { retry_after } => (
                types::IN_PROGRESS,
                "A request with this Idempotency-Key is in progress",
                format!(
                    "Another attempt with this key has not finished yet. Nothing was executed. \
                     Retry the same request with the same key after {} second(s) to get its answer.",
                    retry_after.as_secs().max(1)
                ),
            ),
            IdemError::StoreBusy { retry_after } => (
                types::STORE_BUSY,
                "Idempotency store busy",
                format!(
                    "The store is busy with other requests' writes and did not free up in time, so nothing \
                     was executed. This says nothing about your key. Retry the same request with the same \
                     key after {} second(s).",
                    retry_after.as_secs().max(1)
                ),
            ),
            IdemError::Unavailable { retry_after, .. } => (
                types::STORE_UNAVAILABLE,
                "Idempotency store unavailable",
                format!(
                    "The service cannot check this key right now, so nothing was executed. \
                     Retry the same request with the same key after {} second(s).",
                    retry_after.as_secs().max(1)
                ),
            ),
            IdemError::Conflict { retry_after, .. } => (
                types::TRANSACTION_CONFLICT,
                "Transaction conflict",
                format!(
                    "The operation conflicted with a concurrent transaction and was rolled back; nothing was \
                     stored. Retry the same request with the same key after {} second(s).",
                    retry_after.as_secs().max(1)
                ),
            ),
            IdemError::TimedOut { limit } => (
                types::TIMED_OUT,
                "The operation timed out",
                format!(
                    "The operation did not finish within {} ms and was rolled back; nothing was stored. \
                     Retry the same request with the same key.",
                    limit.as_millis()
                ),
            ),
            IdemError::LockLost => (
                types::IN_PROGRESS,
                "Another attempt took over this Idempotency-Key",
                "This attempt ran too long and another attempt with the same key took over; this attempt was \
                 rolled back. Retry the same request with the same key to get the answer."
                    .to_owned(),
            ),
            IdemError::Replay(_) => (
                types::REPLAY_FAILED,
                "Stored response could not be replayed",
                "The answer stored for this key can no longer be decoded by this version of the service. \
                 Contact the service operator; do not retry with a new key unless you intend a new operation."
                    .to_owned(),
            ),
        };
        Problem::new(error.http_status(), title)
            .with_type(type_)
            .with_detail(detail)
    }
}

/// 422 (key reused), 409 + `Retry-After` (in progress), 503 + `Retry-After`
/// (store down, fail closed; or store busy with other keys' writes), 504 (timed out), 500 (replay failed); each an
/// `application/problem+json` body. Records the outcome on the current span.
///
/// ```
/// use axum::response::IntoResponse;
/// use idem_runtime::IdemError;
/// use std::time::Duration;
///
/// let response = IdemError::InProgress { retry_after: Duration::from_secs(3) }.into_response();
/// assert_eq!(response.status(), 409);
/// assert_eq!(response.headers()["retry-after"], "3");
/// ```
impl IntoResponse for IdemError {
    fn into_response(self) -> Response {
        record_outcome(label(Err(&self)));
        if let IdemError::Unavailable { source, .. } = &self {
            tracing::warn!(error = %source, "idempotency store unavailable; refusing the request (fail closed)");
        }
        let response = Problem::from(&self).into_response();
        match self.retry_after() {
            Some(retry_after) => with_retry_after(response, retry_after),
            None => response,
        }
    }
}
