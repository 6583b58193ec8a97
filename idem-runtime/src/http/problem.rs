//! RFC 9457 problem details over HTTP: their media type, the types idem
//! answers with, and how a [`Problem`] renders.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::problem::Problem;

/// The media type of a problem body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` of each problem idem itself answers with.
pub mod types {
    /// No `Idempotency-Key` header where the route requires one (400).
    pub const KEY_MISSING: &str = "https://idem-rs.github.io/idem/problems#idempotency-key-missing";
    /// An `Idempotency-Key` header that is not 1-255 visible ASCII characters (400).
    pub const KEY_MALFORMED: &str =
        "https://idem-rs.github.io/idem/problems#idempotency-key-malformed";
    /// The key was used before with a different request (422).
    pub const KEY_REUSED: &str = "https://idem-rs.github.io/idem/problems#idempotency-key-reused";
    /// Another attempt with the key is still running (409).
    pub const IN_PROGRESS: &str = "https://idem-rs.github.io/idem/problems#request-in-progress";
    /// The idempotency store is down and the service fails closed (503).
    pub const STORE_UNAVAILABLE: &str = "https://idem-rs.github.io/idem/problems#store-unavailable";
    /// The store's single writer is busy with other keys' writes (503, SQLite).
    pub const STORE_BUSY: &str = "https://idem-rs.github.io/idem/problems#store-busy";
    /// The operation did not finish in time and was rolled back (504).
    pub const TIMED_OUT: &str = "https://idem-rs.github.io/idem/problems#operation-timed-out";
    /// A stored response could not be replayed (500).
    pub const REPLAY_FAILED: &str = "https://idem-rs.github.io/idem/problems#replay-failed";
    /// The body is not valid JSON for this route (400).
    pub const MALFORMED_BODY: &str = "https://idem-rs.github.io/idem/problems#malformed-body";
    /// The body is larger than the route accepts (413).
    pub const BODY_TOO_LARGE: &str = "https://idem-rs.github.io/idem/problems#body-too-large";
    /// The body was not sent as `application/json` (415).
    pub const UNSUPPORTED_MEDIA_TYPE: &str =
        "https://idem-rs.github.io/idem/problems#unsupported-media-type";
    /// RFC 9457's default: the status code says it all.
    pub const ABOUT_BLANK: &str = crate::problem::ABOUT_BLANK;
}

/// [`Problem`] renders as `application/problem+json`.
///
/// ```
/// use axum::response::IntoResponse;
/// use idem_runtime::Problem;
///
/// let response = Problem::new(422, "invalid amount")
///     .with_detail("amount_cents must be greater than zero")
///     .into_response();
/// assert_eq!(response.status(), 422);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.to_body()).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

/// Adds `Retry-After` in whole seconds.
pub(crate) fn with_retry_after(
    mut response: Response,
    retry_after: std::time::Duration,
) -> Response {
    let seconds = retry_after.as_secs().max(1);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}
