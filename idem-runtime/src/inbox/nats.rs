//! The JetStream pull-consumer runner (feature `nats`).
//!
//! Fetches batches from a pull consumer and runs each message through the
//! [`Inbox`]: the message id comes from `Idem-Msg-Id` (set on a requeued
//! message) or else `Nats-Msg-Id`, never from the stream sequence. Each
//! [`Verdict`] becomes an acknowledgement, sent only after the commit:
//!
//! | verdict | acknowledgement |
//! |---|---|
//! | processed, duplicate | `AckSync` (`double_ack`: the server confirms) |
//! | busy | `Nak` with the claim's time left |
//! | retry | `Nak` with the inbox's backoff |
//! | poisoned, mismatch | poison row committed, then `Term` |
//!
//! A crash between the commit and the ack is harmless: the redelivery finds
//! the record and is acknowledged as a duplicate, with no work. Set the
//! consumer's `ack_wait` above the handler's usual time (or send `Progress`);
//! a delivery that overtakes a still-running one gets a busy verdict and a nak,
//! never a second effect. Keep `max_deliver` above the inbox's
//! [`Inbox::max_deliveries`]: JetStream drops a message silently at its limit.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::Context;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use futures_util::StreamExt;

use super::{Inbox, InboxError, Incoming, PoisonMessage, Verdict};
use crate::faults::{abort_at, FaultPoint};
use crate::store::Backend;

/// The header a requeued message carries its original id in (its
/// `Nats-Msg-Id` must differ, or the stream would drop it as a duplicate).
pub const MESSAGE_ID_HEADER: &str = "Idem-Msg-Id";
/// JetStream's deduplication header.
pub const NATS_MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Why the runner stopped or an operator action failed.
#[derive(Debug, thiserror::Error)]
pub enum NatsInboxError {
    /// Fetching a batch from the consumer failed.
    #[error("fetching from the JetStream consumer: {0}")]
    Fetch(String),
    /// Acknowledging a message failed (it will be redelivered; the inbox
    /// makes the redelivery a duplicate).
    #[error("acknowledging a JetStream message: {0}")]
    Ack(String),
    /// Publishing a requeued message failed; requeue it again.
    #[error("republishing requeued message {message_id:?}: {error}")]
    Republish {
        /// The message id.
        message_id: String,
        /// What went wrong.
        error: String,
    },
    /// The poison row has no subject to send the message back to.
    #[error("poisoned message {0:?} has no subject to be requeued to")]
    NoSubject(String),
    /// The inbox failed.
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

/// What one fetched batch came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Processed and acknowledged.
    pub processed: u32,
    /// Duplicates acknowledged with no work.
    pub duplicates: u32,
    /// Nak'd because another delivery held the claim.
    pub busy: u32,
    /// Nak'd after a transient failure.
    pub retried: u32,
    /// Poisoned and terminated.
    pub poisoned: u32,
}

impl BatchReport {
    /// Messages in the batch.
    pub fn total(&self) -> u32 {
        self.processed + self.duplicates + self.busy + self.retried + self.poisoned
    }

    fn count(&mut self, verdict: &Verdict) {
        match verdict {
            Verdict::Processed(_) => self.processed += 1,
            Verdict::Duplicate(_) => self.duplicates += 1,
            Verdict::Busy { .. } => self.busy += 1,
            Verdict::Retry { .. } => self.retried += 1,
            Verdict::Poisoned { .. } | Verdict::Mismatch => self.poisoned += 1,
        }
    }
}

/// An [`Inbox`] fed by a JetStream pull consumer.
///
/// ```no_run
/// use async_nats::jetstream::{self, consumer::pull};
/// use idem_runtime::inbox::nats::NatsInbox;
/// use idem_runtime::inbox::Inbox;
/// use idem_runtime::{Engine, Problem};
/// use sqlx::Sqlite;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Engine::<Sqlite>::open_sqlite("billing.db").await?;
/// engine.migrate().await?;
/// let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
/// let stream = js.get_stream("ORDERS").await?;
/// let consumer = stream
///     .get_or_create_consumer("billing", pull::Config { durable_name: Some("billing".into()), ..Default::default() })
///     .await?;
/// let runner = NatsInbox::new(Inbox::new(engine, "billing", "bill-order.v1")?, js, consumer);
/// runner
///     .run(async |inbox, message| {
///         inbox
///             .handle(message, async |tx, message| {
///                 sqlx::query("INSERT INTO invoices (order_json) VALUES (?)")
///                     .bind(&message.payload)
///                     .execute(&mut *tx)
///                     .await
///                     .map_err(|_| Problem::new(503, "Database unavailable"))?;
///                 Ok::<_, Problem>(())
///             })
///             .await
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct NatsInbox<DB: Backend> {
    inbox: Inbox<DB>,
    jetstream: Context,
    consumer: PullConsumer,
    batch: usize,
    expires: Duration,
    crash_at: Option<FaultPoint>,
}

impl<DB: Backend> NatsInbox<DB> {
    /// A runner feeding `consumer`'s messages to `inbox`; `jetstream` is used
    /// to send requeued messages back.
    pub fn new(inbox: Inbox<DB>, jetstream: Context, consumer: PullConsumer) -> Self {
        Self {
            inbox,
            jetstream,
            consumer,
            batch: 32,
            expires: Duration::from_secs(5),
            crash_at: None,
        }
    }

    /// Messages per fetch (default 32).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How long one fetch waits for messages (default 5 s).
    pub fn expires(mut self, expires: Duration) -> Self {
        self.expires = expires;
        self
    }

    /// Arms a crash point, for fault-injection tests: with
    /// [`FaultPoint::AfterCommit`] the process aborts after a message's
    /// commit and before its ack. Does nothing unless built with the `faults`
    /// feature.
    pub fn crash_at(mut self, point: Option<FaultPoint>) -> Self {
        self.crash_at = point;
        self
    }

    /// The inbox.
    pub fn inbox(&self) -> &Inbox<DB> {
        &self.inbox
    }

    /// Fetches and handles batches until `shutdown` completes (the batch in
    /// hand is finished first) or the consumer fails.
    pub async fn run_until<F>(
        &self,
        handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), NatsInboxError>
    where
        F: AsyncFn(&Inbox<DB>, &Incoming) -> Verdict,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                report = self.poll(&handler) => { report?; }
            }
        }
    }

    /// Fetches and handles batches until the consumer fails.
    pub async fn run<F>(&self, handler: F) -> Result<(), NatsInboxError>
    where
        F: AsyncFn(&Inbox<DB>, &Incoming) -> Verdict,
    {
        self.run_until(handler, std::future::pending()).await
    }

    /// Fetches one batch (waiting at most [`NatsInbox::expires`]) and handles
    /// each message, one at a time.
    pub async fn poll<F>(&self, handler: &F) -> Result<BatchReport, NatsInboxError>
    where
        F: AsyncFn(&Inbox<DB>, &Incoming) -> Verdict,
    {
        let mut messages = self
            .consumer
            .fetch()
            .max_messages(self.batch)
            .expires(self.expires)
            .messages()
            .await
            .map_err(|error| NatsInboxError::Fetch(error.to_string()))?;
        let mut report = BatchReport::default();
        while let Some(next) = messages.next().await {
            let delivery = next.map_err(|error| NatsInboxError::Fetch(error.to_string()))?;
            let verdict = self.deliver(delivery, handler).await?;
            report.count(&verdict);
        }
        Ok(report)
    }

    /// Handles one delivery and acknowledges it according to its verdict.
    pub async fn deliver<F>(
        &self,
        delivery: async_nats::jetstream::Message,
        handler: &F,
    ) -> Result<Verdict, NatsInboxError>
    where
        F: AsyncFn(&Inbox<DB>, &Incoming) -> Verdict,
    {
        let message = message_of(&delivery);
        let verdict = if message.id.is_empty() {
            let seq = message.source_seq.unwrap_or(0);
            let unkeyed = Incoming {
                id: format!("stream-seq-{seq}"),
                ..message.clone()
            };
            self.inbox
                .poison(
                    &unkeyed,
                    "message has no Nats-Msg-Id: it cannot be deduplicated",
                )
                .await
        } else {
            match handler(&self.inbox, &message).await {
                Verdict::Mismatch => {
                    let poisoned = self
                        .inbox
                        .poison(
                            &message,
                            "message id was used before with a different payload",
                        )
                        .await;
                    match poisoned {
                        Verdict::Poisoned { .. } => Verdict::Mismatch,
                        other => other,
                    }
                }
                verdict => verdict,
            }
        };
        let acked = match &verdict {
            Verdict::Processed(_) | Verdict::Duplicate(_) => {
                abort_at(self.crash_at, FaultPoint::AfterCommit);
                delivery.double_ack().await
            }
            Verdict::Busy { retry_after } | Verdict::Retry { retry_after, .. } => {
                delivery.ack_with(AckKind::Nak(Some(*retry_after))).await
            }
            Verdict::Poisoned { .. } | Verdict::Mismatch => delivery.ack_with(AckKind::Term).await,
        };
        tracing::debug!(
            consumer = self.inbox.consumer().name(),
            verdict = verdict.as_str(),
            deliveries = message.deliveries,
            "handled a JetStream message"
        );
        acked.map_err(|error| NatsInboxError::Ack(error.to_string()))?;
        Ok(verdict)
    }

    /// Requeues a poisoned message: clears its rejection ([`Inbox::requeue`])
    /// and publishes its payload again to its subject, with
    /// `Idem-Msg-Id` = its id (and a fresh `Nats-Msg-Id`, so the stream's
    /// own deduplication keeps it), so this consumer processes it once more.
    /// If the publish fails, the row stays `requeued`; requeue it again.
    pub async fn requeue(&self, message_id: &str) -> Result<PoisonMessage, NatsInboxError> {
        let row = self.inbox.requeue(message_id).await?;
        let subject = row
            .source
            .clone()
            .ok_or_else(|| NatsInboxError::NoSubject(message_id.to_owned()))?;
        let publish = PublishMessage::build()
            .payload(Bytes::from(row.payload.clone()))
            .header(MESSAGE_ID_HEADER, message_id)
            .message_id(format!("{message_id}~requeue-{}", row.requeues));
        let republish = |error: String| NatsInboxError::Republish {
            message_id: message_id.to_owned(),
            error,
        };
        self.jetstream
            .send_publish(subject, publish)
            .await
            .map_err(|error| republish(error.to_string()))?
            .await
            .map_err(|error| republish(error.to_string()))?;
        Ok(row)
    }
}

/// The inbox's view of a JetStream delivery: id from `Idem-Msg-Id` or
/// `Nats-Msg-Id` (empty if neither is set), payload, subject, stream
/// sequence and delivery count.
pub fn message_of(delivery: &async_nats::jetstream::Message) -> Incoming {
    let header = |name: &str| {
        delivery
            .headers
            .as_ref()
            .and_then(|headers| headers.get(name))
            .map(|value| value.as_str().to_owned())
            .filter(|value| !value.is_empty())
    };
    let id = header(MESSAGE_ID_HEADER)
        .or_else(|| header(NATS_MSG_ID_HEADER))
        .unwrap_or_default();
    let mut message =
        Incoming::new(id, delivery.payload.to_vec()).source(delivery.subject.as_str());
    if let Ok(info) = delivery.info() {
        message = message
            .source_seq(info.stream_sequence)
            .deliveries(u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX));
    }
    message
}
