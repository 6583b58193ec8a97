//! SQLite's inbox statements: poison rows with Unix-millisecond times,
//! written under `BEGIN IMMEDIATE`.

use std::time::Duration;

use sqlx::{Pool, Sqlite};

use super::now_ms;
use crate::operation::Operation;
use crate::store::inbox::{
    inbox_reads, poison_from_row, rejection, Inbox, NewPoison, PoisonMessage,
};
use crate::store::keys::Keys;

const COLUMNS: &str = "consumer, message_id, source, source_seq, payload, error, deliveries, \
     state, requeues, first_seen, poisoned_at";

impl Inbox for Sqlite {
    async fn record_poison<'a>(
        pool: &'a Pool<Self>,
        poison: NewPoison<'a>,
        reject: Option<(&'a Operation, Duration)>,
    ) -> Result<(), sqlx::Error> {
        let now = now_ms();
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some((op, retention)) = reject {
            Self::write_completed_if_absent(&mut tx, op, &rejection(poison.error), retention)
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

    async fn requeue_poison<'a>(
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
        let Some(found) = found.as_ref().map(poison_from_row).transpose()? else {
            return Ok(None);
        };
        Self::delete_record(&mut tx, scope, message_id).await?;
        tx.commit().await?;
        Ok(Some(found))
    }

    inbox_reads!(columns: COLUMNS);
}
