//! The retry loop: one logical call, as many attempts as the policy allows,
//! every one with the same key and the same body.

use std::time::{Duration, Instant, SystemTime};

use http::{Extensions, HeaderValue, Method, StatusCode};
use idem_core::header::IDEMPOTENCY_KEY;
use idem_core::problem::{types::IN_PROGRESS as IN_PROGRESS_PROBLEM, PROBLEM_JSON};
use idem_core::IdempotencyKey;
use reqwest::{Request, Response, ResponseBuilderExt, Url};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::error::{ClientError, RetryReason};
use crate::policy::{MissingKey, RetryPolicy};
use crate::response::{Attempts, ResponseExt};
use crate::retry_after::parse_retry_after;

/// The retrying middleware for [`reqwest_middleware`].
///
/// A request carrying an [`IdempotencyKey`] (attached with
/// [`RequestBuilderExt::idempotency_key`](crate::RequestBuilderExt::idempotency_key))
/// is sent with `Idempotency-Key: "<key>"` and retried, with the same key and
/// the same body, after a connection error, a timeout, a 408, 425, 429 or 5xx,
/// or idem's in-progress 409. Any other answer, a 422 or another 4xx
/// included, ends the call at once. See the [crate docs](crate) for the full rules.
///
/// ```no_run
/// use idem_client::{IdempotentRetry, RetryPolicy};
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotentRetry::new(RetryPolicy::default()))
///     .build();
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotentRetry {
    policy: RetryPolicy,
}

impl IdempotentRetry {
    /// A middleware that retries by `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }

    /// Its policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotentRetry {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = extensions.get::<IdempotencyKey>().cloned();
        let span = tracing::info_span!(
            "idempotent_call",
            method = %request.method(),
            url = %display_url(request.url()),
            key = key.as_ref().map(|k| k.log_tag()).unwrap_or_default(),
            attempts = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        self.call(request, key, extensions, next)
            .instrument(span)
            .await
    }
}

/// How one attempt ended.
enum Outcome {
    Answer(Response),
    Failed(reqwest_middleware::Error),
}

/// Why the loop stopped short of an answer worth returning as is.
#[derive(Clone, Copy)]
enum Stop {
    AttemptLimit,
    Deadline,
}

impl IdempotentRetry {
    async fn call(
        &self,
        request: Request,
        key: Option<IdempotencyKey>,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let method = request.method().to_string();
        let url = display_url(request.url());
        let retryable = key.is_some() || is_idempotent(request.method());
        if !retryable && self.policy.on_missing_key() == MissingKey::Refuse {
            tracing::warn!("refused: a non-idempotent request without an idempotency key");
            return Err(reqwest_middleware::Error::middleware(
                ClientError::MissingKey { method, url },
            ));
        }
        let limit = if retryable {
            self.policy.attempts_allowed()
        } else {
            1
        };
        if limit > 1 && request.try_clone().is_none() {
            tracing::warn!("refused: a streaming body cannot be replayed");
            return Err(reqwest_middleware::Error::middleware(
                ClientError::BodyNotReplayable { method, url },
            ));
        }
        let mut request = request;
        if let Some(key) = &key {
            request
                .headers_mut()
                .insert(IDEMPOTENCY_KEY, structured_field_string(key));
        }
        if let (None, Some(timeout)) = (request.timeout(), self.policy.per_attempt_timeout()) {
            *request.timeout_mut() = Some(timeout);
        }

        let started = Instant::now();
        let deadline = self.policy.call_deadline();
        let mut original = Some(request);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let this = if attempt == limit {
                original.take().expect("the last attempt takes the request")
            } else {
                original
                    .as_ref()
                    .and_then(Request::try_clone)
                    .expect("checked replayable before the first attempt")
            };
            let remaining = deadline.saturating_sub(started.elapsed());
            let sent = tokio::time::timeout(remaining, async {
                match next.clone().run(this, extensions).await {
                    Ok(response) => self.classify_answer(response).await,
                    Err(error) => {
                        let reason = classify_error(&error);
                        (Outcome::Failed(error), reason, None)
                    }
                }
            })
            .await;
            let Ok((outcome, reason, retry_after)) = sent else {
                tracing::warn!(attempt, "attempt cut off: the deadline passed");
                record(attempt, None);
                return Err(reqwest_middleware::Error::middleware(
                    ClientError::DeadlineExceeded {
                        method,
                        url,
                        attempts: attempt,
                        deadline,
                    },
                ));
            };
            // A keyless non-idempotent request is sent once and returned as it is.
            let Some(reason) = reason.filter(|_| retryable) else {
                return match outcome {
                    Outcome::Answer(response) => Ok(self.finish(response, attempt)),
                    Outcome::Failed(error) => {
                        tracing::warn!(attempt, %error, "failed; not retried");
                        record(attempt, None);
                        Err(error)
                    }
                };
            };
            let stop = if attempt >= limit {
                Some((Stop::AttemptLimit, Duration::ZERO))
            } else {
                let wait = match retry_after {
                    Some(asked) => asked.min(self.policy.retry_after_limit()),
                    None => self.policy.backoff_delay(attempt),
                };
                if started.elapsed() + wait >= deadline {
                    Some((Stop::Deadline, wait))
                } else {
                    tracing::info!(
                        attempt,
                        reason = %reason,
                        wait_ms = wait.as_millis() as u64,
                        retry_after = retry_after.is_some(),
                        "retrying"
                    );
                    tokio::time::sleep(wait).await;
                    None
                }
            };
            if let Some((stop, wait)) = stop {
                let why = match stop {
                    Stop::AttemptLimit => "attempt limit reached",
                    Stop::Deadline => "the next wait would pass the deadline",
                };
                tracing::warn!(attempt, reason = %reason, wait_ms = wait.as_millis() as u64, "giving up: {why}");
                return match outcome {
                    Outcome::Answer(mut response) => {
                        response.extensions_mut().insert(Attempts(attempt));
                        record(attempt, Some(response.status().as_u16()));
                        Ok(response)
                    }
                    Outcome::Failed(source) => {
                        record(attempt, None);
                        Err(reqwest_middleware::Error::middleware(ClientError::GaveUp {
                            method,
                            url,
                            attempts: attempt,
                            reason,
                            source,
                        }))
                    }
                };
            }
        }
    }

    /// The answer of the last attempt, with the attempt count attached.
    fn finish(&self, mut response: Response, attempt: u32) -> Response {
        response.extensions_mut().insert(Attempts(attempt));
        let status = response.status().as_u16();
        record(attempt, Some(status));
        tracing::info!(attempt, status, replayed = response.replayed(), "answered");
        response
    }

    /// Whether an answer is worth retrying, and the wait it asks for. A 409
    /// with `Retry-After` and a problem body is read to see whether it is
    /// idem's in-progress problem; the body read is put back.
    async fn classify_answer(
        &self,
        response: Response,
    ) -> (Outcome, Option<RetryReason>, Option<Duration>) {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let reason = match status {
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS => {
                Some(RetryReason::Status(status.as_u16()))
            }
            s if s.is_server_error() => Some(RetryReason::Status(status.as_u16())),
            StatusCode::CONFLICT if retry_after.is_some() => {
                if self.policy.retries_any_conflict_with_retry_after() {
                    Some(RetryReason::Conflict)
                } else if is_problem(&response) {
                    return match rebuffer(response).await {
                        Ok((response, body)) => {
                            let in_progress =
                                problem_type(&body).as_deref() == Some(IN_PROGRESS_PROBLEM);
                            let reason = in_progress.then_some(RetryReason::InProgress);
                            (Outcome::Answer(response), reason, retry_after)
                        }
                        Err(error) => (
                            Outcome::Failed(error.into()),
                            Some(RetryReason::ConnectionLost),
                            None,
                        ),
                    };
                } else {
                    None
                }
            }
            _ => None,
        };
        (Outcome::Answer(response), reason, retry_after)
    }
}

/// Whether a failed attempt is worth retrying: connection failures, timeouts,
/// and a connection lost before the answer. Errors raised by other
/// middleware, or while building the request, are not.
fn classify_error(error: &reqwest_middleware::Error) -> Option<RetryReason> {
    let reqwest_middleware::Error::Reqwest(error) = error else {
        return None;
    };
    if error.is_timeout() {
        Some(RetryReason::Timeout)
    } else if error.is_connect() {
        Some(RetryReason::Connect)
    } else if error.is_request() || error.is_body() {
        Some(RetryReason::ConnectionLost)
    } else {
        None
    }
}

/// Fills in the call's span once it ends.
fn record(attempts: u32, status: Option<u16>) {
    let span = tracing::Span::current();
    span.record("attempts", attempts);
    if let Some(status) = status {
        span.record("status", status);
    }
}

/// Methods RFC 9110 defines as idempotent: safe to retry without a key.
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The key as an RFC 8941 string: quoted, with `"` and `\` escaped.
pub(crate) fn structured_field_string(key: &IdempotencyKey) -> HeaderValue {
    let mut text = String::with_capacity(key.as_str().len() + 2);
    text.push('"');
    for c in key.as_str().chars() {
        if c == '"' || c == '\\' {
            text.push('\\');
        }
        text.push(c);
    }
    text.push('"');
    HeaderValue::from_str(&text).expect("a key is visible ASCII")
}

fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with(PROBLEM_JSON))
}

/// The `type` member of a problem body.
fn problem_type(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Problem {
        #[serde(rename = "type")]
        type_: String,
    }
    serde_json::from_slice::<Problem>(body)
        .ok()
        .map(|p| p.type_)
}

/// Reads the whole body and builds the same response around it again.
async fn rebuffer(mut response: Response) -> Result<(Response, Vec<u8>), reqwest::Error> {
    let url = response.url().clone();
    let status = response.status();
    let version = response.version();
    let headers = response.headers().clone();
    let extensions = std::mem::take(response.extensions_mut());
    let body = response.bytes().await?;
    let mut rebuilt = http::Response::builder()
        .status(status)
        .version(version)
        .url(url)
        .body(body.clone())
        .expect("the parts came from a response");
    *rebuilt.headers_mut() = headers;
    rebuilt.extensions_mut().extend(extensions);
    Ok((Response::from(rebuilt), body.to_vec()))
}

/// A URL for logs and errors: scheme, host, port and path, without
/// credentials, query or fragment.
fn display_url(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_as_structured_field_strings() {
        let key = IdempotencyKey::new(r#"a"b\c"#).unwrap();
        assert_eq!(structured_field_string(&key), r#""a\"b\\c""#);
        let key = IdempotencyKey::new("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        assert_eq!(
            structured_field_string(&key),
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324\""
        );
    }

    #[test]
    fn the_server_parses_what_the_client_sends() {
        for raw in [
            "plain",
            r#"q"u\o"te"#,
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
        ] {
            let key = IdempotencyKey::new(raw).unwrap();
            let header = structured_field_string(&key);
            let header = axum::http::HeaderValue::from_bytes(header.as_bytes()).unwrap();
            assert_eq!(
                idem_runtime::http::parse_header_value(&header).unwrap(),
                key
            );
        }
    }

    #[test]
    fn in_progress_is_idems_problem_type() {
        assert_eq!(
            IN_PROGRESS_PROBLEM,
            idem_runtime::http::problem::types::IN_PROGRESS
        );
    }

    #[test]
    fn urls_lose_credentials_and_query() {
        let url =
            Url::parse("https://user:secret@pay.example:8443/v1/charges?token=abc#x").unwrap();
        assert_eq!(display_url(&url), "https://pay.example:8443/v1/charges");
    }
}
