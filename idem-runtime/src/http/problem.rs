//! RFC 9457 problem details over HTTP: their media type, the types idem
//! answers with, and how a [`Problem`] renders.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::problem::Problem;

/// A problem `type` URI: the section `anchor` of `docs/PROBLEMS.md` in the
/// repository named by `Cargo.toml`.
macro_rules! problem_type {
    ($anchor:literal) => {
        concat!(
            env!("CARGO_PKG_REPOSITORY"),
            "/blob/main/docs/PROBLEMS.md#",
            $anchor
        )
    };
}
pub(crate) use problem_type;

/// The media type of a problem body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` of each problem idem itself answers with: each names its
/// section of
/// [PROBLEMS.md](https://github.com/idem-rs/idem/blob/main/docs/PROBLEMS.md)
/// in idem's repository, which says when it happens and what a client should
/// do. The URIs are stable: a client may match on them.
///
/// ```
/// use idem_runtime::http::problem::types;
/// assert_eq!(
///     types::KEY_REUSED,
///     "https://github.com/idem-rs/idem/blob/main/docs/PROBLEMS.md#idempotency-key-reused"
/// );
/// ```
pub mod types {
    /// No `Idempotency-Key` header where the route requires one (400).
    pub const KEY_MISSING: &str = problem_type!("idempotency-key-missing");
    /// An `Idempotency-Key` header that is not 1-255 visible ASCII characters (400).
    pub const KEY_MALFORMED: &str = problem_type!("idempotency-key-malformed");
    /// The key was used before with a different request (422).
    pub const KEY_REUSED: &str = problem_type!("idempotency-key-reused");
    /// Another attempt with the key is still running (409).
    pub const IN_PROGRESS: &str = problem_type!("request-in-progress");
    /// The idempotency store is down and the service fails closed (503).
    pub const STORE_UNAVAILABLE: &str = problem_type!("store-unavailable");
    /// The store's single writer is busy with other keys' writes (503, SQLite).
    pub const STORE_BUSY: &str = problem_type!("store-busy");
    /// The operation did not finish in time and was rolled back (504).
    pub const TIMED_OUT: &str = problem_type!("operation-timed-out");
    /// A stored response could not be replayed (500).
    pub const REPLAY_FAILED: &str = problem_type!("replay-failed");
    /// The body is not valid JSON for this route (400).
    pub const MALFORMED_BODY: &str = problem_type!("malformed-body");
    /// The body is larger than the route accepts (413).
    pub const BODY_TOO_LARGE: &str = problem_type!("body-too-large");
    /// The body was not sent as `application/json` (415).
    pub const UNSUPPORTED_MEDIA_TYPE: &str = problem_type!("unsupported-media-type");
    /// RFC 9457's default: the status code says it all.
    pub const ABOUT_BLANK: &str = crate::problem::ABOUT_BLANK;
}

/// [`Problem`] renders as `application/problem+json`.
///
/// ```
/// use axum::response::IntoResponse;
/// use idem_runtime::Problem;
///
/// let response = Problem::new(422, "Invalid amount")
///     .with_detail("The amount_cents field must be greater than zero.")
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

pub(crate) use crate::problem::sentence;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_sentences() {
        assert_eq!(sentence("no such key; retry"), "No such key; retry.");
        assert_eq!(sentence("Done."), "Done.");
        assert_eq!(sentence(""), "");
    }

    #[test]
    fn problem_types_name_sections_of_the_problems_page() {
        let page = include_str!("../../../docs/PROBLEMS.md");
        for type_ in [
            types::KEY_MISSING,
            types::KEY_MALFORMED,
            types::KEY_REUSED,
            types::IN_PROGRESS,
            types::STORE_UNAVAILABLE,
            types::STORE_BUSY,
            types::TIMED_OUT,
            types::REPLAY_FAILED,
            types::MALFORMED_BODY,
            types::BODY_TOO_LARGE,
            types::UNSUPPORTED_MEDIA_TYPE,
            crate::inbox::webhook::BAD_SIGNATURE,
            crate::inbox::webhook::POISONED,
        ] {
            let (page_url, anchor) = type_.split_once('#').expect("an anchor");
            assert_eq!(
                page_url,
                concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/PROBLEMS.md")
            );
            assert!(
                page.contains(&format!("\n## {anchor}\n")),
                "no section {anchor}"
            );
        }
    }
}
