//! Responses to and from their stored form.

use axum::body::{to_bytes, Body};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::trace::{label, record_outcome};
use crate::engine::{Answer, Via};
use crate::error::IdemError;
use crate::outcome::StoredResponse;

/// The header a replayed answer carries.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Buffers a handler's response into the form the engine stores: its status,
/// content type and body. Other headers are not kept, and [`respond`] renders
/// first answers from this same form, so the first answer and every replay
/// are identical.
///
/// A body that cannot be read becomes a 500 (not stored, the retry runs).
///
/// ```
/// use axum::{http::StatusCode, response::IntoResponse};
///
/// # async fn demo() {
/// let response = (StatusCode::CREATED, axum::Json(serde_json::json!({"id": 1}))).into_response();
/// let stored = idem_runtime::http::into_stored(response).await;
/// assert_eq!(stored.status, 201);
/// assert_eq!(stored.content_type, "application/json");
/// assert_eq!(stored.body, br#"{"id":1}"#);
/// # }
/// ```
pub async fn into_stored(response: Response) -> StoredResponse {
    let (parts, body) = response.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    match to_bytes(body, usize::MAX).await {
        Ok(body) => StoredResponse {
            status: parts.status.as_u16(),
            content_type,
            body: body.to_vec(),
        },
        Err(error) => {
            tracing::error!(%error, "the handler's response body could not be read; answering 500");
            StoredResponse {
                status: 500,
                content_type: String::new(),
                body: Vec::new(),
            }
        }
    }
}

/// Renders an engine result: the stored response (with `Idempotent-Replayed:
/// true` when it is a replay) or the error's problem details. Records the
/// outcome on the current span.
///
/// ```
/// use idem_runtime::{http, Answer, StoredResponse, Via};
///
/// let stored = StoredResponse { status: 201, content_type: "application/json".into(), body: b"{}".to_vec() };
/// let replay = http::respond(Ok(Answer { value: stored, via: Via::Replayed }));
/// assert_eq!(replay.status(), 201);
/// assert_eq!(replay.headers()["idempotent-replayed"], "true");
/// ```
pub fn respond(result: Result<Answer<StoredResponse>, IdemError>) -> Response {
    match result {
        Ok(Answer { value, via }) => {
            record_outcome(label(Ok(via)));
            let mut response = render(value);
            if via == Via::Replayed {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            response
        }
        Err(error) => error.into_response(),
    }
}

/// Builds a response from its stored form.
fn render(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    if !stored.content_type.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&stored.content_type) {
            response.headers_mut().insert(header::CONTENT_TYPE, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_answer_and_replay_are_byte_identical() {
        let handler_answer = (
            StatusCode::CREATED,
            axum::Json(serde_json::json!({"payment_id": "p_1"})),
        )
            .into_response();
        let stored = into_stored(handler_answer).await;
        let first = respond(Ok(Answer {
            value: stored.clone(),
            via: Via::Executed,
        }));
        let replay = respond(Ok(Answer {
            value: stored,
            via: Via::Replayed,
        }));
        assert_eq!(first.status(), replay.status());
        assert_eq!(
            first.headers()["content-type"],
            replay.headers()["content-type"]
        );
        assert!(first.headers().get(IDEMPOTENT_REPLAYED).is_none());
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        let first = to_bytes(first.into_body(), usize::MAX).await.unwrap();
        let replay = to_bytes(replay.into_body(), usize::MAX).await.unwrap();
        assert_eq!(first, replay);
    }
}
