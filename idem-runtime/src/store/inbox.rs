//! The inbox's poison rows: their types, the statements each backend
//! implements, and the reads every backend shares. The rejection record that
//! stops a poisoned message from running again is a key record, written
//! through [`Keys`](super::keys::Keys).

use std::future::Future;
use std::time::Duration;

use sqlx::Pool;

use crate::operation::Operation;
use crate::outcome::StoredResponse;

/// A message the consumer gave up on, as kept in `idem_poison`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoisonMessage {
    /// The consumer that gave up.
    pub consumer: String,
    /// The publisher's message id.
    pub message_id: String,
    /// Where the message came from (a subject, a sender), if known.
    pub source: Option<String>,
    /// The transport's sequence of the last delivery (for operators only;
    /// never used to deduplicate).
    pub source_seq: Option<i64>,
    /// The payload, byte for byte.
    pub payload: Vec<u8>,
    /// Why the consumer gave up.
    pub error: String,
    /// How many deliveries the transport had made when it gave up.
    pub deliveries: i64,
    /// `poison`, or `requeued` once an operator sent it back.
    pub state: String,
    /// How many times it was requeued.
    pub requeues: i64,
    /// When it was first poisoned, in Unix milliseconds.
    pub first_seen_ms: i64,
    /// When it was last poisoned, in Unix milliseconds.
    pub poisoned_at_ms: i64,
}

/// A poison row to write.
#[derive(Debug, Clone, Copy)]
pub struct NewPoison<'a> {
    /// The consumer.
    pub consumer: &'a str,
    /// The publisher's message id.
    pub message_id: &'a str,
    /// Where the message came from.
    pub source: Option<&'a str>,
    /// The transport's sequence.
    pub source_seq: Option<i64>,
    /// The payload.
    pub payload: &'a [u8],
    /// Why the consumer gave up.
    pub error: &'a str,
    /// Deliveries so far.
    pub deliveries: i64,
}

/// The status a rejection record carries: a deterministic refusal, replayed
/// (and so re-poisoned) if the message id comes back.
pub(crate) const REJECTED_STATUS: u16 = 422;

/// What a backend does for the inbox. Part of the sealed
/// [`Backend`](super::Backend).
pub trait Inbox: super::keys::Keys {
    /// Writes (or refreshes) a poison row, and the rejection record for `op`
    /// if `reject` is set and the key has no record yet, in one transaction.
    fn record_poison<'a>(
        pool: &'a Pool<Self>,
        poison: NewPoison<'a>,
        reject: Option<(&'a Operation, Duration)>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// The consumer's rows in state `poison`, oldest first.
    fn poisoned<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
    ) -> impl Future<Output = Result<Vec<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// Up to `limit` rows in state `poison`, of every consumer or of
    /// `consumer`, oldest first.
    fn poisoned_any<'a>(
        pool: &'a Pool<Self>,
        consumer: Option<&'a str>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// The rows of `message_id`, of every consumer, whatever their state.
    fn poison_for_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Vec<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// One row, whatever its state.
    fn poison_entry<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// Marks the row `requeued` and deletes the key's record (the stored
    /// rejection), in one transaction; `None` if there is no such row.
    fn requeue_poison<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<PoisonMessage>, sqlx::Error>> + Send + 'a;
}

/// The rejection record's stored response: a deterministic refusal carrying
/// why the consumer gave up.
pub(crate) fn rejection(error: &str) -> StoredResponse {
    StoredResponse {
        status: REJECTED_STATUS,
        content_type: "application/json".to_owned(),
        body: serde_json::to_vec(&serde_json::json!({ "poison": error })).unwrap_or_default(),
        headers: Vec::new(),
    }
}

/// Decodes a row of the backend's poison columns (in [`PoisonMessage`]'s
/// field order, ints as `BIGINT`, times as Unix milliseconds).
pub(crate) fn poison_from_row<R>(row: &R) -> Result<PoisonMessage, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(PoisonMessage {
        consumer: row.try_get(0)?,
        message_id: row.try_get(1)?,
        source: row.try_get(2)?,
        source_seq: row.try_get(3)?,
        payload: row.try_get(4)?,
        error: row.try_get(5)?,
        deliveries: row.try_get(6)?,
        state: row.try_get(7)?,
        requeues: row.try_get(8)?,
        first_seen_ms: row.try_get(9)?,
        poisoned_at_ms: row.try_get(10)?,
    })
}

/// The inbox's reads, the same statements on every backend but for the
/// columns (`$columns`, in [`poison_from_row`]'s order): expands to those
/// methods of [`Inbox`].
macro_rules! inbox_reads {
    (columns: $columns:expr) => {
        async fn poisoned<'a>(
            pool: &'a Pool<Self>,
            consumer: &'a str,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_poison WHERE consumer = $1 AND state = 'poison' \
                 ORDER BY poisoned_at, message_id",
                $columns
            );
            let rows = sqlx::query(&sql).bind(consumer).fetch_all(pool).await?;
            rows.iter().map(poison_from_row).collect()
        }

        async fn poisoned_any<'a>(
            pool: &'a Pool<Self>,
            consumer: Option<&'a str>,
            limit: u32,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_poison WHERE state = 'poison' \
                 AND (CAST($1 AS TEXT) IS NULL OR consumer = $1) \
                 ORDER BY poisoned_at, consumer, message_id LIMIT $2",
                $columns
            );
            let rows = sqlx::query(&sql)
                .bind(consumer)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(poison_from_row).collect()
        }

        async fn poison_for_message<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_poison WHERE message_id = $1 ORDER BY consumer",
                $columns
            );
            let rows = sqlx::query(&sql).bind(message_id).fetch_all(pool).await?;
            rows.iter().map(poison_from_row).collect()
        }

        async fn poison_entry<'a>(
            pool: &'a Pool<Self>,
            consumer: &'a str,
            message_id: &'a str,
        ) -> Result<Option<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {} FROM idem_poison WHERE consumer = $1 AND message_id = $2",
                $columns
            );
            let found = sqlx::query(&sql)
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(pool)
                .await?;
            found.as_ref().map(poison_from_row).transpose()
        }
    };
}
pub(crate) use inbox_reads;
