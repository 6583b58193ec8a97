//! Postgres' inbox statements: poison rows with `timestamptz` times.

use std::time::Duration;

use sqlx::{Pool, Postgres};

use super::statement;

use crate::operation::Operation;
use crate::store::inbox::{
    inbox_reads, poison_from_row, rejection, Inbox, NewPoison, PoisonMessage,
};
use crate::store::keys::Keys;

const COLUMNS: &str =
    "consumer, message_id, source, source_seq, payload, error, deliveries::int8, \
     state, requeues::int8, (EXTRACT(EPOCH FROM first_seen) * 1000)::int8, \
     (EXTRACT(EPOCH FROM poisoned_at) * 1000)::int8";

impl Inbox for Postgres {
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
        statement(
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

    async fn requeue_poison<'a>(
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
        let found = statement(&sql)
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

    inbox_reads!(columns: COLUMNS);
}
