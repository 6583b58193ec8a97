//! Responses to and from their stored form.

use axum::body::{to_bytes, Body};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_core::header::IDEMPOTENT_REPLAYED;

use super::trace::{label, record_outcome};
use crate::engine::{Answer, Via};
use crate::error::IdemError;
use crate::outcome::StoredResponse;

/// Which of a handler's response headers are stored with its response and
/// replayed, first answer and retries alike.
///
/// Kept by default: `Location`, `Content-Location`, `ETag`, `Last-Modified`,
/// `Cache-Control`, `Expires`, `Vary`, `Link`, `Content-Language`,
/// `Content-Disposition`, `Content-Encoding`, `Retry-After`, `Allow`,
/// `WWW-Authenticate`, and every custom `X-…` header. Never kept: hop-by-hop
/// headers (`Connection`, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`,
/// `Transfer-Encoding`, `Upgrade`, and any header `Connection` names),
/// `Content-Length` (recomputed) and `Idempotent-Replayed`. `Set-Cookie`, and
/// any other header, only when named with [`KeptHeaders::also`]: a replay of a
/// `Set-Cookie` hands the first client's cookie to whoever retries.
///
/// `#[idempotent(http, headers = ["set-cookie"])]` is the per-handler form.
///
/// ```
/// use axum::http::HeaderName;
/// use idem_runtime::http::KeptHeaders;
///
/// let default = KeptHeaders::DEFAULT;
/// assert!(default.keeps(&HeaderName::from_static("location")));
/// assert!(default.keeps(&HeaderName::from_static("x-request-cost")));
/// assert!(!default.keeps(&HeaderName::from_static("set-cookie")));
/// assert!(!default.keeps(&HeaderName::from_static("transfer-encoding")));
///
/// let cookies = KeptHeaders::also(&["set-cookie"]);
/// assert!(cookies.keeps(&HeaderName::from_static("set-cookie")));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptHeaders {
    also: &'static [&'static str],
}

/// Headers kept by [`KeptHeaders::DEFAULT`], besides `X-…`.
const KEPT_BY_DEFAULT: &[&str] = &[
    "location",
    "content-location",
    "etag",
    "last-modified",
    "cache-control",
    "expires",
    "vary",
    "link",
    "content-language",
    "content-disposition",
    "content-encoding",
    "retry-after",
    "allow",
    "www-authenticate",
];

/// Headers that describe one connection or are recomputed: never stored.
const NEVER_KEPT: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "content-type",
    IDEMPOTENT_REPLAYED,
];

impl KeptHeaders {
    /// The headers listed on [`KeptHeaders`], nothing else.
    pub const DEFAULT: Self = Self { also: &[] };

    /// The default set plus `names` (case-insensitive), e.g. `set-cookie`.
    /// Hop-by-hop headers are not kept even when named.
    pub const fn also(names: &'static [&'static str]) -> Self {
        Self { also: names }
    }

    /// Whether a header named `name` is stored and replayed.
    pub fn keeps(&self, name: &HeaderName) -> bool {
        let name = name.as_str();
        if NEVER_KEPT.contains(&name) {
            return false;
        }
        KEPT_BY_DEFAULT.contains(&name)
            || name.starts_with("x-")
            || self.also.iter().any(|kept| kept.eq_ignore_ascii_case(name))
    }

    /// Whether `name` is a header this type never keeps, named or not
    /// (hop-by-hop, `Content-Length`, `Content-Type`, `Idempotent-Replayed`).
    ///
    /// ```
    /// assert!(idem_runtime::http::KeptHeaders::never_kept("Transfer-Encoding"));
    /// assert!(!idem_runtime::http::KeptHeaders::never_kept("set-cookie"));
    /// ```
    pub fn never_kept(name: &str) -> bool {
        NEVER_KEPT
            .iter()
            .any(|never| never.eq_ignore_ascii_case(name))
    }
}

impl Default for KeptHeaders {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Buffers a handler's response into the form the engine stores: its status,
/// content type, body and the headers [`KeptHeaders::DEFAULT`] keeps. [`respond`]
/// renders first answers from this same form, so the first answer and every
/// replay are identical.
///
/// A body that cannot be read becomes a 500 (not stored, the retry runs).
///
/// ```
/// use axum::http::{header, StatusCode};
/// use axum::response::IntoResponse;
///
/// # async fn demo() {
/// let response = (
///     StatusCode::CREATED,
///     [(header::LOCATION, "/things/1"), (header::SET_COOKIE, "session=abc")],
///     axum::Json(serde_json::json!({"id": 1})),
/// )
///     .into_response();
/// let stored = idem_runtime::http::into_stored(response).await;
/// assert_eq!(stored.status, 201);
/// assert_eq!(stored.content_type, "application/json");
/// assert_eq!(stored.body, br#"{"id":1}"#);
/// assert_eq!(stored.headers, [("location".to_string(), "/things/1".to_string())]);
/// # }
/// ```
pub async fn into_stored(response: Response) -> StoredResponse {
    into_stored_keeping(response, KeptHeaders::DEFAULT).await
}

/// [`into_stored`], keeping the headers `kept` names.
pub async fn into_stored_keeping(response: Response, kept: KeptHeaders) -> StoredResponse {
    let (parts, body) = response.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let headers = kept_headers(&parts.headers, kept);
    match to_bytes(body, usize::MAX).await {
        Ok(body) => StoredResponse {
            status: parts.status.as_u16(),
            content_type,
            body: body.to_vec(),
            headers,
        },
        Err(error) => {
            tracing::error!(%error, "the handler's response body could not be read; answering 500");
            StoredResponse {
                status: 500,
                content_type: String::new(),
                body: Vec::new(),
                headers: Vec::new(),
            }
        }
    }
}

/// The headers of `headers` that `kept` keeps, in order, minus those the
/// response's own `Connection` header names.
pub(crate) fn kept_headers(headers: &HeaderMap, kept: KeptHeaders) -> Vec<(String, String)> {
    let per_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    headers
        .iter()
        .filter(|(name, _)| kept.keeps(name) && !per_connection.iter().any(|c| c == name.as_str()))
        .filter_map(|(name, value)| match value.to_str() {
            Ok(text) => Some((name.as_str().to_owned(), text.to_owned())),
            Err(_) => {
                tracing::warn!(header = %name, "a response header that is not visible ASCII is not stored");
                None
            }
        })
        .collect()
}

/// Renders an engine result: the stored response (with `Idempotent-Replayed:
/// true` when it is a replay) or the error's problem details. Records the
/// outcome on the current span.
///
/// ```
/// use idem_runtime::{http, Answer, StoredResponse, Via};
///
/// let stored = StoredResponse {
///     status: 201,
///     content_type: "application/json".into(),
///     body: b"{}".to_vec(),
///     headers: vec![("location".into(), "/things/1".into())],
/// };
/// let replay = http::respond(Ok(Answer { value: stored, via: Via::Replayed }));
/// assert_eq!(replay.status(), 201);
/// assert_eq!(replay.headers()["location"], "/things/1");
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
    for (name, value) in stored.headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            (Ok(name), Ok(value)) => {
                response.headers_mut().append(name, value);
            }
            _ => {
                tracing::warn!(header = %name, "a stored response header is not valid; not replayed")
            }
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
            [
                (header::LOCATION, "/payments/p_1"),
                (header::ETAG, "\"v1\""),
                (header::SET_COOKIE, "session=first-client"),
                (header::CONNECTION, "x-per-hop"),
                (HeaderName::from_static("keep-alive"), "timeout=5"),
                (HeaderName::from_static("x-per-hop"), "1"),
                (HeaderName::from_static("x-ledger-entry"), "le_9"),
            ],
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
        assert_eq!(first.headers()["location"], "/payments/p_1");
        assert_eq!(replay.headers()["location"], "/payments/p_1");
        assert_eq!(replay.headers()["etag"], "\"v1\"");
        assert_eq!(replay.headers()["x-ledger-entry"], "le_9");
        for dropped in ["set-cookie", "connection", "keep-alive", "x-per-hop"] {
            assert!(first.headers().get(dropped).is_none(), "{dropped} kept");
            assert!(
                replay.headers().get(dropped).is_none(),
                "{dropped} replayed"
            );
        }
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        let first = to_bytes(first.into_body(), usize::MAX).await.unwrap();
        let replay = to_bytes(replay.into_body(), usize::MAX).await.unwrap();
        assert_eq!(first, replay);
    }
}

#[cfg(test)]
mod kept_headers_tests {
    use super::*;

    #[tokio::test]
    async fn set_cookie_only_when_named_and_multiple_values_kept_in_order() {
        let response = || {
            (
                axum::response::AppendHeaders([
                    (header::SET_COOKIE, "a=1"),
                    (header::SET_COOKIE, "b=2"),
                    (header::LINK, "</p?page=2>; rel=\"next\""),
                    (header::LINK, "</p?page=0>; rel=\"prev\""),
                    (header::TRANSFER_ENCODING, "chunked"),
                ]),
                "body",
            )
                .into_response()
        };
        let default = into_stored(response()).await;
        assert_eq!(
            default.headers,
            [
                ("link".to_owned(), "</p?page=2>; rel=\"next\"".to_owned()),
                ("link".to_owned(), "</p?page=0>; rel=\"prev\"".to_owned()),
            ]
        );
        let cookies = into_stored_keeping(
            response(),
            KeptHeaders::also(&["Set-Cookie", "transfer-encoding"]),
        )
        .await;
        let names: Vec<&str> = cookies.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["set-cookie", "set-cookie", "link", "link"]);
        let rendered = respond(Ok(Answer {
            value: cookies,
            via: Via::Replayed,
        }));
        let cookies: Vec<_> = rendered
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
    }
}
