//! A JSON body extractor whose rejections are problem details, decided before any claim.

use axum::extract::rejection::JsonRejection as AxumJsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::linger::{discard_rest, Returning};
use super::problem::types;
use super::trace::record_rejected;
use crate::problem::Problem;

/// Like [`axum::Json`], but a body that cannot be used is refused with an
/// `application/problem+json` answer before the handler (and so before any
/// claim) runs, so nothing is stored for it:
///
/// - larger than the route's [`DefaultBodyLimit`](axum::extract::DefaultBodyLimit): 413,
///   after reading and discarding the rest of the body (at most
///   [`LINGER_MAX_BYTES`](super::LINGER_MAX_BYTES) within
///   [`LINGER_MAX_TIME`](super::LINGER_MAX_TIME)), so a client that writes
///   its whole body before reading gets the answer rather than a reset
///   connection;
/// - not JSON, or JSON of the wrong shape (a missing field, a string for a number): 400;
/// - no `Content-Type: application/json`: 415.
///
/// Validation rules beyond the shape (an amount must be positive) belong to
/// the handler, whose answer is a deterministic client error that is stored
/// and replayed.
///
/// ```
/// use axum::{extract::DefaultBodyLimit, routing::post, Router};
/// use idem_runtime::http::Json;
///
/// async fn handler(Json(body): Json<serde_json::Value>) -> String { body.to_string() }
///
/// let _app: Router = Router::new()
///     .route("/", post(handler))
///     .layer(DefaultBodyLimit::max(64 * 1024));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

/// Why a [`Json`] body was refused; renders as problem details.
#[derive(Debug)]
pub struct JsonRejection(pub AxumJsonRejection);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = JsonRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let (body, rest) = Returning::wrap(body);
        let rejection =
            match axum::Json::<T>::from_request(Request::from_parts(parts, body), state).await {
                Ok(axum::Json(value)) => return Ok(Json(value)),
                Err(rejection) => rejection,
            };
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            discard_rest(&rest).await;
        }
        Err(JsonRejection(rejection))
    }
}

impl JsonRejection {
    /// The problem this rejection answers with.
    pub fn problem(&self) -> Problem {
        let status = self.0.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Problem::new(413, "Request body too large")
                .with_type(types::BODY_TOO_LARGE)
                .with_detail("The request body is larger than this route accepts. Nothing was executed or stored; send a smaller body.");
        }
        match &self.0 {
            AxumJsonRejection::MissingJsonContentType(_) => Problem::new(415, "Unsupported media type")
                .with_type(types::UNSUPPORTED_MEDIA_TYPE)
                .with_detail("Send the body as JSON with `Content-Type: application/json`. Nothing was executed or stored."),
            AxumJsonRejection::JsonSyntaxError(_) | AxumJsonRejection::JsonDataError(_) => {
                Problem::new(400, "Malformed request body").with_type(types::MALFORMED_BODY).with_detail(format!(
                    "The body is not valid JSON for this request ({}). Nothing was executed or stored; fix the body and retry.",
                    self.0.body_text()
                ))
            }
            other => Problem::new(status.as_u16(), "Unreadable request body")
                .with_type(types::MALFORMED_BODY)
                .with_detail(format!("The request body could not be read ({}). Nothing was executed or stored.", other.body_text())),
        }
    }
}

impl IntoResponse for JsonRejection {
    fn into_response(self) -> Response {
        record_rejected();
        self.problem().into_response()
    }
}

impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
