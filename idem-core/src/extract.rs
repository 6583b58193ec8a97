//! The `Idempotency-Key` header over axum (feature `axum`): parsing, the
//! extractor for [`IdempotencyKey`], and its 400 rejection as problem details.
//! idem-runtime re-exports these under `idem_runtime::http`.
//!
//! ```
//! use idem_core::IdempotencyKey;
//!
//! async fn create(key: IdempotencyKey) -> String {
//!     format!("key tag {}", key.log_tag())
//! }
//! let _app: axum::Router = axum::Router::new().route("/things", axum::routing::post(create));
//! ```

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::header::IDEMPOTENCY_KEY;
use crate::key::{IdempotencyKey, KeyError};
use crate::problem::{sentence, types, PROBLEM_JSON};

/// Why a request's `Idempotency-Key` was refused: always a 400 with a problem body.
///
/// ```
/// use idem_core::extract::{parse_header_value, KeyRejection};
/// let value = http::HeaderValue::from_static("\"unterminated");
/// assert!(matches!(parse_header_value(&value), Err(KeyRejection::Malformed(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRejection {
    /// The route requires a key and none was sent.
    #[error("this request needs an Idempotency-Key header; generate a unique value (e.g. a UUID) for this operation and send it with every retry")]
    Missing,
    /// The header was sent more than once.
    #[error("the Idempotency-Key header was sent more than once; send exactly one")]
    Repeated,
    /// The value is neither a valid structured-field string nor a valid bare key.
    #[error("malformed Idempotency-Key header: {0}")]
    Malformed(String),
}

impl From<KeyError> for KeyRejection {
    fn from(error: KeyError) -> Self {
        KeyRejection::Malformed(error.to_string())
    }
}

/// A 400 `application/problem+json` answer, of type
/// [`KEY_MISSING`](types::KEY_MISSING) or [`KEY_MALFORMED`](types::KEY_MALFORMED),
/// recorded as the outcome `rejected` (see [`record_outcome`]).
///
/// ```
/// use axum::response::IntoResponse;
/// use idem_core::extract::KeyRejection;
///
/// let response = KeyRejection::Missing.into_response();
/// assert_eq!(response.status(), 400);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
impl IntoResponse for KeyRejection {
    fn into_response(self) -> Response {
        record_outcome("rejected");
        let (type_, title) = match self {
            KeyRejection::Missing => (types::KEY_MISSING, "Idempotency-Key header missing"),
            KeyRejection::Repeated | KeyRejection::Malformed(_) => {
                (types::KEY_MALFORMED, "Idempotency-Key header malformed")
            }
        };
        let body = problem_body(type_, title, 400, &sentence(&self.to_string()));
        let mut response = (StatusCode::BAD_REQUEST, body).into_response();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

/// The JSON of an RFC 9457 problem, member for member what idem-runtime's
/// `Problem::to_body` writes (its tests compare the two).
fn problem_body(type_: &str, title: &str, status: u16, detail: &str) -> Vec<u8> {
    let string = |text: &str| serde_json::to_string(text).expect("a string always serializes");
    let mut body = format!(
        r#"{{"type":{},"title":{},"status":{status}"#,
        string(type_),
        string(title)
    );
    if !detail.is_empty() {
        body.push_str(&format!(r#","detail":{}"#, string(detail)));
    }
    body.push('}');
    body.into_bytes()
}

/// Records `outcome` on the current span (idem-runtime's per-request
/// `idem.request` span; a no-op outside one) and logs it, under the target
/// `idem_runtime::http::trace`, as idem-runtime's responses do.
///
/// ```
/// idem_core::extract::record_outcome("rejected");
/// ```
pub fn record_outcome(outcome: &'static str) {
    tracing::Span::current().record("outcome", outcome);
    // The runtime's target, where these events have always been logged, so
    // filters on `idem_runtime` keep them.
    tracing::info!(target: "idem_runtime::http::trace", outcome, "idempotent request answered");
}

/// Parses one `Idempotency-Key` header value.
///
/// Accepts the draft's structured-field string (`"abc"`, with `\"` and `\\`
/// escapes, parameters after it ignored) and the bare value Stripe-style
/// clients send (`abc`). Either way the key must be 1 to 255 visible ASCII
/// characters.
///
/// ```
/// use axum::http::HeaderValue;
/// use idem_core::extract::parse_header_value;
///
/// let quoted = parse_header_value(&HeaderValue::from_static("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"")).unwrap();
/// let bare = parse_header_value(&HeaderValue::from_static("8e03978e-40d5-43e8-bc93-6894a57f9324")).unwrap();
/// assert_eq!(quoted, bare);
/// assert!(parse_header_value(&HeaderValue::from_static("\"unterminated")).is_err());
/// assert!(parse_header_value(&HeaderValue::from_static("\"\"")).is_err());
/// ```
pub fn parse_header_value(value: &HeaderValue) -> Result<IdempotencyKey, KeyRejection> {
    let text = value
        .to_str()
        .map_err(|_| KeyRejection::Malformed("the value holds non-ASCII bytes; only visible ASCII characters ('!' to '~') are allowed".into()))?;
    let text = text.trim_matches([' ', '\t']);
    match text.strip_prefix('"') {
        Some(rest) => Ok(IdempotencyKey::new(parse_sf_string(rest)?)?),
        None => Ok(IdempotencyKey::new(text)?),
    }
}

/// Parses the rest of an RFC 8941 string after its opening quote.
fn parse_sf_string(rest: &str) -> Result<String, KeyRejection> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, escaped @ ('"' | '\\'))) => out.push(escaped),
                _ => {
                    return Err(malformed(
                        "a backslash in a quoted key may only escape '\"' or '\\'",
                    ))
                }
            },
            '"' => {
                let params = &rest[at + 1..];
                if params.is_empty() || params.starts_with(';') {
                    return Ok(out);
                }
                return Err(malformed("unexpected characters after the closing quote"));
            }
            ' '..='~' => out.push(c),
            _ => {
                return Err(malformed(
                    "a quoted key may hold only printable ASCII characters",
                ))
            }
        }
    }
    Err(malformed("the quoted key has no closing quote"))
}

fn malformed(what: &str) -> KeyRejection {
    KeyRejection::Malformed(format!("{what}; send the key as a structured-field string (\"...\") or a bare value of 1 to 255 visible ASCII characters"))
}

fn from_parts(parts: &Parts) -> Result<Option<IdempotencyKey>, KeyRejection> {
    key_from_headers(&parts.headers)
}

/// The key in `headers`' one `Idempotency-Key` entry, `None` without one;
/// refused when it is sent twice or is malformed. gRPC metadata is a header
/// map too (`tonic::metadata::MetadataMap::as_ref`).
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use idem_core::extract::key_from_headers;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(key_from_headers(&headers), Ok(None));
/// headers.insert("idempotency-key", HeaderValue::from_static("k-1"));
/// assert_eq!(key_from_headers(&headers).unwrap().unwrap().as_str(), "k-1");
/// ```
pub fn key_from_headers(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyRejection> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyRejection::Repeated);
    }
    parse_header_value(value).map(Some)
}

/// Extracts the `Idempotency-Key` header; 400 problem details when it is
/// missing or malformed.
///
/// ```
/// use idem_core::IdempotencyKey;
///
/// async fn handler(key: IdempotencyKey) -> String {
///     format!("key tag {}", key.log_tag())
/// }
/// let _app: axum::Router = axum::Router::new().route("/", axum::routing::post(handler));
/// ```
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = KeyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        from_parts(parts)?.ok_or(KeyRejection::Missing)
    }
}

/// `Option<IdempotencyKey>`: `None` when the header is absent, still 400 when
/// it is malformed.
impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = KeyRejection;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        from_parts(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &[u8]) -> Result<String, KeyRejection> {
        parse_header_value(&HeaderValue::from_bytes(value).unwrap()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn structured_field_strings() {
        assert_eq!(parse(br#""abc""#).unwrap(), "abc");
        assert_eq!(parse(br#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(parse(br#""abc";v=1"#).unwrap(), "abc");
        assert_eq!(parse(br#"  "abc"  "#).unwrap(), "abc");
        assert!(
            parse(br#""a b""#).is_err(),
            "spaces are not visible characters"
        );
        assert!(parse(br#""a\nb""#).is_err());
        assert!(parse(br#""abc"x"#).is_err());
        assert!(parse(br#""abc"#).is_err());
        assert!(parse(br#""""#).is_err());
        assert!(parse(format!("\"{}\"", "k".repeat(256)).as_bytes()).is_err());
        assert_eq!(
            parse(format!("\"{}\"", "k".repeat(255)).as_bytes())
                .unwrap()
                .len(),
            255
        );
    }

    #[test]
    fn bare_values() {
        assert_eq!(parse(b"order-8812").unwrap(), "order-8812");
        assert!(parse(b"has space").is_err());
        assert!(parse(b"caf\xc3\xa9").is_err());
        assert!(parse("k".repeat(256).as_bytes()).is_err());
    }
}
