//! The NATS JetStream sink (feature `nats`).
//!
//! Each message is published with `Nats-Msg-Id` = its outbox id and the
//! publish acknowledgement is awaited: JetStream stores it once, and a repeat
//! with the same id is answered `duplicate: true`, which counts as
//! delivered ([`Delivered::Duplicate`]).
//!
//! JetStream forgets ids after the stream's `duplicate_window` (120 s by
//! default), counted from the first sighting. So the sink works in one of two
//! modes, checked when the relay starts ([`Sink::check`]):
//!
//! - **Window** (the default): the relay must stop retrying a message before
//!   the window closes. A stream whose `duplicate_window` is shorter than the
//!   relay's retry horizon is refused.
//! - **Per subject** ([`NatsSink::per_subject`]): every message gets its own
//!   subject, `<destination>.<id>`, and is published with
//!   `Nats-Expected-Last-Subject-Sequence: 0` ("only if this subject is
//!   empty"). A repeat, however late, is refused with error 10071 (or 10077
//!   on a stream with `discard_new_per_subject`), which counts as delivered:
//!   deduplication lasts as long as the stream keeps the message. A stream
//!   whose `max_age` is shorter than the retry horizon is refused. Consumers
//!   subscribe to `<destination>.*`.

use std::time::Duration;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::HeaderMap;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::sink::{Delivered, OutgoingMessage, Sink, SinkError, SinkFuture};

/// JetStream's answer to a publish whose expected last subject sequence did
/// not match: the subject already has a message.
pub const WRONG_LAST_SEQUENCE: u64 = 10071;
/// JetStream's answer to a publish into a full subject of a
/// `discard_new_per_subject` stream.
pub const SUBJECT_FULL: u64 = 10077;
/// JetStream's answer to a message larger than the stream allows.
pub const MESSAGE_TOO_LARGE: u64 = 10054;

/// How repeats are recognised; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DedupeMode {
    /// `Nats-Msg-Id` within the stream's `duplicate_window`.
    #[default]
    Window,
    /// One subject per message, published only while the subject is empty.
    PerSubject,
}

/// Publishes outbox messages to a JetStream stream.
///
/// ```no_run
/// use idem_runtime::outbox::nats::NatsSink;
/// use idem_runtime::outbox::Sink;
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let sink = NatsSink::new(async_nats::jetstream::new(client), "ORDERS");
/// // Refuses a stream that forgets ids sooner than the relay may retry.
/// sink.check(Duration::from_secs(60)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NatsSink {
    name: String,
    jetstream: Context,
    stream: String,
    mode: DedupeMode,
}

impl NatsSink {
    /// A sink named `nats` publishing into `stream` in window mode.
    pub fn new(jetstream: Context, stream: impl Into<String>) -> Self {
        Self {
            name: "nats".to_owned(),
            jetstream,
            stream: stream.into(),
            mode: DedupeMode::Window,
        }
    }

    /// Renames the sink (outbox rows pick their sink by name).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Switches to per-subject deduplication.
    pub fn per_subject(mut self) -> Self {
        self.mode = DedupeMode::PerSubject;
        self
    }

    /// The deduplication mode.
    pub fn mode(&self) -> DedupeMode {
        self.mode
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The subject `message` is published on: its destination in window
    /// mode; `<destination>.<token>` in per-subject mode, where the token is
    /// the id itself when it is made of ASCII letters, digits, `-` and `_`,
    /// else the first 32 hex digits of its SHA-256.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::outbox::nats::NatsSink;
    /// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let sink = NatsSink::new(async_nats::jetstream::new(client), "ORDERS").per_subject();
    /// assert_eq!(sink.subject("orders.created", "abc-1"), "orders.created.abc-1");
    /// # Ok(()) }
    /// ```
    pub fn subject(&self, destination: &str, id: &str) -> String {
        match self.mode {
            DedupeMode::Window => destination.to_owned(),
            DedupeMode::PerSubject => format!("{destination}.{}", subject_token(id)),
        }
    }

    async fn send(&self, message: &OutgoingMessage) -> Result<Delivered, SinkError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            headers.insert(name.as_str(), value.as_str());
        }
        if !message.content_type.is_empty() {
            headers.insert("Content-Type", message.content_type.as_str());
        }
        let mut publish = PublishMessage::build()
            .headers(headers)
            .payload(Bytes::copy_from_slice(&message.payload))
            .message_id(&message.id);
        if self.mode == DedupeMode::PerSubject {
            publish = publish.expected_last_subject_sequence(0);
        }
        let subject = self.subject(&message.destination, &message.id);
        let ack = match self.jetstream.send_publish(subject, publish).await {
            Ok(future) => future.await,
            Err(error) => Err(error),
        };
        match ack {
            Ok(ack) => {
                let receipt = Some(format!("{}#{}", ack.stream, ack.sequence));
                if ack.duplicate {
                    Ok(Delivered::Duplicate { receipt })
                } else {
                    Ok(Delivered::Published { receipt })
                }
            }
            Err(error) => {
                let code = api_error_code(&error);
                let already_there = error.kind() == PublishErrorKind::WrongLastSequence
                    || code == Some(SUBJECT_FULL);
                if self.mode == DedupeMode::PerSubject && already_there {
                    return Ok(Delivered::Duplicate {
                        receipt: Some(format!("{}: already stored", self.stream)),
                    });
                }
                let message = format!("publishing to stream {}: {error}", self.stream);
                if code == Some(MESSAGE_TOO_LARGE) {
                    Err(SinkError::Permanent { message })
                } else {
                    // Timeouts, no responders during a leader election, a
                    // broken connection: the next attempt may well succeed.
                    Err(SinkError::Transient {
                        message,
                        retry_after: None,
                    })
                }
            }
        }
    }

    async fn verify(&self, retry_horizon: Duration) -> Result<(), String> {
        let mut stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .map_err(|error| format!("NATS sink: stream {}: {error}", self.stream))?;
        let config = &stream
            .info()
            .await
            .map_err(|error| format!("NATS sink: stream {} info: {error}", self.stream))?
            .config;
        match self.mode {
            DedupeMode::Window if config.duplicate_window < retry_horizon => Err(format!(
                "NATS sink: stream {} forgets message ids after its duplicate_window of {:?}, \
                 shorter than the relay's retry horizon of {:?}: a late retry would be stored twice. \
                 Raise the stream's duplicate_window, shorten the relay's retry horizon, \
                 or use per-subject mode",
                self.stream, config.duplicate_window, retry_horizon
            )),
            DedupeMode::PerSubject
                if !config.max_age.is_zero() && config.max_age < retry_horizon =>
            {
                Err(format!(
                    "NATS sink: stream {} keeps messages for {:?} (max_age), shorter than the \
                     relay's retry horizon of {:?}: in per-subject mode a message is deduplicated \
                     only while the stream keeps it",
                    self.stream, config.max_age, retry_horizon
                ))
            }
            _ => Ok(()),
        }
    }
}

impl Sink for NatsSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn publish<'a>(
        &'a self,
        message: &'a OutgoingMessage,
    ) -> SinkFuture<'a, Result<Delivered, SinkError>> {
        Box::pin(self.send(message))
    }

    fn check(&self, retry_horizon: Duration) -> SinkFuture<'_, Result<(), String>> {
        Box::pin(self.verify(retry_horizon))
    }
}

/// The JetStream API error code behind a publish error, if there is one.
fn api_error_code(error: &async_nats::jetstream::context::PublishError) -> Option<u64> {
    let source = std::error::Error::source(error)?;
    source
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|api| api.error_code().0)
}

fn subject_token(id: &str) -> String {
    let safe = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if safe {
        id.to_owned()
    } else {
        crate::hex::encode(&Sha256::digest(id.as_bytes())[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::subject_token;

    #[test]
    fn subject_tokens_are_single_safe_tokens() {
        assert_eq!(subject_token("order-1_a"), "order-1_a");
        let hashed = subject_token("a.b>*");
        assert_eq!(hashed.len(), 32);
        assert!(hashed.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(subject_token("a.b"), subject_token("a.c"));
    }
}
