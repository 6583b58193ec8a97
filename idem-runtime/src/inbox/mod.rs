//! The idempotent consumer (inbox): each incoming message runs at most once
//! per consumer, however often the transport delivers it.
//!
//! The inbox is an idem claim. Scope `inbox/<consumer>`, key = the
//! publisher's message id (JetStream's `Nats-Msg-Id`, a webhook's
//! `webhook-id`; never the transport's sequence, which changes when a message
//! is published again), fingerprint = the payload. The handler's writes and
//! the record commit in one transaction, and the transport is acknowledged
//! only after that commit. Every delivery ends in one [`Verdict`]:
//!
//! | verdict | when | JetStream | webhook |
//! |---|---|---|---|
//! | [`Verdict::Processed`] | the handler ran and committed | ack | 2xx |
//! | [`Verdict::Duplicate`] | already processed: nothing runs | ack | 2xx, `Idempotent-Replayed: true` |
//! | [`Verdict::Busy`] | another delivery holds the claim | nak with delay | 409, `Retry-After` |
//! | [`Verdict::Retry`] | a transient error (rolled back) | nak with backoff | 503, `Retry-After` |
//! | [`Verdict::Poisoned`] | a permanent error, or too many deliveries | term | the handler's 4xx |
//! | [`Verdict::Mismatch`] | the id was used before with another payload | term (poisoned) | 422 |
//!
//! A poisoned message gets a row in `idem_poison` and a stored rejection, so
//! it never runs again by accident; [`Inbox::requeue`] clears both and hands
//! the message back for another try.
//!
//! ```no_run
//! use idem_runtime::inbox::{Inbox, Incoming, Verdict};
//! use idem_runtime::{Engine, Problem};
//! use sqlx::Sqlite;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::<Sqlite>::open_sqlite("billing.db").await?;
//! engine.migrate().await?;
//! let inbox = Inbox::new(engine, "billing", "bill-order.v1")?;
//!
//! let message = Incoming::new("order-8812-created", br#"{"order":8812}"#.to_vec());
//! let verdict = inbox
//!     .handle(&message, async |tx, message| {
//!         sqlx::query("INSERT INTO invoices (body) VALUES (?)")
//!             .bind(&message.payload)
//!             .execute(&mut *tx)
//!             .await
//!             .map_err(|_| Problem::new(503, "Database unavailable"))?;
//!         Ok::<_, Problem>(())
//!     })
//!     .await;
//! assert!(matches!(verdict, Verdict::Processed(_) | Verdict::Duplicate(_)));
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::Pool;
use tracing::Instrument;

use crate::check_step_name;
use crate::engine::{Answer, Engine, Via};
use crate::error::IdemError;
use crate::fingerprint::{Fingerprint, FingerprintHasher};
use crate::metrics::{self, InboxResult};
use crate::operation::Operation;
use crate::outcome::{ErrorStatus, Outcome, StoredResponse};
use crate::policy::Policy;
use crate::scope::{Scope, ScopePart};
use crate::IdempotencyKey;

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "axum")]
pub mod webhook;

pub use crate::store::inbox::PoisonMessage;

use crate::store::inbox::{NewPoison, REJECTED_STATUS};
use crate::store::Backend;

/// A consumer's name, which scopes its claims: `inbox/<name>`.
///
/// As a [`ScopePart`] it is the whole scope, so an `#[idempotent]` handler
/// with `scope = "consumer"` and a `consumer: Consumer` parameter claims
/// exactly the keys its [`Inbox`] does.
///
/// ```
/// use idem_runtime::inbox::Consumer;
/// use idem_runtime::ScopePart;
///
/// let billing = Consumer::new("billing");
/// assert_eq!(billing.scope_part(), "inbox/billing");
/// assert_eq!(billing.scope().as_stored(), "13:inbox/billing");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Consumer {
    name: String,
    scoped: String,
}

impl Consumer {
    /// A consumer called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        let scoped = format!("inbox/{name}");
        Self { name, scoped }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scope its claims live in.
    pub fn scope(&self) -> Scope {
        Scope::tenant(&self.scoped)
    }
}

impl ScopePart for Consumer {
    fn scope_part(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.scoped)
    }
}

/// One delivery of a message, as a transport hands it to the inbox.
///
/// Its [`Fingerprint`] is the payload alone: the same id with the same bytes
/// is a duplicate, the same id with other bytes a [`Verdict::Mismatch`].
///
/// ```
/// use idem_runtime::fingerprint;
/// use idem_runtime::inbox::Incoming;
///
/// let first = Incoming::new("m-1", b"{}".to_vec()).source("orders.created").deliveries(1);
/// let again = Incoming::new("m-1", b"{}".to_vec()).source("orders.created").deliveries(2);
/// assert_eq!(fingerprint("bill.v1", &first), fingerprint("bill.v1", &again));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// The publisher's message id: the inbox's key.
    pub id: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Where it came from (a subject, a sender), for poison rows and logs.
    pub source: Option<String>,
    /// The transport's sequence of this delivery, for poison rows and logs.
    pub source_seq: Option<u64>,
    /// Which delivery this is, from 1.
    pub deliveries: u32,
}

impl Incoming {
    /// A first delivery of `payload` under the publisher's id `id`.
    pub fn new(id: impl Into<String>, payload: Vec<u8>) -> Self {
        Self {
            id: id.into(),
            payload,
            source: None,
            source_seq: None,
            deliveries: 1,
        }
    }

    /// Sets where the message came from.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Sets the transport's sequence.
    pub fn source_seq(mut self, seq: u64) -> Self {
        self.source_seq = Some(seq);
        self
    }

    /// Sets the delivery count.
    pub fn deliveries(mut self, deliveries: u32) -> Self {
        self.deliveries = deliveries;
        self
    }

    /// The payload decoded as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

impl Fingerprint for Incoming {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_bytes(&self.payload);
    }
}

/// How one delivery ended, and so what the transport is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The handler ran, and its writes and the record committed: acknowledge.
    Processed(StoredResponse),
    /// The message was processed before; nothing ran: acknowledge. Carries the
    /// stored response.
    Duplicate(StoredResponse),
    /// Another delivery of the same message holds the claim: redeliver later.
    Busy {
        /// When the other delivery's claim may be free.
        retry_after: Duration,
    },
    /// A transient failure; everything rolled back: redeliver later.
    Retry {
        /// What went wrong.
        error: String,
        /// The backoff before the next delivery.
        retry_after: Duration,
    },
    /// The consumer gave up: a poison row is committed; terminate the message.
    Poisoned {
        /// Why.
        error: String,
        /// The handler's stored error response, when it returned one.
        response: Option<StoredResponse>,
    },
    /// The message id was used before with a different payload; nothing ran.
    Mismatch,
}

impl Verdict {
    /// A lowercase label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Processed(_) => "processed",
            Verdict::Duplicate(_) => "duplicate",
            Verdict::Busy { .. } => "busy",
            Verdict::Retry { .. } => "retry",
            Verdict::Poisoned { .. } => "poison",
            Verdict::Mismatch => "mismatch",
        }
    }
}

/// Why an inbox could not be built or an operator action failed.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The step name is not of the form `name.vN`.
    #[error("inbox step {0:?} is not a step name of the form `name.vN`")]
    Step(&'static str),
    /// The consumer name is empty or contains a character other than ASCII
    /// letters, digits, `-`, `_` and `.`.
    #[error("consumer name {0:?} must be ASCII letters, digits, '-', '_' or '.'")]
    ConsumerName(String),
    /// No poison row has this message id.
    #[error("no poisoned message {message_id:?} for consumer {consumer:?}")]
    NotPoisoned {
        /// The consumer.
        consumer: String,
        /// The message id.
        message_id: String,
    },
    /// The store failed.
    #[error("inbox store: {0}")]
    Store(#[from] sqlx::Error),
}

/// An idempotent consumer over one store.
///
/// Cheap to clone; each clone shares the engine's pool.
#[derive(Debug)]
pub struct Inbox<DB: Backend> {
    engine: Engine<DB>,
    consumer: Consumer,
    step: &'static str,
    policy: Policy,
    max_deliveries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
}

impl<DB: Backend> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            consumer: self.consumer.clone(),
            step: self.step,
            policy: self.policy,
            max_deliveries: self.max_deliveries,
            backoff_base: self.backoff_base,
            backoff_cap: self.backoff_cap,
        }
    }
}

/// Deliveries before a message that keeps failing transiently is poisoned.
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;

impl<DB: Backend> Inbox<DB> {
    /// An inbox for `consumer`, whose claims are recorded under `step`.
    ///
    /// The claims use the engine's policy, except that a delivery waits at
    /// most one second for a claim another delivery holds (then
    /// [`Verdict::Busy`]); retention should outlast every way a message can
    /// come back (the stream's `max_age`, the relay's retry horizon, the
    /// sender's retry schedule).
    pub fn new(engine: Engine<DB>, consumer: &str, step: &'static str) -> Result<Self, InboxError> {
        if check_step_name(step).is_err() {
            return Err(InboxError::Step(step));
        }
        let valid = !consumer.is_empty()
            && consumer
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(InboxError::ConsumerName(consumer.to_owned()));
        }
        let policy = *engine.policy();
        let policy = policy.with_wait_timeout(policy.wait_timeout.min(Duration::from_secs(1)));
        Ok(Self {
            engine,
            consumer: Consumer::new(consumer),
            step,
            policy,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
        })
    }

    /// Replaces the claims' policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// After how many deliveries a transient failure poisons the message
    /// (default [`DEFAULT_MAX_DELIVERIES`]). Keep it below the transport's
    /// own limit (JetStream `max_deliver`), which drops messages silently.
    pub fn max_deliveries(mut self, max: u32) -> Self {
        self.max_deliveries = max.max(1);
        self
    }

    /// The backoff after a transient failure: `base * 2^(delivery - 1)`,
    /// capped (default 1 s, capped at 60 s).
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap.max(base);
        self
    }

    /// The consumer.
    pub fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    /// The step its claims are recorded under.
    pub fn step(&self) -> &'static str {
        self.step
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<DB> {
        &self.engine
    }

    /// The claim for `message`: scope `inbox/<consumer>`, key the message id,
    /// fingerprint the payload.
    pub fn operation(&self, message: &Incoming) -> Result<Operation, crate::KeyError> {
        let key = IdempotencyKey::new(message.id.clone())?;
        Ok(Operation::new(self.consumer.scope(), key, self.step, message).with_policy(self.policy))
    }

    /// Runs `work` for `message` under the inbox's claim: its writes and the
    /// record commit together, once per message id.
    ///
    /// `work` returns `Result<T, E>`: `Ok` is [`Verdict::Processed`]; an error
    /// whose [`ErrorStatus::status`] is below 500 is permanent (stored, and
    /// the message is [`Verdict::Poisoned`]); 500 and above is transient
    /// (rolled back, [`Verdict::Retry`], poisoned once the message has had
    /// [`Inbox::max_deliveries`] deliveries).
    pub async fn handle<T, E, F>(&self, message: &Incoming, work: F) -> Verdict
    where
        T: Serialize + DeserializeOwned + Send,
        E: ErrorStatus + Send,
        F: AsyncFnOnce(&mut DB::Connection, &Incoming) -> Result<T, E>,
    {
        let op = match self.operation_or_poison(message).await {
            Ok(op) => op,
            Err(verdict) => return verdict,
        };
        let span = self.span(&op);
        async {
            let done = self
                .engine
                .run(&op, async |tx| work(tx, message).await)
                .await;
            self.judge(message, &op, done).await
        }
        .instrument(span)
        .await
    }

    /// The span one message is handled in: the consumer, the step and the
    /// message id's log tag (the tag the relay upstream logs it under), never
    /// the id itself.
    fn span(&self, op: &Operation) -> tracing::Span {
        tracing::info_span!(
            "idem.consume",
            consumer = self.consumer.name(),
            step = self.step,
            key = %op.key().log_tag(),
        )
    }

    /// Runs an `#[idempotent]` function for `message`: `call` gets the
    /// engine, the [`Consumer`] (the function's `scope`), the message id as
    /// key and the message (its `#[fingerprint]` parameter). The function's
    /// `step` must be this inbox's step. The function's claim follows its
    /// own attributes, not [`Inbox::with_policy`]: give it `wait = "1s"` so an
    /// overlapping delivery is turned away quickly as [`Verdict::Busy`].
    ///
    /// ```no_run
    /// use idem_runtime::inbox::{Consumer, Inbox, Incoming};
    /// use idem_runtime::{Answer, Engine, IdemError, IdempotencyKey, Problem};
    /// use sqlx::Sqlite;
    ///
    /// // What `#[idempotent(scope = "consumer", step = "bill-order.v1")]` generates
    /// // for `async fn bill(tx, consumer: Consumer, key: IdempotencyKey, #[fingerprint] message: Incoming)`.
    /// async fn bill(engine: &Engine<Sqlite>, consumer: Consumer, key: IdempotencyKey, message: Incoming)
    ///     -> Result<Answer<Result<(), Problem>>, IdemError>
    /// {
    ///     # unimplemented!()
    /// }
    ///
    /// # async fn demo(inbox: Inbox<Sqlite>, message: Incoming) {
    /// let verdict = inbox
    ///     .handle_idempotent(&message, async |engine, consumer, key, message| {
    ///         bill(engine, consumer, key, message).await
    ///     })
    ///     .await;
    /// # }
    /// ```
    pub async fn handle_idempotent<T, E, F>(&self, message: &Incoming, call: F) -> Verdict
    where
        T: Serialize + DeserializeOwned + Send,
        E: ErrorStatus + Send,
        F: AsyncFnOnce(
            &Engine<DB>,
            Consumer,
            IdempotencyKey,
            Incoming,
        ) -> Result<Answer<Result<T, E>>, IdemError>,
    {
        let op = match self.operation_or_poison(message).await {
            Ok(op) => op,
            Err(verdict) => return verdict,
        };
        let span = self.span(&op);
        async {
            let done = call(
                &self.engine,
                self.consumer.clone(),
                op.key().clone(),
                message.clone(),
            )
            .await;
            self.judge(message, &op, done).await
        }
        .instrument(span)
        .await
    }

    async fn judge<T, E>(
        &self,
        message: &Incoming,
        op: &Operation,
        done: Result<Answer<Result<T, E>>, IdemError>,
    ) -> Verdict
    where
        T: Serialize + DeserializeOwned,
        E: ErrorStatus,
    {
        let done = match done {
            Ok(done) => done,
            Err(IdemError::InProgress { retry_after }) => return Verdict::Busy { retry_after },
            Err(IdemError::Mismatch) => return Verdict::Mismatch,
            Err(error @ IdemError::Replay(_)) => {
                return self.poison(message, &error.to_string()).await
            }
            Err(error) => return self.transient(message, op, error.to_string()).await,
        };
        let replayed = done.via == Via::Replayed;
        match done.value.to_stored() {
            Some(response) if response.status < 400 => {
                if replayed {
                    metrics::inbox_message(self.consumer.name(), InboxResult::Duplicate);
                    Verdict::Duplicate(response)
                } else {
                    metrics::inbox_message(self.consumer.name(), InboxResult::Processed);
                    Verdict::Processed(response)
                }
            }
            Some(response) => {
                let error = String::from_utf8_lossy(&response.body).into_owned();
                match self.write_poison(message, &error, None).await {
                    Ok(()) => Verdict::Poisoned {
                        error,
                        response: Some(response),
                    },
                    Err(store) => Verdict::Retry {
                        error: format!("recording the poisoned message failed: {store}"),
                        retry_after: self.backoff_for(message.deliveries),
                    },
                }
            }
            None => {
                let error = match &done.value {
                    Err(error) => serde_json::to_string(error)
                        .unwrap_or_else(|_| format!("status {}", error.status())),
                    Ok(_) => "the outcome could not be stored".to_owned(),
                };
                self.transient(message, op, error).await
            }
        }
    }

    async fn transient(&self, message: &Incoming, op: &Operation, error: String) -> Verdict {
        if message.deliveries < self.max_deliveries {
            return Verdict::Retry {
                error,
                retry_after: self.backoff_for(message.deliveries),
            };
        }
        let error = format!(
            "gave up after {} deliveries; last error: {error}",
            message.deliveries
        );
        match self.write_poison(message, &error, Some(op)).await {
            Ok(()) => Verdict::Poisoned {
                error,
                response: None,
            },
            Err(store) => Verdict::Retry {
                error: format!("{error}; recording it failed: {store}"),
                retry_after: self.backoff_for(message.deliveries),
            },
        }
    }

    /// The message's operation, or the message poisoned (its id is not a
    /// valid key, so no delivery can ever succeed).
    async fn operation_or_poison(&self, message: &Incoming) -> Result<Operation, Verdict> {
        match self.operation(message) {
            Ok(op) => Ok(op),
            Err(error) => Err(self
                .poison(message, &format!("message id is not a valid key: {error}"))
                .await),
        }
    }

    /// Gives up on `message`: commits a poison row saying `error` (and, when
    /// its id is a valid key without a record, a stored rejection, so it
    /// cannot run until requeued). Transports call it for a message they
    /// cannot hand to [`Inbox::handle`] at all, or after a
    /// [`Verdict::Mismatch`].
    pub async fn poison(&self, message: &Incoming, error: &str) -> Verdict {
        let op = self.operation(message).ok();
        match self.write_poison(message, error, op.as_ref()).await {
            Ok(()) => Verdict::Poisoned {
                error: error.to_owned(),
                response: None,
            },
            Err(store) => Verdict::Retry {
                error: format!("{error}; recording it failed: {store}"),
                retry_after: self.backoff_for(message.deliveries),
            },
        }
    }

    async fn write_poison(
        &self,
        message: &Incoming,
        error: &str,
        reject: Option<&Operation>,
    ) -> Result<(), sqlx::Error> {
        tracing::warn!(
            consumer = self.consumer.name(),
            source = message.source.as_deref().unwrap_or(""),
            deliveries = message.deliveries,
            %error,
            "poisoned message"
        );
        DB::record_poison(
            self.engine.pool(),
            NewPoison {
                consumer: self.consumer.name(),
                message_id: &message.id,
                source: message.source.as_deref(),
                source_seq: message.source_seq.and_then(|seq| i64::try_from(seq).ok()),
                payload: &message.payload,
                error,
                deliveries: i64::from(message.deliveries),
            },
            reject.map(|op| (op, self.policy.retention)),
        )
        .await?;
        metrics::inbox_message(self.consumer.name(), InboxResult::Poison);
        Ok(())
    }

    fn backoff_for(&self, deliveries: u32) -> Duration {
        let doublings = deliveries.saturating_sub(1).min(20);
        self.backoff_base
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_cap)
    }

    /// The messages this consumer gave up on and nobody requeued yet, oldest first.
    pub async fn poisoned(&self) -> Result<Vec<PoisonMessage>, InboxError> {
        Ok(DB::poisoned(self.engine.pool(), self.consumer.name()).await?)
    }

    /// One poison row, requeued or not.
    pub async fn poison_entry(
        &self,
        message_id: &str,
    ) -> Result<Option<PoisonMessage>, InboxError> {
        Ok(DB::poison_entry(self.engine.pool(), self.consumer.name(), message_id).await?)
    }

    /// Sends a poisoned message back: deletes its stored rejection (so the
    /// next delivery runs the handler) and marks the row `requeued`, in one
    /// transaction, and returns the row, whose payload the transport then
    /// delivers again (see `inbox::nats::NatsInbox::requeue`).
    pub async fn requeue(&self, message_id: &str) -> Result<PoisonMessage, InboxError> {
        requeue(self.engine.pool(), self.consumer.name(), message_id).await
    }

    /// The stored rejection status a poisoned message's record carries.
    pub const REJECTED_STATUS: u16 = REJECTED_STATUS;
}

/// Up to `limit` messages given up on and not requeued, of `consumer` or of
/// every consumer, oldest first: what an operator reads without building an
/// [`Inbox`].
pub async fn poisoned<DB: Backend>(
    pool: &Pool<DB>,
    consumer: Option<&str>,
    limit: u32,
) -> Result<Vec<PoisonMessage>, InboxError> {
    Ok(DB::poisoned_any(pool, consumer, limit).await?)
}

/// Every consumer's poison row for `message_id`, requeued or not.
pub async fn poison_for_message<DB: Backend>(
    pool: &Pool<DB>,
    message_id: &str,
) -> Result<Vec<PoisonMessage>, InboxError> {
    Ok(DB::poison_for_message(pool, message_id).await?)
}

/// [`Inbox::requeue`] for `consumer` without building an [`Inbox`]: deletes
/// the stored rejection and marks the row `requeued`. The message runs on its
/// next delivery; a transport that terminated it (JetStream) has to be handed
/// the returned payload again.
pub async fn requeue<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    message_id: &str,
) -> Result<PoisonMessage, InboxError> {
    let scope = Consumer::new(consumer).scope();
    DB::requeue_poison(pool, scope.as_stored(), consumer, message_id)
        .await?
        .ok_or_else(|| InboxError::NotPoisoned {
            consumer: consumer.to_owned(),
            message_id: message_id.to_owned(),
        })
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    async fn inbox() -> Inbox<sqlx::Sqlite> {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect("sqlite::memory:")
            .await
            .expect("in-memory sqlite");
        Inbox::new(Engine::new(pool), "billing", "bill.v1").expect("inbox")
    }

    #[tokio::test]
    async fn backoff_doubles_per_delivery_up_to_the_cap() {
        let inbox = inbox()
            .await
            .backoff(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<_> = (1..=6).map(|n| inbox.backoff_for(n)).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        assert_eq!(inbox.backoff_for(u32::MAX), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn names_are_checked() {
        let engine = inbox().await.engine().clone();
        assert!(matches!(
            Inbox::new(engine.clone(), "billing", "Bill Order"),
            Err(InboxError::Step(_))
        ));
        assert!(matches!(
            Inbox::new(engine.clone(), "bill ing", "bill.v1"),
            Err(InboxError::ConsumerName(_))
        ));
        assert!(matches!(
            Inbox::new(engine, "", "bill.v1"),
            Err(InboxError::ConsumerName(_))
        ));
    }

    #[tokio::test]
    async fn the_claim_is_scoped_keyed_and_fingerprinted_by_the_message() {
        let inbox = inbox().await;
        let message = Incoming::new("m-1", b"{}".to_vec()).deliveries(3);
        let op = inbox.operation(&message).expect("valid id");
        assert_eq!(op.scope().as_stored(), "13:inbox/billing");
        assert_eq!(op.key().as_str(), "m-1");
        assert_eq!(op.step(), "bill.v1");
        let other = Incoming::new("m-1", b"[]".to_vec());
        assert_ne!(
            op.fingerprint(),
            inbox.operation(&other).expect("valid id").fingerprint()
        );
        assert!(inbox.operation(&Incoming::new("m 1", Vec::new())).is_err());
    }
}
