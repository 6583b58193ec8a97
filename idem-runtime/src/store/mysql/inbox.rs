//! MySQL's inbox statements: poison rows with Unix-millisecond times; a
//! requeue updates the row, then reads it back in the same transaction (no
//! `UPDATE … RETURNING`).

use std::time::Duration;

use sqlx::{MySql, Pool};

use super::now_ms;
use crate::operation::Operation;
use crate::store::inbox::{poison_from_row, rejection, Inbox, NewPoison, PoisonMessage};
use crate::store::keys::Keys;

/// The poison columns in [`poison_from_row`]'s order (text in a binary
/// collation cast, so it decodes as text).
const COLUMNS: &str = "CAST(consumer AS CHAR), CAST(message_id AS CHAR), source, source_seq, \
     payload, error, CAST(deliveries AS SIGNED), state, CAST(requeues AS SIGNED), first_seen, \
     poisoned_at";

impl Inbox for MySql {
    async fn record_poison<'a>(
        pool: &'a Pool<Self>,
        poison: NewPoison<'a>,
        reject: Option<(&'a Operation, Duration)>,
    ) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin().await?;
        if let Some((op, retention)) = reject {
            Self::write_completed_if_absent(&mut tx, op, &rejection(poison.error), retention)
                .await?;
        }
        sqlx::query(concat!(
            "INSERT INTO idem_poison (consumer, message_id, source, source_seq, payload, error, \
               deliveries, first_seen, poisoned_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ") ON DUPLICATE KEY UPDATE source = VALUES(source), \
               source_seq = VALUES(source_seq), payload = VALUES(payload), error = VALUES(error), \
               deliveries = VALUES(deliveries), state = 'poison', poisoned_at = VALUES(poisoned_at)"
        ))
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

    async fn requeue_poison<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        consumer: &'a str,
        message_id: &'a str,
    ) -> Result<Option<PoisonMessage>, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let done = sqlx::query(concat!(
            "UPDATE idem_poison SET state = 'requeued', requeues = requeues + 1, requeued_at = ",
            now_ms!(),
            " WHERE consumer = ? AND message_id = ?"
        ))
        .bind(consumer)
        .bind(message_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        // The updated row, read with a locking read in the same transaction.
        let sql = format!(
            "SELECT {COLUMNS} FROM idem_poison WHERE consumer = ? AND message_id = ? FOR UPDATE"
        );
        let found = sqlx::query(&sql)
            .bind(consumer)
            .bind(message_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(found) = found.as_ref().map(poison_from_row).transpose()? else {
            return Ok(None);
        };
        Self::delete_record(&mut tx, scope, message_id).await?;
        tx.commit().await?;
        Ok(Some(found))
    }

    async fn poisoned<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
    ) -> Result<Vec<PoisonMessage>, sqlx::Error> {
        let sql = format!(
            "SELECT {COLUMNS} FROM idem_poison WHERE consumer = ? AND state = 'poison' \
             ORDER BY poisoned_at, message_id"
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
            "SELECT {COLUMNS} FROM idem_poison WHERE state = 'poison' \
             AND (? IS NULL OR consumer = ?) \
             ORDER BY poisoned_at, consumer, message_id LIMIT ?"
        );
        let rows = sqlx::query(&sql)
            .bind(consumer)
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
        let sql =
            format!("SELECT {COLUMNS} FROM idem_poison WHERE message_id = ? ORDER BY consumer");
        let rows = sqlx::query(&sql).bind(message_id).fetch_all(pool).await?;
        rows.iter().map(poison_from_row).collect()
    }

    async fn poison_entry<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        message_id: &'a str,
    ) -> Result<Option<PoisonMessage>, sqlx::Error> {
        let sql =
            format!("SELECT {COLUMNS} FROM idem_poison WHERE consumer = ? AND message_id = ?");
        let found = sqlx::query(&sql)
            .bind(consumer)
            .bind(message_id)
            .fetch_optional(pool)
            .await?;
        found.as_ref().map(poison_from_row).transpose()
    }
}
