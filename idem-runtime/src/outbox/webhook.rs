//! The HTTP webhook sink: POSTs each message to its destination URL, signed
//! per the Standard Webhooks specification.

use std::time::Duration;

use super::sink::{Delivered, OutgoingMessage, Sink, SinkError, SinkFuture};
use crate::signature::{unix_now, SigningSecret};

/// The name messages use for the webhook sink ([`Message::webhook`](super::Message::webhook)).
pub const WEBHOOK_SINK: &str = "webhook";

/// A [`Sink`] that POSTs each message to its destination URL.
///
/// Every request carries the message id twice: as `Idempotency-Key` (a
/// structured-field string, `"<id>"`) and as the Standard Webhooks
/// `webhook-id`, with `webhook-timestamp` and a `webhook-signature`
/// (HMAC-SHA256 over `id.timestamp.body` with the [`SigningSecret`]).
/// Receivers verify the signature and drop repeats by id.
///
/// | response | outcome |
/// |---|---|
/// | 2xx | delivered; a duplicate if `Idempotent-Replayed: true` |
/// | 408, 409, 425, 429, 5xx, a connection error, a timeout | retried (`Retry-After` in seconds honoured) |
/// | any other status | dead |
///
/// `https://` destinations need the `webhook-rustls` feature.
///
/// ```
/// use idem_runtime::outbox::{Sink, WebhookSink};
/// use idem_runtime::signature::SigningSecret;
/// let sink = WebhookSink::new(SigningSecret::from_bytes(b"a shared secret".to_vec()));
/// assert_eq!(sink.name(), "webhook");
/// ```
#[derive(Debug, Clone)]
pub struct WebhookSink {
    name: String,
    client: reqwest::Client,
    secret: SigningSecret,
}

impl WebhookSink {
    /// A sink named [`WEBHOOK_SINK`] signing with `secret`, over a fresh
    /// client that gives up connecting after 5 s.
    pub fn new(secret: SigningSecret) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("a client with default settings builds");
        Self::with_client(client, secret)
    }

    /// A sink over an existing client (its own timeouts, proxies, pool).
    pub fn with_client(client: reqwest::Client, secret: SigningSecret) -> Self {
        Self {
            name: WEBHOOK_SINK.to_owned(),
            client,
            secret,
        }
    }

    /// Renames the sink, to run several webhook sinks (different secrets)
    /// in one relay.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    async fn send(&self, message: &OutgoingMessage) -> Result<Delivered, SinkError> {
        if message.destination.starts_with("https://") && !cfg!(feature = "webhook-rustls") {
            return Err(SinkError::Permanent {
                message: format!(
                    "{} is an https URL and this build has no TLS; enable idem's `webhook-rustls` feature",
                    message.destination
                ),
            });
        }
        let timestamp = unix_now();
        let signature = self.secret.sign(&message.id, timestamp, &message.payload);
        let mut request = self
            .client
            .post(&message.destination)
            .header("content-type", &message.content_type)
            .header("idempotency-key", sf_string(&message.id))
            .header("webhook-id", &message.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature);
        for (name, value) in &message.headers {
            request = request.header(name, value);
        }
        let response = request
            .body(message.payload.clone())
            .send()
            .await
            .map_err(|error| {
                if error.is_builder() {
                    SinkError::Permanent {
                        message: format!("cannot build the request: {error}"),
                    }
                } else {
                    SinkError::Transient {
                        message: format!("POST {}: {error}", message.destination),
                        retry_after: None,
                    }
                }
            })?;
        let status = response.status();
        let receipt = Some(format!("HTTP {}", status.as_u16()));
        if status.is_success() {
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .and_then(|value| value.to_str().ok())
                .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
            return Ok(if replayed {
                Delivered::Duplicate { receipt }
            } else {
                Delivered::Published { receipt }
            });
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let what = format!("POST {} answered {status}", message.destination);
        if matches!(status.as_u16(), 408 | 409 | 425 | 429) || status.is_server_error() {
            Err(SinkError::Transient {
                message: what,
                retry_after,
            })
        } else {
            Err(SinkError::Permanent { message: what })
        }
    }
}

/// `id` as a structured-field string (RFC 8941): quoted, `\` and `"` escaped.
fn sf_string(id: &str) -> String {
    let mut quoted = String::with_capacity(id.len() + 2);
    quoted.push('"');
    for c in id.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

impl Sink for WebhookSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn publish<'a>(
        &'a self,
        message: &'a OutgoingMessage,
    ) -> SinkFuture<'a, Result<Delivered, SinkError>> {
        Box::pin(self.send(message))
    }
}

#[cfg(test)]
mod tests {
    use super::sf_string;

    #[test]
    fn idempotency_key_is_a_structured_field_string() {
        assert_eq!(sf_string("abc123"), "\"abc123\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}
