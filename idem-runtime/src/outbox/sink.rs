//! Where the relay delivers outbox messages: the [`Sink`] trait.
//!
//! A sink publishes one message and says how it went. It never sees a
//! database transaction: the relay claims messages under a lease, calls
//! [`Sink::publish`] outside any transaction (bounded by a timeout shorter
//! than the lease), and then marks the message sent under its lease token.
//! Delivery is therefore at least once; every message carries its stable
//! [`OutgoingMessage::id`], which receivers use to drop repeats.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed, sendable future, as [`Sink`] methods return (the trait stays
/// object safe, so a relay holds sinks of different types by name).
pub type SinkFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One outbox message as handed to a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// The message's stable id: `child_key(parent_key, step)` for a message
    /// enqueued under a claim, or the id given explicitly. Sinks send it as
    /// their deduplication header (`Nats-Msg-Id`, `Idempotency-Key`,
    /// `webhook-id`).
    pub id: String,
    /// The step that names this kind of message.
    pub step: String,
    /// The destination within the sink: a subject, a URL.
    pub destination: String,
    /// Messages sharing an ordering key are delivered one at a time, in
    /// enqueue order.
    pub ordering_key: Option<String>,
    /// Extra headers to send with the message.
    pub headers: Vec<(String, String)>,
    /// The payload's media type, e.g. `application/json`.
    pub content_type: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Which delivery attempt this is, from 1.
    pub attempt: u32,
}

/// A successful delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The receiver accepted the message for the first time.
    Published {
        /// What the receiver handed back (a stream sequence, a status line),
        /// kept on the outbox row for operators.
        receipt: Option<String>,
    },
    /// The receiver already had it (JetStream `duplicate: true`, an HTTP
    /// `Idempotent-Replayed: true`): counts as delivered.
    Duplicate {
        /// What the receiver handed back.
        receipt: Option<String>,
    },
}

/// A failed delivery, and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Worth retrying later (a timeout, a refused connection, a 5xx, a 429).
    #[error("transient delivery failure: {message}")]
    Transient {
        /// What went wrong, kept as the row's last error.
        message: String,
        /// When the receiver asked to be tried again, if it did (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help (a 4xx other than 408/425/429, a rejected subject):
    /// the message goes to `dead` at once.
    #[error("permanent delivery failure: {message}")]
    Permanent {
        /// What went wrong, kept as the row's last error.
        message: String,
    },
}

/// A destination the relay publishes outbox messages to.
///
/// Implemented by the webhook sink, the NATS JetStream sink and the
/// in-process sink; applications may add their own.
pub trait Sink: Send + Sync + 'static {
    /// The name outbox rows use to pick this sink (their `sink` column).
    fn name(&self) -> &str;

    /// Publishes one message.
    fn publish<'a>(
        &'a self,
        message: &'a OutgoingMessage,
    ) -> SinkFuture<'a, Result<Delivered, SinkError>>;

    /// Checked once when the relay starts: whether this sink can deduplicate
    /// repeats for as long as the relay may retry a message (`retry_horizon`).
    /// An error stops the relay from starting, with the returned explanation.
    fn check(&self, retry_horizon: Duration) -> SinkFuture<'_, Result<(), String>> {
        let _ = retry_horizon;
        Box::pin(async { Ok(()) })
    }
}
