//! The inbox's own SQL, per backend: poison rows, the rejection record that
//! stops a poisoned message from running again, and the requeue.

use std::future::Future;
use std::time::Duration;

use sqlx::Pool;

use crate::operation::Operation;
use crate::store::Backend;

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
#[doc(hidden)]
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

/// A database the inbox keeps its poison rows in: [`sqlx::Sqlite`] and
/// [`sqlx::Postgres`]. The methods are the inbox's, not an application's.
pub trait InboxBackend: Backend {
    /// Writes (or refreshes) a poison row, and the rejection record for `op`
    /// if `reject` is set and the key has no record yet, in one transaction.
    #[doc(hidden)]
    fn record_poison<'a>(
        pool: &'a Pool<Self>,
        poison: NewPoison<'a>,
        reject: Option<(&'a Operation, Duration)>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// The consumer's rows in state `poison`, oldest first.
    #[doc(hidden)]
    fn poisoned<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
    ) -> impl Future<Output = Result<Vec<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// Up to `limit` rows in state `poison`, of every consumer or of
    /// `consumer`, oldest first.
    #[doc(hidden)]
    fn poisoned_any<'a>(
        pool: &'a Pool<Self>,
        consumer: Option<&'a str>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// The rows of `message_id`, of every consumer, whatever their state.
    #[doc(hidden)]
    fn poison_for_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Vec<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// One row, whatever its state.
    #[doc(hidden)]
    fn poison_entry<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<PoisonMessage>, sqlx::Error>> + Send + 'a;

    /// Marks the row `requeued` and deletes the key's record (the stored
    /// rejection), in one transaction; `None` if there is no such row.
    #[doc(hidden)]
    fn requeue<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<PoisonMessage>, sqlx::Error>> + Send + 'a;
}

fn rejection_body(error: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "poison": error })).unwrap_or_default()
}

fn retention_ms(retention: Duration) -> i64 {
    i64::try_from(retention.as_millis()).unwrap_or(i64::MAX / 2)
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use sqlx::sqlite::SqliteRow;
    use sqlx::{Row, Sqlite};

    fn now_ms() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis() as i64)
            .unwrap_or(0)
    }

    const COLUMNS: &str = "consumer, message_id, source, source_seq, payload, error, deliveries, \
         state, requeues, first_seen, poisoned_at";

    fn row(row: &SqliteRow) -> Result<PoisonMessage, sqlx::Error> {
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

    impl InboxBackend for Sqlite {
        async fn record_poison<'a>(
            pool: &'a Pool<Self>,
            poison: NewPoison<'a>,
            reject: Option<(&'a Operation, Duration)>,
        ) -> Result<(), sqlx::Error> {
            let now = now_ms();
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            if let Some((op, retention)) = reject {
                sqlx::query(
                    "INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, \
                       response_content_type, response_body, created_at, locked_until, expires_at) \
                     VALUES (?1, ?2, ?3, ?4, 'completed', ?5, 'application/json', ?6, ?7, ?7, ?8) \
                     ON CONFLICT (scope, key) DO NOTHING",
                )
                .bind(op.scope().as_stored())
                .bind(op.key().as_str())
                .bind(op.step())
                .bind(&op.fingerprint().0[..])
                .bind(i64::from(REJECTED_STATUS))
                .bind(rejection_body(poison.error))
                .bind(now)
                .bind(now.saturating_add(retention_ms(retention)))
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "INSERT INTO idem_poison (consumer, message_id, source, source_seq, payload, error, \
                   deliveries, first_seen, poisoned_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8) \
                 ON CONFLICT (consumer, message_id) DO UPDATE SET source = excluded.source, \
                   source_seq = excluded.source_seq, payload = excluded.payload, error = excluded.error, \
                   deliveries = excluded.deliveries, state = 'poison', poisoned_at = excluded.poisoned_at",
            )
            .bind(poison.consumer)
            .bind(poison.message_id)
            .bind(poison.source)
            .bind(poison.source_seq)
            .bind(poison.payload)
            .bind(poison.error)
            .bind(poison.deliveries)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        }

        async fn poisoned<'a>(
            pool: &'a Pool<Self>,
            consumer: &'a str,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE consumer = ?1 AND state = 'poison' \
                 ORDER BY poisoned_at, message_id"
            );
            let rows = sqlx::query(&sql).bind(consumer).fetch_all(pool).await?;
            rows.iter().map(row).collect()
        }

        async fn poisoned_any<'a>(
            pool: &'a Pool<Self>,
            consumer: Option<&'a str>,
            limit: u32,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE state = 'poison' \
                 AND (?1 IS NULL OR consumer = ?1) ORDER BY poisoned_at, consumer, message_id LIMIT ?2"
            );
            let rows = sqlx::query(&sql)
                .bind(consumer)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(row).collect()
        }

        async fn poison_for_message<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE message_id = ?1 ORDER BY consumer"
            );
            let rows = sqlx::query(&sql).bind(message_id).fetch_all(pool).await?;
            rows.iter().map(row).collect()
        }

        async fn poison_entry<'a>(
            pool: &'a Pool<Self>,
            consumer: &'a str,
            message_id: &'a str,
        ) -> Result<Option<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE consumer = ?1 AND message_id = ?2"
            );
            let found = sqlx::query(&sql)
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(pool)
                .await?;
            found.as_ref().map(row).transpose()
        }

        async fn requeue<'a>(
            pool: &'a Pool<Self>,
            scope: &'a str,
            consumer: &'a str,
            message_id: &'a str,
        ) -> Result<Option<PoisonMessage>, sqlx::Error> {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            let sql = format!(
                "UPDATE idem_poison SET state = 'requeued', requeues = requeues + 1, requeued_at = ?3 \
                 WHERE consumer = ?1 AND message_id = ?2 RETURNING {COLUMNS}"
            );
            let found = sqlx::query(&sql)
                .bind(consumer)
                .bind(message_id)
                .bind(now_ms())
                .fetch_optional(&mut *tx)
                .await?;
            let Some(found) = found.as_ref().map(row).transpose()? else {
                return Ok(None);
            };
            sqlx::query("DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2")
                .bind(scope)
                .bind(message_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(found))
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use sqlx::postgres::PgRow;
    use sqlx::{Postgres, Row};

    const COLUMNS: &str =
        "consumer, message_id, source, source_seq, payload, error, deliveries::int8, \
         state, requeues::int8, (EXTRACT(EPOCH FROM first_seen) * 1000)::int8, \
         (EXTRACT(EPOCH FROM poisoned_at) * 1000)::int8";

    fn row(row: &PgRow) -> Result<PoisonMessage, sqlx::Error> {
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

    impl InboxBackend for Postgres {
        async fn record_poison<'a>(
            pool: &'a Pool<Self>,
            poison: NewPoison<'a>,
            reject: Option<(&'a Operation, Duration)>,
        ) -> Result<(), sqlx::Error> {
            let mut tx = pool.begin().await?;
            if let Some((op, retention)) = reject {
                sqlx::query(
                    "INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, \
                       response_content_type, response_body, locked_until, expires_at) \
                     VALUES ($1, $2, $3, $4, 'completed', $5, 'application/json', $6, now(), \
                       now() + make_interval(secs => $7::float8 / 1000)) \
                     ON CONFLICT (scope, key) DO NOTHING",
                )
                .bind(op.scope().as_stored())
                .bind(op.key().as_str())
                .bind(op.step())
                .bind(&op.fingerprint().0[..])
                .bind(REJECTED_STATUS as i16)
                .bind(rejection_body(poison.error))
                .bind(retention_ms(retention))
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "INSERT INTO idem_poison (consumer, message_id, source, source_seq, payload, error, deliveries) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (consumer, message_id) DO UPDATE SET source = excluded.source, \
                   source_seq = excluded.source_seq, payload = excluded.payload, error = excluded.error, \
                   deliveries = excluded.deliveries, state = 'poison', poisoned_at = now()",
            )
            .bind(poison.consumer)
            .bind(poison.message_id)
            .bind(poison.source)
            .bind(poison.source_seq)
            .bind(poison.payload)
            .bind(poison.error)
            .bind(i32::try_from(poison.deliveries).unwrap_or(i32::MAX))
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        }

        async fn poisoned<'a>(
            pool: &'a Pool<Self>,
            consumer: &'a str,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE consumer = $1 AND state = 'poison' \
                 ORDER BY poisoned_at, message_id"
            );
            let rows = sqlx::query(&sql).bind(consumer).fetch_all(pool).await?;
            rows.iter().map(row).collect()
        }

        async fn poisoned_any<'a>(
            pool: &'a Pool<Self>,
            consumer: Option<&'a str>,
            limit: u32,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE state = 'poison' \
                 AND ($1::text IS NULL OR consumer = $1) ORDER BY poisoned_at, consumer, message_id LIMIT $2"
            );
            let rows = sqlx::query(&sql)
                .bind(consumer)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.iter().map(row).collect()
        }

        async fn poison_for_message<'a>(
            pool: &'a Pool<Self>,
            message_id: &'a str,
        ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE message_id = $1 ORDER BY consumer"
            );
            let rows = sqlx::query(&sql).bind(message_id).fetch_all(pool).await?;
            rows.iter().map(row).collect()
        }

        async fn poison_entry<'a>(
            pool: &'a Pool<Self>,
            consumer: &'a str,
            message_id: &'a str,
        ) -> Result<Option<PoisonMessage>, sqlx::Error> {
            let sql = format!(
                "SELECT {COLUMNS} FROM idem_poison WHERE consumer = $1 AND message_id = $2"
            );
            let found = sqlx::query(&sql)
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(pool)
                .await?;
            found.as_ref().map(row).transpose()
        }

        async fn requeue<'a>(
            pool: &'a Pool<Self>,
            scope: &'a str,
            consumer: &'a str,
            message_id: &'a str,
        ) -> Result<Option<PoisonMessage>, sqlx::Error> {
            let mut tx = pool.begin().await?;
            let sql = format!(
                "UPDATE idem_poison SET state = 'requeued', requeues = requeues + 1, requeued_at = now() \
                 WHERE consumer = $1 AND message_id = $2 RETURNING {COLUMNS}"
            );
            let found = sqlx::query(&sql)
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(found) = found.as_ref().map(row).transpose()? else {
                return Ok(None);
            };
            sqlx::query("DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2")
                .bind(scope)
                .bind(message_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(found))
        }
    }
}
