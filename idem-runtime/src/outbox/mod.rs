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
mod error;
pub(crate) mod message;
#[cfg(feature = "nats")]
pub mod nats;
mod relay;
pub mod sink;
pub(crate) mod wake;
#[cfg(feature = "webhook")]
mod webhook;

use sqlx::Pool;
use std::time::Duration;

pub use channel::InProcessSink;
pub use error::OutboxError;
pub use message::{Message, DEFAULT_MAX_ATTEMPTS, MAX_ID_LEN};
pub use relay::{Backoff, Relay, RelayError, RelayHandle, RelayStats};
pub use sink::{Delivered, OutgoingMessage, Sink, SinkError, SinkFuture};
pub use wake::notify_other_processes;
#[cfg(feature = "webhook")]
pub use webhook::{WebhookSink, WEBHOOK_SINK};

pub use crate::store::outbox::{Backlog, MessageState, OutboxEntry, NOTIFY_CHANNEL};
use crate::store::Backend;

/// What [`enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row: the message will be published after the commit.
    Queued,
    /// A message with this id already exists (an earlier attempt enqueued it
    /// and committed): nothing was written.
    AlreadyQueued,
}

/// Writes `message` to the outbox on `conn`: inside a claim, pass the claim's
/// connection (an `#[idempotent]` handler's transaction parameter, or the
/// connection [`Engine::run`](crate::Engine::run) hands its closure), so the message commits with
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
pub async fn enqueue<C, DB>(conn: &mut C, message: &Message) -> Result<Enqueued, OutboxError>
where
    C: sqlx::Connection<Database = DB>,
    DB: Backend + sqlx::Database<Connection = C>,
{
    let (id, step) = message.validate()?;
    let notify = wake::should_notify();
    match DB::insert_message(conn, id, step, message, notify).await? {
        None => {
            wake::wake_relays();
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
pub async fn backlog<DB: Backend>(pool: &Pool<DB>) -> Result<Backlog, OutboxError> {
    Ok(DB::outbox_backlog(pool).await?)
}

/// One message by id, with its state, attempts, last error and receipt.
pub async fn entry<DB: Backend>(
    pool: &Pool<DB>,
    message_id: &str,
) -> Result<Option<OutboxEntry>, OutboxError> {
    Ok(DB::message_entry(pool, message_id).await?)
}

/// The messages enqueued under `(scope, parent_key)`, oldest first: `scope`
/// as [`Scope::as_stored`](crate::Scope::as_stored) spells it (what operators
/// see in `idem inspect`), `parent_key` the claim's key.
pub async fn entries_for<DB: Backend>(
    pool: &Pool<DB>,
    scope: &str,
    parent_key: &str,
) -> Result<Vec<OutboxEntry>, OutboxError> {
    Ok(DB::message_entries(pool, scope, parent_key).await?)
}

/// Up to `limit` messages, in `state` if given, newest first.
pub async fn list<DB: Backend>(
    pool: &Pool<DB>,
    state: Option<MessageState>,
    limit: u32,
) -> Result<Vec<OutboxEntry>, OutboxError> {
    Ok(DB::list_messages(pool, state, limit).await?)
}

/// Up to `limit` dead messages, oldest first.
pub async fn dead<DB: Backend>(
    pool: &Pool<DB>,
    limit: u32,
) -> Result<Vec<OutboxEntry>, OutboxError> {
    Ok(DB::dead_messages(pool, limit).await?)
}

/// Puts a dead message back to `pending`, due now, with its attempts reset.
/// Returns whether a dead message with that id existed.
pub async fn requeue<DB: Backend>(pool: &Pool<DB>, message_id: &str) -> Result<bool, OutboxError> {
    let requeued = DB::requeue_message(pool, message_id).await?;
    if requeued {
        wake::wake_relays();
    }
    Ok(requeued)
}

/// Gives up on a dead or pending message without publishing it: it is marked
/// `sent` with the receipt `skipped`, which releases its ordering key.
/// Returns whether an unsent message with that id existed.
pub async fn skip<DB: Backend>(pool: &Pool<DB>, message_id: &str) -> Result<bool, OutboxError> {
    let skipped = DB::skip_message(pool, message_id).await?;
    if skipped {
        wake::wake_relays();
    }
    Ok(skipped)
}

/// Deletes up to `batch` sent messages older than `retention`; returns how
/// many went. Dead messages are never deleted. The relay calls this on its own.
pub async fn purge_sent<DB: Backend>(
    pool: &Pool<DB>,
    retention: Duration,
    batch: u32,
) -> Result<u64, OutboxError> {
    Ok(DB::purge_sent_messages(pool, retention, batch).await?)
}
