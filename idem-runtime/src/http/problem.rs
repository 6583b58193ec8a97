//! RFC 9457 problem details over HTTP: their media type, the types idem
//! answers with, and how a [`Problem`] renders.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::problem::Problem;

pub use idem_core::problem::{types, PROBLEM_JSON};
// `inbox::webhook` names its own problem types with it.
pub(crate) use idem_core::__problem_type as problem_type;

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
        // A conflict says "run it again": the retry is told when.
        if self.type_ == types::TRANSACTION_CONFLICT {
            response = with_retry_after(response, std::time::Duration::from_secs(1));
        }
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

    /// idem-core writes the `Idempotency-Key` rejection's body itself (it
    /// cannot name `Problem`); it must be the body `Problem` would write.
    #[tokio::test]
    async fn key_rejections_answer_as_problems_do() {
        use super::super::KeyRejection;
        for (rejection, type_, title) in [
            (
                KeyRejection::Missing,
                types::KEY_MISSING,
                "Idempotency-Key header missing",
            ),
            (
                KeyRejection::Repeated,
                types::KEY_MALFORMED,
                "Idempotency-Key header malformed",
            ),
            (
                KeyRejection::Malformed("a \"quoted\" key; send 'visible' ASCII".into()),
                types::KEY_MALFORMED,
                "Idempotency-Key header malformed",
            ),
        ] {
            let expected = Problem::new(400, title)
                .with_type(type_)
                .with_detail(sentence(&rejection.to_string()))
                .into_response();
            let response = rejection.into_response();
            assert_eq!(response.status(), expected.status());
            assert_eq!(response.headers(), expected.headers());
            let body = |r: Response| axum::body::to_bytes(r.into_body(), usize::MAX);
            assert_eq!(body(response).await.unwrap(), body(expected).await.unwrap());
        }
    }

    #[test]
    fn webhook_problem_types_name_sections_of_the_problems_page() {
        // idem-core checks the types it defines; these are the inbox's own.
        let page = include_str!("../../../docs/PROBLEMS.md");
        for type_ in [
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
