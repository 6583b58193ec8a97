//! SQLite's outbox statements: a batch leased with one `UPDATE … RETURNING`
//! under `BEGIN IMMEDIATE`, times as Unix milliseconds.

use std::time::Duration;

use sqlx::{Pool, Sqlite, SqliteConnection, Transaction};

use super::now_ms;
use crate::outbox::message::Message;
use crate::store::keys::millis;
use crate::store::outbox::{
    backlog_from_row, claimed_from_row, entry_from_row, headers_json, origin_from_row,
    outbox_reads, Backlog, Claimed, MessageState, Origin, Outbox, OutboxEntry, Settlement,
    BLOCKED_KEYS, ORIGIN_BY_ID,
};

/// The columns the operator views read, in [`entry_from_row`]'s order.
const ENTRY_COLUMNS: &str = "message_id, scope, parent_key, step, sink, destination, \
     ordering_key, state, attempts, max_attempts, last_error, receipt, content_type, payload, \
     created_at AS created_at_ms";

impl Outbox for Sqlite {
    async fn insert_message<'a>(
        conn: &'a mut SqliteConnection,
        id: &'a str,
        step: &'static str,
        message: &'a Message,
        _notify: bool,
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
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 1 {
            return Ok(None);
        }
        let row = sqlx::query(ORIGIN_BY_ID)
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
        Ok(Some(origin_from_row(&row)))
    }

    async fn lease_messages<'a>(
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

    async fn settle_message<'a>(
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

    async fn release_leases<'a>(pool: &'a Pool<Self>, owner: &'a str) -> Result<u64, sqlx::Error> {
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

    async fn requeue_message<'a>(
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

    async fn skip_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> Result<bool, sqlx::Error> {
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

    async fn listen_for_enqueues(_pool: &Pool<Self>, _wake: fn()) -> Result<(), sqlx::Error> {
        Ok(())
    }

    async fn outbox_backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
        let sql = format!(
            "SELECT coalesce(sum(state = 'pending'), 0) AS pending, \
             coalesce(sum(state = 'dead'), 0) AS dead, \
             ?1 - min(CASE WHEN state = 'pending' THEN created_at END) AS oldest_ms, \
             {BLOCKED_KEYS} AS blocked FROM idem_outbox WHERE state <> 'sent'"
        );
        let row = sqlx::query(&sql).bind(now_ms()).fetch_one(pool).await?;
        Ok(backlog_from_row(&row))
    }

    async fn purge_sent_messages(
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

    outbox_reads!(columns: ENTRY_COLUMNS);
}
