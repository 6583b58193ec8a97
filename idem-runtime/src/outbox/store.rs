//! The outbox table's SQL, per backend.
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

use super::sink::OutgoingMessage;
use super::Message;
use crate::store::Backend;

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
    fn parse(text: &str) -> Self {
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
#[doc(hidden)]
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
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum Settlement {
    Sent { receipt: Option<String> },
    Retry { after: Duration, error: String },
    Dead { error: String },
}

/// Who enqueued an existing message: its scope, parent key and step.
#[doc(hidden)]
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

fn backlog_from_row<R>(row: &R) -> Backlog
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
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const BLOCKED_KEYS: &str = "(SELECT count(DISTINCT d.ordering_key) FROM idem_outbox d \
     WHERE d.state = 'dead' AND d.ordering_key IS NOT NULL \
       AND NOT EXISTS (SELECT 1 FROM idem_outbox e WHERE e.ordering_key = d.ordering_key \
         AND e.state <> 'sent' AND e.id < d.id) \
       AND EXISTS (SELECT 1 FROM idem_outbox p WHERE p.ordering_key = d.ordering_key \
         AND p.state = 'pending' AND p.id > d.id))";

/// A connection [`enqueue`](super::enqueue) can write to: `SqliteConnection`
/// and `PgConnection` (what a claim's transaction dereferences to).
pub trait OutboxConnection: Send {
    /// Inserts the message unless its id exists; `None` if it inserted,
    /// else who enqueued the existing one.
    #[doc(hidden)]
    fn insert_message<'a>(
        &'a mut self,
        id: &'a str,
        step: &'static str,
        message: &'a Message,
    ) -> impl Future<Output = Result<Option<Origin>, sqlx::Error>> + Send + 'a;
}

/// A database the outbox and its relay run on: [`sqlx::Sqlite`] and
/// [`sqlx::Postgres`]. The methods are the relay's, not an application's.
pub trait OutboxStore: Backend {
    /// Leases up to `batch` due messages for the sinks named in `sinks`.
    #[doc(hidden)]
    fn claim<'a>(
        pool: &'a Pool<Self>,
        sinks: &'a [String],
        owner: &'a str,
        lease: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<Vec<Claimed>, sqlx::Error>> + Send + 'a;

    /// Ends the attempt `token` on `row`; `false` if the lease was lost (fenced).
    #[doc(hidden)]
    fn settle<'a>(
        pool: &'a Pool<Self>,
        row: i64,
        token: i64,
        settlement: &'a Settlement,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Marks the delivered rows `(row, token, receipt)` sent in one
    /// statement, each still conditioned on its own lease token; returns the
    /// rows it marked (the others were fenced).
    #[doc(hidden)]
    fn settle_sent<'a>(
        pool: &'a Pool<Self>,
        sent: &'a [(i64, i64, Option<String>)],
    ) -> impl Future<Output = Result<Vec<i64>, sqlx::Error>> + Send + 'a;

    /// Frees the leases `owner` still holds.
    #[doc(hidden)]
    fn release<'a>(
        pool: &'a Pool<Self>,
        owner: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Dead → pending, due now, attempts reset.
    #[doc(hidden)]
    fn requeue<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Unsent → sent with the receipt `skipped`.
    #[doc(hidden)]
    fn skip<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// One row by message id.
    #[doc(hidden)]
    fn entry<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<OutboxEntry>, sqlx::Error>> + Send + 'a;

    /// The rows of one operation.
    #[doc(hidden)]
    fn entries_for<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        parent_key: &'a str,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, sqlx::Error>> + Send + 'a;

    /// Dead rows, oldest first.
    #[doc(hidden)]
    fn dead(
        pool: &Pool<Self>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, sqlx::Error>> + Send + '_;

    /// Pending and dead counts, the oldest pending age, blocked ordering keys.
    #[doc(hidden)]
    fn backlog(pool: &Pool<Self>)
        -> impl Future<Output = Result<Backlog, sqlx::Error>> + Send + '_;

    /// Up to `limit` rows, in `state` if given, newest first.
    #[doc(hidden)]
    fn list(
        pool: &Pool<Self>,
        state: Option<MessageState>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, sqlx::Error>> + Send + '_;

    /// Wakes this process's relays on each notification of
    /// [`NOTIFY_CHANNEL`](super::NOTIFY_CHANNEL) until an error; returns
    /// `Ok` at once where the backend has no notifications.
    #[doc(hidden)]
    fn listen(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

    /// Deletes up to `batch` sent rows older than `retention`.
    #[doc(hidden)]
    fn purge_sent(
        pool: &Pool<Self>,
        retention: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;
}

fn headers_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).expect("string pairs serialize")
}

fn headers_from_json(text: &str) -> Vec<(String, String)> {
    serde_json::from_str(text).unwrap_or_default()
}

fn count(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The columns the operator views read, in [`entry_from_row`]'s order.
#[cfg(feature = "sqlite")]
macro_rules! entry_columns {
    () => {
        "message_id, scope, parent_key, step, sink, destination, ordering_key, state, \
         attempts, max_attempts, last_error, receipt, content_type, payload, \
         created_at AS created_at_ms"
    };
}

fn entry_from_row<R>(row: &R) -> OutboxEntry
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

fn claimed_from_row<R>(row: &R) -> Claimed
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

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use sqlx::{Pool, Row, Sqlite, SqliteConnection, Transaction};

    use super::*;

    fn now_ms() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(millis)
            .unwrap_or(0)
    }

    impl OutboxConnection for SqliteConnection {
        async fn insert_message<'a>(
            &'a mut self,
            id: &'a str,
            step: &'static str,
            message: &'a Message,
        ) -> Result<Option<Origin>, sqlx::Error> {
            let now = now_ms();
            let done = sqlx::query(
                "INSERT INTO idem_outbox (message_id, scope, parent_key, step, sink, destination, \
                 ordering_key, headers, payload, content_type, max_attempts, available_at, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(id)
            .bind(&message.scope)
            .bind(message.parent_key.as_deref())
            .bind(step)
            .bind(&message.sink)
            .bind(&message.destination)
            .bind(message.ordering_key.as_deref())
            .bind(headers_json(&message.headers))
            .bind(&message.payload)
            .bind(&message.content_type)
            .bind(i64::from(message.max_attempts))
            .bind(now)
            .bind(now)
            .execute(&mut *self)
            .await?;
            if done.rows_affected() == 1 {
                return Ok(None);
            }
            let row =
                sqlx::query("SELECT scope, parent_key, step FROM idem_outbox WHERE message_id = ?")
                    .bind(id)
                    .fetch_one(&mut *self)
                    .await?;
            Ok(Some(Origin {
                scope: row.get("scope"),
                parent_key: row.get("parent_key"),
                step: row.get("step"),
            }))
        }
    }

    impl OutboxStore for Sqlite {
        async fn claim<'a>(
            pool: &'a Pool<Self>,
            sinks: &'a [String],
            owner: &'a str,
            lease: Duration,
            batch: u32,
        ) -> Result<Vec<Claimed>, sqlx::Error> {
            let conn = pool.acquire().await?;
            let mut tx = Transaction::begin(conn, Some("BEGIN IMMEDIATE".into())).await?;
            let now = now_ms();
            let rows = sqlx::query(
                "UPDATE idem_outbox SET lease_until = ?1 + ?2, lease_owner = ?3, \
                 lease_token = lease_token + 1, attempts = attempts + 1 \
                 WHERE id IN (SELECT o.id FROM idem_outbox o \
                   WHERE o.state = 'pending' AND o.available_at <= ?1 \
                     AND (o.lease_until IS NULL OR o.lease_until <= ?1) \
                     AND o.sink IN (SELECT value FROM json_each(?4)) \
                     AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idem_outbox p \
                       WHERE p.ordering_key = o.ordering_key AND p.state <> 'sent' AND p.id < o.id)) \
                   ORDER BY o.id LIMIT ?5) \
                 RETURNING id, lease_token, max_attempts, sink, message_id, step, destination, \
                   ordering_key, headers, content_type, payload, attempts, created_at AS created_at_ms",
            )
            .bind(now)
            .bind(millis(lease))
            .bind(owner)
            .bind(serde_json::to_string(sinks).expect("names serialize"))
            .bind(i64::from(batch))
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            let mut claimed: Vec<Claimed> = rows.iter().map(claimed_from_row).collect();
            claimed.sort_by_key(|c| c.row);
            Ok(claimed)
        }

        async fn settle<'a>(
            pool: &'a Pool<Self>,
            row: i64,
            token: i64,
            settlement: &'a Settlement,
        ) -> Result<bool, sqlx::Error> {
            let now = now_ms();
            let query = match settlement {
                Settlement::Sent { receipt } => sqlx::query(
                    "UPDATE idem_outbox SET state = 'sent', sent_at = ?3, receipt = ?4, \
                     lease_until = NULL, lease_owner = NULL \
                     WHERE id = ?1 AND lease_token = ?2 AND state = 'pending'",
                )
                .bind(row)
                .bind(token)
                .bind(now)
                .bind(receipt.as_deref()),
                Settlement::Retry { after, error } => sqlx::query(
                    "UPDATE idem_outbox SET available_at = ?3, last_error = ?4, \
                     lease_until = NULL, lease_owner = NULL \
                     WHERE id = ?1 AND lease_token = ?2 AND state = 'pending'",
                )
                .bind(row)
                .bind(token)
                .bind(now.saturating_add(millis(*after)))
                .bind(error.as_str()),
                Settlement::Dead { error } => sqlx::query(
                    "UPDATE idem_outbox SET state = 'dead', last_error = ?3, \
                     lease_until = NULL, lease_owner = NULL \
                     WHERE id = ?1 AND lease_token = ?2 AND state = 'pending'",
                )
                .bind(row)
                .bind(token)
                .bind(error.as_str()),
            };
            let done = query.execute(pool).await?;
            Ok(done.rows_affected() == 1)
        }

        async fn settle_sent<'a>(
            pool: &'a Pool<Self>,
            sent: &'a [(i64, i64, Option<String>)],
        ) -> Result<Vec<i64>, sqlx::Error> {
            if sent.is_empty() {
                return Ok(Vec::new());
            }
            let rows = serde_json::to_string(sent).expect("ids, tokens and receipts serialize");
            sqlx::query_scalar(
                "UPDATE idem_outbox SET state = 'sent', sent_at = ?1, receipt = s.receipt, \
                 lease_until = NULL, lease_owner = NULL \
                 FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token, \
                         json_extract(value, '$[2]') AS receipt FROM json_each(?2)) AS s \
                 WHERE idem_outbox.id = s.id AND idem_outbox.lease_token = s.token \
                   AND idem_outbox.state = 'pending' \
                 RETURNING idem_outbox.id",
            )
            .bind(now_ms())
            .bind(rows)
            .fetch_all(pool)
            .await
        }

        async fn release<'a>(pool: &'a Pool<Self>, owner: &'a str) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(
                "UPDATE idem_outbox SET lease_until = NULL, lease_owner = NULL, \
                 attempts = max(attempts - 1, 0) \
                 WHERE lease_owner = ? AND state = 'pending' AND lease_until > ?",
            )
            .bind(owner)
            .bind(now_ms())
            .execute(pool)
            .await?;
            Ok(done.rows_affected())
        }

        async fn requeue<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(
                "UPDATE idem_outbox SET state = 'pending', attempts = 0, available_at = ?, \
                 lease_until = NULL, lease_owner = NULL WHERE message_id = ? AND state = 'dead'",
            )
            .bind(now_ms())
            .bind(message_id)
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn skip<'a>(pool: &'a Pool<Self>, message_id: &'a str) -> Result<bool, sqlx::Error> {
            // Bumping the token fences a relay that holds the row right now.
            let done = sqlx::query(
                "UPDATE idem_outbox SET state = 'sent', receipt = 'skipped', sent_at = ?, \
                 lease_until = NULL, lease_owner = NULL, lease_token = lease_token + 1 \
                 WHERE message_id = ? AND state <> 'sent'",
            )
            .bind(now_ms())
            .bind(message_id)
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn entry<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<Option<OutboxEntry>, sqlx::Error> {
            let row = sqlx::query(concat!(
                "SELECT ",
                entry_columns!(),
                " FROM idem_outbox WHERE message_id = ?"
            ))
            .bind(message_id)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(entry_from_row))
        }

        async fn entries_for<'a>(
            pool: &'a Pool<Self>,
            scope: &'a str,
            parent_key: &'a str,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                entry_columns!(),
                " FROM idem_outbox WHERE scope = ? AND parent_key = ? ORDER BY id"
            ))
            .bind(scope)
            .bind(parent_key)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn dead(pool: &Pool<Self>, limit: u32) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                entry_columns!(),
                " FROM idem_outbox WHERE state = 'dead' ORDER BY id LIMIT ?"
            ))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn listen(_pool: &Pool<Self>) -> Result<(), sqlx::Error> {
            Ok(())
        }

        async fn backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
            let sql = format!(
                "SELECT coalesce(sum(state = 'pending'), 0) AS pending, \
                 coalesce(sum(state = 'dead'), 0) AS dead, \
                 ?1 - min(CASE WHEN state = 'pending' THEN created_at END) AS oldest_ms, \
                 {BLOCKED_KEYS} AS blocked FROM idem_outbox WHERE state <> 'sent'"
            );
            let row = sqlx::query(&sql).bind(now_ms()).fetch_one(pool).await?;
            Ok(backlog_from_row(&row))
        }

        async fn list(
            pool: &Pool<Self>,
            state: Option<MessageState>,
            limit: u32,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                entry_columns!(),
                " FROM idem_outbox WHERE (?1 IS NULL OR state = ?1) ORDER BY id DESC LIMIT ?2"
            ))
            .bind(state.map(MessageState::as_str))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn purge_sent(
            pool: &Pool<Self>,
            retention: Duration,
            batch: u32,
        ) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(
                "DELETE FROM idem_outbox WHERE id IN (SELECT id FROM idem_outbox \
                 WHERE state = 'sent' AND sent_at < ? ORDER BY sent_at LIMIT ?)",
            )
            .bind(now_ms().saturating_sub(millis(retention)))
            .bind(i64::from(batch))
            .execute(pool)
            .await?;
            Ok(done.rows_affected())
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use sqlx::{PgConnection, Pool, Postgres, Row};

    use super::*;

    /// `$n` milliseconds as an interval.
    macro_rules! ms {
        ($n:literal) => {
            concat!("(", $n, "::float8 * interval '1 millisecond')")
        };
    }

    impl OutboxConnection for PgConnection {
        async fn insert_message<'a>(
            &'a mut self,
            id: &'a str,
            step: &'static str,
            message: &'a Message,
        ) -> Result<Option<Origin>, sqlx::Error> {
            let done = sqlx::query(
                "INSERT INTO idem_outbox (message_id, scope, parent_key, step, sink, destination, \
                 ordering_key, headers, payload, content_type, max_attempts) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11) \
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(id)
            .bind(&message.scope)
            .bind(message.parent_key.as_deref())
            .bind(step)
            .bind(&message.sink)
            .bind(&message.destination)
            .bind(message.ordering_key.as_deref())
            .bind(headers_json(&message.headers))
            .bind(&message.payload)
            .bind(&message.content_type)
            .bind(i32::try_from(message.max_attempts).unwrap_or(i32::MAX))
            .execute(&mut *self)
            .await?;
            if done.rows_affected() == 1 {
                if super::super::should_notify() {
                    // Delivered by Postgres at commit, dropped on rollback.
                    sqlx::query("SELECT pg_notify($1, '')")
                        .bind(super::super::NOTIFY_CHANNEL)
                        .execute(&mut *self)
                        .await?;
                }
                return Ok(None);
            }
            let row = sqlx::query(
                "SELECT scope, parent_key, step FROM idem_outbox WHERE message_id = $1",
            )
            .bind(id)
            .fetch_one(&mut *self)
            .await?;
            Ok(Some(Origin {
                scope: row.get("scope"),
                parent_key: row.get("parent_key"),
                step: row.get("step"),
            }))
        }
    }

    /// The Postgres columns as the shared decoders expect them (ints as int8,
    /// headers as text).
    macro_rules! pg_entry_columns {
        ($prefix:literal) => {
            concat!(
                $prefix,
                "message_id, ",
                $prefix,
                "scope, ",
                $prefix,
                "parent_key, ",
                $prefix,
                "step, ",
                $prefix,
                "sink, ",
                $prefix,
                "destination, ",
                $prefix,
                "ordering_key, ",
                $prefix,
                "state, ",
                $prefix,
                "attempts::int8 AS attempts, ",
                $prefix,
                "max_attempts::int8 AS max_attempts, ",
                $prefix,
                "last_error, ",
                $prefix,
                "receipt, ",
                $prefix,
                "content_type, ",
                $prefix,
                "payload, (extract(epoch FROM ",
                $prefix,
                "created_at) * 1000)::int8 AS created_at_ms"
            )
        };
    }

    impl OutboxStore for Postgres {
        async fn claim<'a>(
            pool: &'a Pool<Self>,
            sinks: &'a [String],
            owner: &'a str,
            lease: Duration,
            batch: u32,
        ) -> Result<Vec<Claimed>, sqlx::Error> {
            // The claim is a function (migration 20261207000001): it keeps
            // the planner to a plain index scan in id order.
            let rows = sqlx::query(
                "SELECT id, lease_token, max_attempts::int8 AS max_attempts, sink, \
                   message_id, step, destination, ordering_key, headers::text AS headers, \
                   content_type, payload, attempts::int8 AS attempts, \
                   (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms \
                 FROM idem_outbox_claim($1, $2, $3, $4)",
            )
            .bind(sinks)
            .bind(i64::from(batch))
            .bind(millis(lease) as f64)
            .bind(owner)
            .fetch_all(pool)
            .await?;
            let mut claimed: Vec<Claimed> = rows.iter().map(claimed_from_row).collect();
            claimed.sort_by_key(|c| c.row);
            Ok(claimed)
        }

        async fn settle<'a>(
            pool: &'a Pool<Self>,
            row: i64,
            token: i64,
            settlement: &'a Settlement,
        ) -> Result<bool, sqlx::Error> {
            let query = match settlement {
                Settlement::Sent { receipt } => sqlx::query(
                    "UPDATE idem_outbox SET state = 'sent', sent_at = now(), receipt = $3, \
                     lease_until = NULL, lease_owner = NULL \
                     WHERE id = $1 AND lease_token = $2 AND state = 'pending'",
                )
                .bind(row)
                .bind(token)
                .bind(receipt.as_deref()),
                Settlement::Retry { after, error } => sqlx::query(concat!(
                    "UPDATE idem_outbox SET available_at = now() + ",
                    ms!("$3"),
                    ", last_error = $4, lease_until = NULL, lease_owner = NULL \
                     WHERE id = $1 AND lease_token = $2 AND state = 'pending'"
                ))
                .bind(row)
                .bind(token)
                .bind(millis(*after) as f64)
                .bind(error.as_str()),
                Settlement::Dead { error } => sqlx::query(
                    "UPDATE idem_outbox SET state = 'dead', last_error = $3, \
                     lease_until = NULL, lease_owner = NULL \
                     WHERE id = $1 AND lease_token = $2 AND state = 'pending'",
                )
                .bind(row)
                .bind(token)
                .bind(error.as_str()),
            };
            let done = query.execute(pool).await?;
            Ok(done.rows_affected() == 1)
        }

        async fn settle_sent<'a>(
            pool: &'a Pool<Self>,
            sent: &'a [(i64, i64, Option<String>)],
        ) -> Result<Vec<i64>, sqlx::Error> {
            if sent.is_empty() {
                return Ok(Vec::new());
            }
            let rows: Vec<i64> = sent.iter().map(|s| s.0).collect();
            let tokens: Vec<i64> = sent.iter().map(|s| s.1).collect();
            let receipts: Vec<Option<&str>> = sent.iter().map(|s| s.2.as_deref()).collect();
            sqlx::query_scalar(
                "UPDATE idem_outbox o SET state = 'sent', sent_at = now(), receipt = s.receipt, \
                 lease_until = NULL, lease_owner = NULL \
                 FROM unnest($1::int8[], $2::int8[], $3::text[]) AS s(id, token, receipt) \
                 WHERE o.id = s.id AND o.lease_token = s.token AND o.state = 'pending' \
                 RETURNING o.id",
            )
            .bind(rows)
            .bind(tokens)
            .bind(receipts)
            .fetch_all(pool)
            .await
        }

        async fn release<'a>(pool: &'a Pool<Self>, owner: &'a str) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(
                "UPDATE idem_outbox SET lease_until = NULL, lease_owner = NULL, \
                 attempts = greatest(attempts - 1, 0) \
                 WHERE lease_owner = $1 AND state = 'pending' AND lease_until > now()",
            )
            .bind(owner)
            .execute(pool)
            .await?;
            Ok(done.rows_affected())
        }

        async fn requeue<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(
                "UPDATE idem_outbox SET state = 'pending', attempts = 0, available_at = now(), \
                 lease_until = NULL, lease_owner = NULL WHERE message_id = $1 AND state = 'dead'",
            )
            .bind(message_id)
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn skip<'a>(pool: &'a Pool<Self>, message_id: &'a str) -> Result<bool, sqlx::Error> {
            // Bumping the token fences a relay that holds the row right now.
            let done = sqlx::query(
                "UPDATE idem_outbox SET state = 'sent', receipt = 'skipped', sent_at = now(), \
                 lease_until = NULL, lease_owner = NULL, lease_token = lease_token + 1 \
                 WHERE message_id = $1 AND state <> 'sent'",
            )
            .bind(message_id)
            .execute(pool)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn entry<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<Option<OutboxEntry>, sqlx::Error> {
            let row = sqlx::query(concat!(
                "SELECT ",
                pg_entry_columns!(""),
                " FROM idem_outbox WHERE message_id = $1"
            ))
            .bind(message_id)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(entry_from_row))
        }

        async fn entries_for<'a>(
            pool: &'a Pool<Self>,
            scope: &'a str,
            parent_key: &'a str,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                pg_entry_columns!(""),
                " FROM idem_outbox WHERE scope = $1 AND parent_key = $2 ORDER BY id"
            ))
            .bind(scope)
            .bind(parent_key)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn dead(pool: &Pool<Self>, limit: u32) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                pg_entry_columns!(""),
                " FROM idem_outbox WHERE state = 'dead' ORDER BY id LIMIT $1"
            ))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn listen(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
            let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
            listener.listen(super::super::NOTIFY_CHANNEL).await?;
            loop {
                listener.recv().await?;
                super::super::wake_relays();
            }
        }

        async fn backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
            let sql = format!(
                "SELECT count(*) FILTER (WHERE state = 'pending') AS pending, \
                 count(*) FILTER (WHERE state = 'dead') AS dead, \
                 (extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending')) \
                   * 1000)::int8 AS oldest_ms, \
                 {BLOCKED_KEYS} AS blocked FROM idem_outbox WHERE state <> 'sent'"
            );
            let row = sqlx::query(&sql).fetch_one(pool).await?;
            Ok(backlog_from_row(&row))
        }

        async fn list(
            pool: &Pool<Self>,
            state: Option<MessageState>,
            limit: u32,
        ) -> Result<Vec<OutboxEntry>, sqlx::Error> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                pg_entry_columns!(""),
                " FROM idem_outbox WHERE ($1::text IS NULL OR state = $1) ORDER BY id DESC LIMIT $2"
            ))
            .bind(state.map(MessageState::as_str))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(entry_from_row).collect())
        }

        async fn purge_sent(
            pool: &Pool<Self>,
            retention: Duration,
            batch: u32,
        ) -> Result<u64, sqlx::Error> {
            let done = sqlx::query(concat!(
                "DELETE FROM idem_outbox WHERE id IN (SELECT id FROM idem_outbox \
                 WHERE state = 'sent' AND sent_at < now() - ",
                ms!("$1"),
                " ORDER BY sent_at LIMIT $2)"
            ))
            .bind(millis(retention) as f64)
            .bind(i64::from(batch))
            .execute(pool)
            .await?;
            Ok(done.rows_affected())
        }
    }
}
