//! The transactional outbox: messages enqueued in the claim's transaction,
//! delivered by a relay after the commit.
//!
//! A side effect sent inline (a webhook, an event, an email) escapes before
//! the commit that records it, and a retry sends it again. Instead, the
//! handler [`enqueue`]s a [`Message`] on its claim's connection: the message
//! commits with the business write and the stored response, or not at all.
//! A [`Relay`] then claims committed messages under a lease, publishes them
//! through a [`Sink`] outside any transaction, and marks them sent under its
//! lease token. Delivery is at least once with a stable id
//! (`child_key(parent_key, step)`), which receivers use to drop repeats.
//!
//! ```no_run
//! use idem_runtime::outbox::{self, Message};
//! use idem_runtime::{Step, Engine, IdempotencyKey, Operation, Problem, Scope};
//! use sqlx::Sqlite;
//!
//! const NOTIFY_ORDER: Step = Step::new("notify-order.v1");
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::<Sqlite>::open_sqlite("app.db").await?;
//! engine.migrate().await?;
//! let scope = Scope::tenant("acme");
//! let key = IdempotencyKey::new("order-8812")?;
//! let op = Operation::new(scope.clone(), key.clone(), "place-order.v1", &2500i64);
//! let message = Message::webhook("http://127.0.0.1:9000/hooks")
//!     .json(&serde_json::json!({ "order": "8812", "total": 2500 }))?
//!     .for_step(&key, NOTIFY_ORDER)
//!     .scope(&scope)
//!     .ordering_key("order-8812");
//! engine
//!     .run(&op, async |tx| {
//!         // ... the business write on `tx` ...
//!         outbox::enqueue(&mut *tx, &message).await?;
//!         Ok::<_, Problem>("placed".to_string())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

mod channel;
#[cfg(feature = "nats")]
pub mod nats;
mod relay;
pub mod sink;
mod store;
#[cfg(feature = "webhook")]
mod webhook;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;

pub use channel::InProcessSink;
pub use relay::{Backoff, Relay, RelayError, RelayFault, RelayHandle, RelayStats};
pub use sink::{Delivered, OutgoingMessage, Sink, SinkError, SinkFuture};
pub use store::{Backlog, MessageState, OutboxConnection, OutboxEntry, OutboxStore};
#[cfg(feature = "webhook")]
pub use webhook::{WebhookSink, WEBHOOK_SINK};

use crate::engine::Engine;
use crate::key::IdempotencyKey;
use crate::scope::Scope;
use crate::step::Step;

/// How many delivery attempts a message gets before it goes to `dead`,
/// unless [`Message::max_attempts`] says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;

/// The longest message id accepted, in bytes.
pub const MAX_ID_LEN: usize = 255;

/// One message to enqueue: where it goes, what it carries, and its id.
///
/// Built with [`Message::to`] (or [`Message::webhook`]), given a payload
/// ([`Message::json`] or [`Message::body`]) and an id: [`Message::for_step`]
/// inside a claim (the id is `child_key(parent_key, step)`), or
/// [`Message::with_id`] outside one.
///
/// ```
/// use idem_runtime::outbox::Message;
/// use idem_runtime::{child_key, Step, IdempotencyKey, Scope};
/// const NOTIFY: Step = Step::new("notify.v1");
/// let key = IdempotencyKey::new("order-1").unwrap();
/// let message = Message::to("events", "orders.created")
///     .json(&serde_json::json!({"order": 1}))
///     .unwrap()
///     .for_step(&key, NOTIFY)
///     .scope(&Scope::tenant("acme"));
/// assert_eq!(message.id(), Some(child_key("order-1", "notify.v1").as_str()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    id: Option<String>,
    parent_key: Option<String>,
    step: Option<&'static str>,
    scope: String,
    sink: String,
    destination: String,
    ordering_key: Option<String>,
    headers: Vec<(String, String)>,
    content_type: String,
    payload: Vec<u8>,
    max_attempts: u32,
}

impl Message {
    /// A message for the sink named `sink` (see [`Sink::name`]), to
    /// `destination` within it (a subject, a URL). The payload starts empty.
    pub fn to(sink: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            id: None,
            parent_key: None,
            step: None,
            scope: String::new(),
            sink: sink.into(),
            destination: destination.into(),
            ordering_key: None,
            headers: Vec::new(),
            content_type: "application/octet-stream".to_owned(),
            payload: Vec::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// A message for the webhook sink, POSTed to `url`.
    pub fn webhook(url: impl Into<String>) -> Self {
        Self::to("webhook", url)
    }

    /// Serializes `value` as the JSON payload (`application/json`).
    pub fn json<T: serde::Serialize + ?Sized>(
        mut self,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        self.payload = serde_json::to_vec(value)?;
        self.content_type = "application/json".to_owned();
        Ok(self)
    }

    /// Sets the payload and its media type.
    pub fn body(mut self, content_type: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        self.content_type = content_type.into();
        self.payload = payload.into();
        self
    }

    /// Names the message as `step` on behalf of `parent`: its id becomes
    /// [`child_key`](crate::child_key)`(parent, step)`, so a retried or
    /// taken-over attempt enqueues the same id, which the store keeps once.
    pub fn for_step(mut self, parent: &IdempotencyKey, step: Step) -> Self {
        self.id = Some(parent.child(step).as_str().to_owned());
        self.parent_key = Some(parent.as_str().to_owned());
        self.step = Some(step.name());
        self
    }

    /// Gives the message an explicit id, for messages enqueued outside a
    /// claim. The caller keeps the id stable across retries.
    pub fn with_id(mut self, id: impl Into<String>, step: Step) -> Self {
        self.id = Some(id.into());
        self.parent_key = None;
        self.step = Some(step.name());
        self
    }

    /// The scope the message was enqueued under, for lookups.
    pub fn scope(mut self, scope: &Scope) -> Self {
        self.scope = scope.as_stored().to_owned();
        self
    }

    /// Messages with the same ordering key are published one at a time, in
    /// enqueue order; a dead one holds the rest back until it is requeued or
    /// skipped.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Adds a header the sink sends with the message.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// How many delivery attempts before the message goes to `dead`
    /// ([`DEFAULT_MAX_ATTEMPTS`] unless set; at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The message's id, once [`Message::for_step`] or [`Message::with_id`] set it.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn validate(&self) -> Result<(&str, &'static str), OutboxError> {
        let (Some(id), Some(step)) = (self.id.as_deref(), self.step) else {
            return Err(OutboxError::Invalid(
                "the message has no id: call `for_step(&key, STEP)` inside a claim or `with_id(id, STEP)` outside one".into(),
            ));
        };
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(OutboxError::Invalid(format!(
                "a message id is 1 to {MAX_ID_LEN} bytes; this one has {}",
                id.len()
            )));
        }
        if self.sink.is_empty() || self.destination.is_empty() {
            return Err(OutboxError::Invalid(
                "a message needs a sink and a destination".into(),
            ));
        }
        if self.max_attempts == 0 || self.max_attempts > i32::MAX as u32 {
            return Err(OutboxError::Invalid(
                "max_attempts must be at least 1".into(),
            ));
        }
        Ok((id, step))
    }
}

/// What [`enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row: the message will be published after the commit.
    Queued,
    /// A message with this id already exists (an earlier attempt enqueued it
    /// and committed): nothing was written.
    AlreadyQueued,
}

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The message is incomplete or out of bounds; nothing was written.
    #[error("invalid outbox message: {0}")]
    Invalid(String),
    /// Another operation (a different scope, parent key or step) already
    /// enqueued a message with this id; nothing was written. Two scopes
    /// sharing an idempotency key derive the same ids: keys must be unique
    /// (a UUID) for the outbox to tell their messages apart.
    #[error("outbox message id {id} is taken by step {step} in scope {scope:?}")]
    IdTaken {
        /// The id.
        id: String,
        /// The scope that holds it.
        scope: String,
        /// The step that holds it.
        step: String,
    },
    /// The database refused.
    #[error("outbox store error: {0}")]
    Store(#[from] sqlx::Error),
}

impl From<OutboxError> for crate::Problem {
    /// An invalid message is a bug in the handler (500); a store error is
    /// transient (503). Either way the claim's transaction rolls back.
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Invalid(detail) => crate::Problem::new(500, "Invalid outbox message")
                .with_detail(crate::problem::sentence(&detail)),
            error @ OutboxError::IdTaken { .. } => {
                crate::Problem::new(500, "Outbox message id taken")
                    .with_detail(crate::problem::sentence(&error.to_string()))
            }
            OutboxError::Store(error) => error.into(),
        }
    }
}

/// Wakes relays in this process after an enqueue.
static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// Counts enqueues in this process, so a relay can tell it missed a wake-up.
static ENQUEUES: AtomicU64 = AtomicU64::new(0);

fn wake_relays() {
    ENQUEUES.fetch_add(1, Ordering::Release);
    WAKE.notify_waiters();
}

/// The enqueues made in this process so far: a claim notes it when it is
/// granted and hands it to [`wake_after_commit`] once it has committed.
pub(crate) fn enqueues_so_far() -> u64 {
    ENQUEUES.load(Ordering::Acquire)
}

/// After a commit: if any enqueue happened in this process since `seen`
/// (the claim's own, possibly), wakes the relays, which find the message at
/// once now that it is committed instead of at their next look.
pub(crate) fn wake_after_commit(seen: u64) {
    if ENQUEUES.load(Ordering::Acquire) != seen {
        WAKE.notify_waiters();
    }
}

/// The Postgres channel enqueues notify and relays listen on
/// ([`notify_other_processes`], [`Relay::listen`]).
pub const NOTIFY_CHANNEL: &str = "idem_outbox";

static NOTIFY_POSTGRES: AtomicBool = AtomicBool::new(false);
#[cfg(feature = "postgres")]
static LAST_NOTIFY_MS: AtomicU64 = AtomicU64::new(0);
/// Enqueues from one process send at most one notification per this period.
#[cfg(feature = "postgres")]
const NOTIFY_EVERY_MS: u64 = 100;

/// Makes [`enqueue`] on Postgres also send `NOTIFY idem_outbox` in the
/// enqueuing transaction, so relays in other processes started with
/// [`Relay::listen`] wake as soon as it commits (Postgres delivers a
/// notification at commit, and drops it on rollback). Coalesced: at most one
/// notification per 100 ms from this process; a relay woken by one looks
/// again over the next half second, and polls as ever after that. Off by
/// default, since every notifying commit briefly takes Postgres' global
/// notification lock. No effect on SQLite, whose relays poll.
pub fn notify_other_processes(on: bool) {
    NOTIFY_POSTGRES.store(on, Ordering::Relaxed);
}

/// Whether this enqueue should notify: enabled, and the period since the
/// last notification has passed.
#[cfg(feature = "postgres")]
fn should_notify() -> bool {
    if !NOTIFY_POSTGRES.load(Ordering::Relaxed) {
        return false;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0);
    let last = LAST_NOTIFY_MS.load(Ordering::Relaxed);
    now.saturating_sub(last) >= NOTIFY_EVERY_MS
        && LAST_NOTIFY_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// Writes `message` to the outbox on `conn`: inside a claim, pass the claim's
/// connection (an `#[idempotent]` handler's transaction parameter, or the
/// connection [`Engine::run`] hands its closure), so the message commits with
/// the business write or not at all.
///
/// The message id is unique in the store: enqueuing an id that is already
/// there (a retried attempt after a commit) writes nothing and returns
/// [`Enqueued::AlreadyQueued`] (or [`OutboxError::IdTaken`] if another
/// scope, parent key or step holds the id). Two concurrent attempts cannot both hold the
/// claim, and the unique constraint holds even if they could.
///
/// Relays in this process are woken; they see the message once the
/// transaction commits.
pub async fn enqueue<C>(conn: &mut C, message: &Message) -> Result<Enqueued, OutboxError>
where
    C: OutboxConnection + ?Sized,
{
    let (id, step) = message.validate()?;
    match conn.insert_message(id, step, message).await? {
        None => {
            wake_relays();
            Ok(Enqueued::Queued)
        }
        Some(origin)
            if origin.scope == message.scope
                && origin.parent_key == message.parent_key
                && origin.step == step =>
        {
            Ok(Enqueued::AlreadyQueued)
        }
        Some(origin) => Err(OutboxError::IdTaken {
            id: id.to_owned(),
            scope: origin.scope,
            step: origin.step,
        }),
    }
}

/// How many messages wait, the oldest one's age, the ordering keys a dead
/// message blocks, and how many are dead.
pub async fn backlog<DB: OutboxStore>(engine: &Engine<DB>) -> Result<Backlog, OutboxError> {
    Ok(DB::backlog(engine.pool()).await?)
}

/// One message by id, with its state, attempts, last error and receipt.
pub async fn entry<DB: OutboxStore>(
    engine: &Engine<DB>,
    message_id: &str,
) -> Result<Option<OutboxEntry>, OutboxError> {
    Ok(DB::entry(engine.pool(), message_id).await?)
}

/// The messages enqueued under `(scope, parent_key)`, oldest first.
pub async fn entries_for<DB: OutboxStore>(
    engine: &Engine<DB>,
    scope: &Scope,
    parent_key: &IdempotencyKey,
) -> Result<Vec<OutboxEntry>, OutboxError> {
    Ok(DB::entries_for(engine.pool(), scope.as_stored(), parent_key.as_str()).await?)
}

/// Up to `limit` messages, in `state` if given, newest first.
pub async fn list<DB: OutboxStore>(
    engine: &Engine<DB>,
    state: Option<MessageState>,
    limit: u32,
) -> Result<Vec<OutboxEntry>, OutboxError> {
    Ok(DB::list(engine.pool(), state, limit).await?)
}

/// Up to `limit` dead messages, oldest first.
pub async fn dead<DB: OutboxStore>(
    engine: &Engine<DB>,
    limit: u32,
) -> Result<Vec<OutboxEntry>, OutboxError> {
    Ok(DB::dead(engine.pool(), limit).await?)
}

/// Puts a dead message back to `pending`, due now, with its attempts reset.
/// Returns whether a dead message with that id existed.
pub async fn requeue<DB: OutboxStore>(
    engine: &Engine<DB>,
    message_id: &str,
) -> Result<bool, OutboxError> {
    let requeued = DB::requeue(engine.pool(), message_id).await?;
    if requeued {
        wake_relays();
    }
    Ok(requeued)
}

/// Gives up on a dead or pending message without publishing it: it is marked
/// `sent` with the receipt `skipped`, which releases its ordering key.
/// Returns whether an unsent message with that id existed.
pub async fn skip<DB: OutboxStore>(
    engine: &Engine<DB>,
    message_id: &str,
) -> Result<bool, OutboxError> {
    let skipped = DB::skip(engine.pool(), message_id).await?;
    if skipped {
        wake_relays();
    }
    Ok(skipped)
}

/// Deletes up to `batch` sent messages older than `retention`; returns how
/// many went. Dead messages are never deleted. The relay calls this on its own.
pub async fn purge_sent<DB: OutboxStore>(
    pool: &Pool<DB>,
    retention: Duration,
    batch: u32,
) -> Result<u64, OutboxError> {
    Ok(DB::purge_sent(pool, retention, batch).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTIFY: Step = Step::new("notify.v1");

    #[test]
    fn a_message_needs_an_id_a_destination_and_attempts() {
        let key = IdempotencyKey::new("order-1").unwrap();
        let no_id = Message::webhook("http://127.0.0.1:1/hooks");
        assert!(matches!(no_id.validate(), Err(OutboxError::Invalid(_))));
        let ok = no_id.clone().for_step(&key, NOTIFY);
        assert_eq!(
            ok.validate().unwrap(),
            (
                crate::child_key("order-1", "notify.v1").as_str(),
                "notify.v1"
            )
        );
        let no_destination = Message::to("events", "").with_id("m-1", NOTIFY);
        assert!(matches!(
            no_destination.validate(),
            Err(OutboxError::Invalid(_))
        ));
        let no_attempts = ok.clone().max_attempts(0);
        assert!(matches!(
            no_attempts.validate(),
            Err(OutboxError::Invalid(_))
        ));
        let long_id = Message::to("events", "x").with_id("x".repeat(MAX_ID_LEN + 1), NOTIFY);
        assert!(matches!(long_id.validate(), Err(OutboxError::Invalid(_))));
    }

    #[test]
    fn an_explicit_id_has_no_parent() {
        let key = IdempotencyKey::new("order-1").unwrap();
        let message = Message::to("events", "x")
            .for_step(&key, NOTIFY)
            .with_id("m-1", NOTIFY);
        assert_eq!(message.id(), Some("m-1"));
        assert_eq!(message.parent_key, None);
    }

    #[test]
    fn json_sets_the_payload_and_its_type() {
        let message = Message::to("events", "x")
            .json(&serde_json::json!({"a": 1}))
            .unwrap();
        assert_eq!(message.payload, br#"{"a":1}"#);
        assert_eq!(message.content_type, "application/json");
    }
}
