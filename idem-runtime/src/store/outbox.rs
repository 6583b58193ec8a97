//! The outbox table: the rows' types, the statements each backend
//! implements, and those every backend shares.
//!
//! Postgres claims a batch with `SELECT … FOR UPDATE SKIP LOCKED` and leases
//! it in the same statement; SQLite leases a batch with one
//! `UPDATE … RETURNING` under `BEGIN IMMEDIATE`. Either way a claim takes
//! only due, unleased `pending` rows whose ordering key has no older unsent
//! row, bumps each row's `lease_token` and `attempts`, and every later write
//! of the relay is conditioned on that token: a relay whose lease expired and
//! was taken over changes nothing.

use std::future::Future;
use std::time::Duration;

use sqlx::Pool;

use crate::outbox::message::Message;
use crate::outbox::sink::OutgoingMessage;

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Waiting to be published (possibly leased by a relay right now).
    Pending,
    /// Delivered (or skipped by an operator); purged after the retention window.
    Sent,
    /// Failed permanently or ran out of attempts; kept until requeued or skipped.
    Dead,
}

impl MessageState {
    pub(crate) fn parse(text: &str) -> Self {
        match text {
            "sent" => MessageState::Sent,
            "dead" => MessageState::Dead,
            _ => MessageState::Pending,
        }
    }

    /// The state's name in the table: `pending`, `sent`, `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::Sent => "sent",
            MessageState::Dead => "dead",
        }
    }
}

/// One outbox row, as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The message's stable id.
    pub message_id: String,
    /// The scope it was enqueued under (empty if none was given).
    pub scope: String,
    /// The idempotency key it was enqueued under, for messages of a claim.
    pub parent_key: Option<String>,
    /// The step naming this kind of message.
    pub step: String,
    /// The sink's name.
    pub sink: String,
    /// The destination within the sink.
    pub destination: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// Pending, sent or dead.
    pub state: MessageState,
    /// Delivery attempts so far.
    pub attempts: u32,
    /// Attempts allowed before `dead`.
    pub max_attempts: u32,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// What the receiver handed back on delivery.
    pub receipt: Option<String>,
    /// The payload's media type.
    pub content_type: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// When it was enqueued, in Unix milliseconds.
    pub created_at_ms: i64,
}

/// A leased row, as the relay works on it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub row: i64,
    pub token: i64,
    pub max_attempts: u32,
    pub sink: String,
    pub message: OutgoingMessage,
    /// When it was enqueued, in Unix milliseconds.
    pub created_at_ms: i64,
}

/// How a leased row ends its attempt.
#[derive(Debug, Clone)]
pub enum Settlement {
    Sent { receipt: Option<String> },
    Retry { after: Duration, error: String },
    Dead { error: String },
}

/// Who enqueued an existing message: its scope, parent key and step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scope: String,
    pub parent_key: Option<String>,
    pub step: String,
}

/// How many messages wait, how long the oldest has waited, and how many
/// are dead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Messages not yet delivered (leased ones included).
    pub pending: u64,
    /// Dead messages waiting for an operator.
    pub dead: u64,
    /// How long ago the oldest pending message was enqueued; `None` when
    /// nothing is pending.
    pub oldest_pending: Option<Duration>,
    /// Ordering keys whose oldest unsent message is dead while later messages
    /// with the same key wait behind it: they stay stuck until an operator
    /// requeues or skips the dead one.
    pub blocked_ordering_keys: u64,
}

pub(crate) fn backlog_from_row<R>(row: &R) -> Backlog
where
    R: sqlx::Row,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Backlog {
        pending: row.get::<i64, _>("pending").max(0) as u64,
        dead: row.get::<i64, _>("dead").max(0) as u64,
        oldest_pending: row
            .get::<Option<i64>, _>("oldest_ms")
            .map(|ms| Duration::from_millis(ms.max(0) as u64)),
        blocked_ordering_keys: row.get::<i64, _>("blocked").max(0) as u64,
    }
}

/// The ordering keys a dead message blocks, as SQL both backends run.
pub(crate) const BLOCKED_KEYS: &str = "(SELECT count(DISTINCT d.ordering_key) FROM idem_outbox d \
     WHERE d.state = 'dead' AND d.ordering_key IS NOT NULL \
       AND NOT EXISTS (SELECT 1 FROM idem_outbox e WHERE e.ordering_key = d.ordering_key \
         AND e.state <> 'sent' AND e.id < d.id) \
       AND EXISTS (SELECT 1 FROM idem_outbox p WHERE p.ordering_key = d.ordering_key \
         AND p.state = 'pending' AND p.id > d.id))";

/// What a backend does for the outbox and its relay. Part of the sealed
/// [`Backend`](super::Backend).
pub trait Outbox: sqlx::Database + Sized {
    /// Inserts the message (its checked `id` and `step`) unless its id
    /// exists; `None` if it inserted, else who enqueued the existing one.
    /// With `notify`, a backend that has notifications sends one on
    /// [`NOTIFY_CHANNEL`] in the same transaction.
    fn insert_message<'a>(
        conn: &'a mut Self::Connection,
        id: &'a str,
        step: &'static str,
        message: &'a Message,
        notify: bool,
    ) -> impl Future<Output = Result<Option<Origin>, sqlx::Error>> + Send + 'a;

    /// Leases up to `batch` due messages for the sinks named in `sinks`.
    fn lease_messages<'a>(
        pool: &'a Pool<Self>,
        sinks: &'a [String],
        owner: &'a str,
        lease: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<Vec<Claimed>, sqlx::Error>> + Send + 'a;

    /// Ends the attempt `token` on `row`; `false` if the lease was lost (fenced).
    fn settle_message<'a>(
        pool: &'a Pool<Self>,
        row: i64,
        token: i64,
        settlement: &'a Settlement,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Marks the delivered rows `(row, token, receipt)` sent in one
    /// statement, each still conditioned on its own lease token; returns the
    /// rows it marked (the others were fenced).
    fn settle_sent<'a>(
        pool: &'a Pool<Self>,
        sent: &'a [(i64, i64, Option<String>)],
    ) -> impl Future<Output = Result<Vec<i64>, sqlx::Error>> + Send + 'a;

    /// Frees the leases `owner` still holds.
    fn release_leases<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Dead → pending, due now, attempts reset.
    fn requeue_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Unsent → sent with the receipt `skipped`.
    fn skip_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// One row by message id.
    fn message_entry<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<OutboxEntry>, sqlx::Error>> + Send + 'a;

    /// The rows of one operation.
    fn message_entries<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        parent_key: &'a str,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, sqlx::Error>> + Send + 'a;

    /// Dead rows, oldest first.
    fn dead_messages(
        pool: &Pool<Self>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, sqlx::Error>> + Send + '_;

    /// Pending and dead counts, the oldest pending age, blocked ordering keys.
    fn outbox_backlog(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Backlog, sqlx::Error>> + Send + '_;

    /// Up to `limit` rows, in `state` if given, newest first.
    fn list_messages(
        pool: &Pool<Self>,
        state: Option<MessageState>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, sqlx::Error>> + Send + '_;

    /// Calls `wake` on each notification of [`NOTIFY_CHANNEL`] until an
    /// error; returns `Ok` at once where the backend has no notifications.
    fn listen_for_enqueues(
        pool: &Pool<Self>,
        wake: fn(),
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

    /// Deletes up to `batch` sent rows older than `retention`.
    fn purge_sent_messages(
        pool: &Pool<Self>,
        retention: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;
}

/// The Postgres channel enqueues notify and relays listen on
/// ([`notify_other_processes`](crate::outbox::notify_other_processes),
/// [`Relay::listen`](crate::outbox::Relay::listen)).
pub const NOTIFY_CHANNEL: &str = "idem_outbox";

/// Who enqueued the message with id `$1`.
pub(crate) const ORIGIN_BY_ID: &str =
    "SELECT scope, parent_key, step FROM idem_outbox WHERE message_id = $1";

/// The operators' reads of the outbox, the same statements on every backend
/// but for the columns (`$columns`, in [`entry_from_row`]'s order): expands
/// to those methods of [`Outbox`].
macro_rules! outbox_reads {
    (columns: $columns:expr) => {
        async fn message_entry<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<Option<OutboxEntry>, sqlx::Error> {
            let sql = format!("SELECT {} FROM idem_outbox WHERE message_id = $1", $columns);
            let row = sqlx::query(&sql)
                .bind(message_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(entry_from_row))
        }

        async fn message_entries<'a>(
            pool: &'a Pool<Self>,
            scope: &'a str,
            parent_key: &'a str,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_outbox WHERE scope = $1 AND parent_key = $2 ORDER BY id",
                $columns
            );
            let rows = sqlx::query(&sql)
                .bind(scope)
                .bind(parent_key)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn dead_messages(
            pool: &Pool<Self>,
            limit: u32,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_outbox WHERE state = 'dead' ORDER BY id LIMIT $1",
                $columns
            );
            let rows = sqlx::query(&sql)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn list_messages(
            pool: &Pool<Self>,
            state: Option<MessageState>,
            limit: u32,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_outbox WHERE (CAST($1 AS TEXT) IS NULL OR state = $1) \
                 ORDER BY id DESC LIMIT $2",
                $columns
            );
            let rows = sqlx::query(&sql)
                .bind(state.map(MessageState::as_str))
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }
    };
}
pub(crate) use outbox_reads;

/// The origin of an existing message, from a row of [`ORIGIN_BY_ID`].
pub(crate) fn origin_from_row<R>(row: &R) -> Origin
where
    R: sqlx::Row,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Origin {
        scope: row.get("scope"),
        parent_key: row.get("parent_key"),
        step: row.get("step"),
    }
}

pub(crate) fn headers_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).expect("string pairs serialize")
}

pub(crate) fn headers_from_json(text: &str) -> Vec<(String, String)> {
    serde_json::from_str(text).unwrap_or_default()
}

pub(crate) fn count(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

pub(crate) fn entry_from_row<R>(row: &R) -> OutboxEntry
where
    R: sqlx::Row,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = row.get("state");
    OutboxEntry {
        message_id: row.get("message_id"),
        scope: row.get("scope"),
        parent_key: row.get("parent_key"),
        step: row.get("step"),
        sink: row.get("sink"),
        destination: row.get("destination"),
        ordering_key: row.get("ordering_key"),
        state: MessageState::parse(&state),
        attempts: count(row.get("attempts")),
        max_attempts: count(row.get("max_attempts")),
        last_error: row.get("last_error"),
        receipt: row.get("receipt"),
        content_type: row.get("content_type"),
        payload: row.get("payload"),
        created_at_ms: row.get("created_at_ms"),
    }
}

pub(crate) fn claimed_from_row<R>(row: &R) -> Claimed
where
    R: sqlx::Row,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let headers: String = row.get("headers");
    Claimed {
        row: row.get("id"),
        token: row.get("lease_token"),
        max_attempts: count(row.get("max_attempts")),
        sink: row.get("sink"),
        message: OutgoingMessage {
            id: row.get("message_id"),
            step: row.get("step"),
            destination: row.get("destination"),
            ordering_key: row.get("ordering_key"),
            headers: headers_from_json(&headers),
            content_type: row.get("content_type"),
            payload: row.get("payload"),
            attempt: count(row.get("attempts")),
        },
        created_at_ms: row.get("created_at_ms"),
    }
}
