//! MySQL's outbox statements: a batch selected `FOR UPDATE SKIP LOCKED` and
//! leased by an update of those ids in the same transaction (neither MySQL
//! nor MariaDB has `UPDATE … RETURNING`), times as Unix milliseconds.

use std::time::Duration;

use sqlx::{MySql, MySqlConnection, Pool};

use super::now_ms;
use crate::outbox::message::Message;
use crate::store::keys::millis;
use crate::store::outbox::{
    backlog_from_row, claimed_from_row, entry_from_row, headers_json, origin_from_row, Backlog,
    Claimed, MessageState, Origin, Outbox, OutboxEntry, Settlement, BLOCKED_KEYS,
};

/// The columns the operator views read, in [`entry_from_row`]'s order (text
/// in a binary collation cast, so it decodes as text).
const ENTRY_COLUMNS: &str = "CAST(message_id AS CHAR) AS message_id, scope, parent_key, step, \
     sink, destination, ordering_key, state, CAST(attempts AS SIGNED) AS attempts, \
     CAST(max_attempts AS SIGNED) AS max_attempts, last_error, receipt, content_type, payload, \
     created_at AS created_at_ms";

/// The columns a leased row is read with, as [`claimed_from_row`] expects.
const CLAIMED_COLUMNS: &str = "id, lease_token, CAST(max_attempts AS SIGNED) AS max_attempts, \
     sink, CAST(message_id AS CHAR) AS message_id, step, destination, ordering_key, headers, \
     content_type, payload, CAST(attempts AS SIGNED) AS attempts, created_at AS created_at_ms";

/// Who enqueued the message with id `?`.
const ORIGIN_BY_ID: &str = "SELECT scope, parent_key, step FROM idem_outbox WHERE message_id = ?";

/// `?, ?, …` for `n` parameters.
fn params(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl Outbox for MySql {
    async fn insert_message<'a>(
        conn: &'a mut MySqlConnection,
        id: &'a str,
        step: &'static str,
        message: &'a Message,
        _notify: bool,
    ) -> Result<Option<Origin>, sqlx::Error> {
        // A plain insert: a duplicate id fails with error 1062, which in
        // MySQL ends only the statement, not the transaction. (An upsert's
        // row count cannot tell an insert from a duplicate on connections
        // that report found rows, as sqlx's do.)
        let inserted = sqlx::query(concat!(
            "INSERT INTO idem_outbox (message_id, scope, parent_key, step, sink, destination, \
             ordering_key, headers, payload, content_type, max_attempts, available_at, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ")"
        ))
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
        .execute(&mut *conn)
        .await;
        match inserted {
            Ok(_) => return Ok(None),
            Err(error) if super::keys::is_duplicate_key(&error) => {}
            Err(error) => return Err(error),
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
        if sinks.is_empty() || batch == 0 {
            return Ok(Vec::new());
        }
        let mut tx = pool.begin().await?;
        // Rows another relay holds are skipped, not waited for.
        let pick = format!(
            "SELECT o.id FROM idem_outbox o \
             WHERE o.state = 'pending' AND o.available_at <= {now} \
               AND (o.lease_until IS NULL OR o.lease_until <= {now}) \
               AND o.sink IN ({sinks}) \
               AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idem_outbox p \
                 WHERE p.ordering_key = o.ordering_key AND p.state <> 'sent' AND p.id < o.id)) \
             ORDER BY o.id LIMIT ? FOR UPDATE SKIP LOCKED",
            now = now_ms!(),
            sinks = params(sinks.len()),
        );
        let mut query = sqlx::query_scalar::<_, i64>(&pick);
        for sink in sinks {
            query = query.bind(sink);
        }
        let ids = query.bind(i64::from(batch)).fetch_all(&mut *tx).await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let lease_sql = format!(
            "UPDATE idem_outbox SET lease_until = {} + ?, lease_owner = ?, \
             lease_token = lease_token + 1, attempts = attempts + 1 WHERE id IN ({})",
            now_ms!(),
            params(ids.len())
        );
        let mut update = sqlx::query(&lease_sql).bind(millis(lease)).bind(owner);
        for id in &ids {
            update = update.bind(id);
        }
        update.execute(&mut *tx).await?;
        let read_sql = format!(
            "SELECT {CLAIMED_COLUMNS} FROM idem_outbox WHERE id IN ({}) ORDER BY id",
            params(ids.len())
        );
        let mut read = sqlx::query(&read_sql);
        for id in &ids {
            read = read.bind(id);
        }
        let rows = read.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows.iter().map(claimed_from_row).collect())
    }

    async fn settle_message<'a>(
        pool: &'a Pool<Self>,
        row: i64,
        token: i64,
        settlement: &'a Settlement,
    ) -> Result<bool, sqlx::Error> {
        let query = match settlement {
            Settlement::Sent { receipt } => sqlx::query(concat!(
                "UPDATE idem_outbox SET state = 'sent', sent_at = ",
                now_ms!(),
                ", receipt = ?, lease_until = NULL, lease_owner = NULL \
                 WHERE id = ? AND lease_token = ? AND state = 'pending'"
            ))
            .bind(receipt.as_deref()),
            Settlement::Retry { after, error } => sqlx::query(concat!(
                "UPDATE idem_outbox SET available_at = ",
                now_ms!(),
                " + ?, last_error = ?, lease_until = NULL, lease_owner = NULL \
                 WHERE id = ? AND lease_token = ? AND state = 'pending'"
            ))
            .bind(millis(*after))
            .bind(error.as_str()),
            Settlement::Dead { error } => sqlx::query(
                "UPDATE idem_outbox SET state = 'dead', last_error = ?, \
                 lease_until = NULL, lease_owner = NULL \
                 WHERE id = ? AND lease_token = ? AND state = 'pending'",
            )
            .bind(error.as_str()),
        };
        let done = query.bind(row).bind(token).execute(pool).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn settle_sent<'a>(
        pool: &'a Pool<Self>,
        sent: &'a [(i64, i64, Option<String>)],
    ) -> Result<Vec<i64>, sqlx::Error> {
        if sent.is_empty() {
            return Ok(Vec::new());
        }
        // One transaction, one update per row, each fenced by its own token.
        let mut tx = pool.begin().await?;
        let mut marked = Vec::with_capacity(sent.len());
        for (row, token, receipt) in sent {
            let done = sqlx::query(concat!(
                "UPDATE idem_outbox SET state = 'sent', sent_at = ",
                now_ms!(),
                ", receipt = ?, lease_until = NULL, lease_owner = NULL \
                 WHERE id = ? AND lease_token = ? AND state = 'pending'"
            ))
            .bind(receipt.as_deref())
            .bind(row)
            .bind(token)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                marked.push(*row);
            }
        }
        tx.commit().await?;
        Ok(marked)
    }

    async fn release_leases<'a>(pool: &'a Pool<Self>, owner: &'a str) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(concat!(
            "UPDATE idem_outbox SET lease_until = NULL, lease_owner = NULL, \
             attempts = GREATEST(attempts - 1, 0) \
             WHERE lease_owner = ? AND state = 'pending' AND lease_until > ",
            now_ms!()
        ))
        .bind(owner)
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn requeue_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(concat!(
            "UPDATE idem_outbox SET state = 'pending', attempts = 0, available_at = ",
            now_ms!(),
            ", lease_until = NULL, lease_owner = NULL WHERE message_id = ? AND state = 'dead'"
        ))
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
        let done = sqlx::query(concat!(
            "UPDATE idem_outbox SET state = 'sent', receipt = 'skipped', sent_at = ",
            now_ms!(),
            ", lease_until = NULL, lease_owner = NULL, lease_token = lease_token + 1 \
             WHERE message_id = ? AND state <> 'sent'"
        ))
        .bind(message_id)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn listen_for_enqueues(_pool: &Pool<Self>, _wake: fn()) -> Result<(), sqlx::Error> {
        // MySQL has no notifications: relays poll.
        Ok(())
    }

    async fn outbox_backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
        let sql = format!(
            "SELECT CAST(COALESCE(SUM(state = 'pending'), 0) AS SIGNED) AS pending, \
             CAST(COALESCE(SUM(state = 'dead'), 0) AS SIGNED) AS dead, \
             CAST({} - MIN(CASE WHEN state = 'pending' THEN created_at END) AS SIGNED) AS oldest_ms, \
             CAST({BLOCKED_KEYS} AS SIGNED) AS blocked FROM idem_outbox WHERE state <> 'sent'",
            now_ms!()
        );
        let row = sqlx::query(&sql).fetch_one(pool).await?;
        Ok(backlog_from_row(&row))
    }

    async fn purge_sent_messages(
        pool: &Pool<Self>,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(concat!(
            "DELETE FROM idem_outbox WHERE state = 'sent' AND sent_at < ",
            now_ms!(),
            " - ? ORDER BY sent_at LIMIT ?"
        ))
        .bind(millis(retention))
        .bind(i64::from(batch))
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn message_entry<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> Result<Option<OutboxEntry>, sqlx::Error> {
        let sql = format!("SELECT {ENTRY_COLUMNS} FROM idem_outbox WHERE message_id = ?");
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
            "SELECT {ENTRY_COLUMNS} FROM idem_outbox WHERE scope = ? AND parent_key = ? ORDER BY id"
        );
        let rows = sqlx::query(&sql)
            .bind(scope)
            .bind(parent_key)
            .fetch_all(pool)
            .await?;
        Ok(rows.iter().map(entry_from_row).collect())
    }

    async fn dead_messages(pool: &Pool<Self>, limit: u32) -> Result<Vec<OutboxEntry>, sqlx::Error> {
        let sql = format!(
            "SELECT {ENTRY_COLUMNS} FROM idem_outbox WHERE state = 'dead' ORDER BY id LIMIT ?"
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
            "SELECT {ENTRY_COLUMNS} FROM idem_outbox WHERE (? IS NULL OR state = ?) \
             ORDER BY id DESC LIMIT ?"
        );
        let state = state.map(MessageState::as_str);
        let rows = sqlx::query(&sql)
            .bind(state)
            .bind(state)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
        Ok(rows.iter().map(entry_from_row).collect())
    }
}
