//! RFC 9457 problem details: the body of every error idem answers with.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

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
    pub const ABOUT_BLANK: &str = "about:blank";
}

/// An RFC 9457 problem: `type`, `title`, `status` and a `detail` that tells
/// the client what to do. Renders as `application/problem+json`.
///
/// ```
/// use axum::response::IntoResponse;
/// use idem_runtime::http::ProblemDetails;
///
/// let response = ProblemDetails::new(422, "invalid amount")
///     .with_detail("amount_cents must be greater than zero")
///     .into_response();
/// assert_eq!(response.status(), 422);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemDetails {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub type_: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened this time, and what the client should do about it.
    pub detail: String,
}

impl ProblemDetails {
    /// A problem of type `about:blank` with an empty detail.
    pub fn new(status: u16, title: impl Into<String>) -> Self {
        Self {
            type_: types::ABOUT_BLANK.to_owned(),
            title: title.into(),
            status,
            detail: String::new(),
        }
    }

    /// Sets the type URI.
    pub fn with_type(mut self, type_: impl Into<String>) -> Self {
        self.type_ = type_.into();
        self
    }

    /// Sets the detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    /// The JSON body.
    pub fn to_body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a problem always serializes")
    }
}

impl IntoResponse for ProblemDetails {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.to_body()).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

impl From<crate::Problem> for ProblemDetails {
    fn from(problem: crate::Problem) -> Self {
        Self::new(problem.status, problem.title).with_detail(problem.detail.unwrap_or_default())
    }
}

/// The runtime's [`Problem`](crate::Problem) renders as problem details of type `about:blank`.
impl IntoResponse for crate::Problem {
    fn into_response(self) -> Response {
        ProblemDetails::from(self).into_response()
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
