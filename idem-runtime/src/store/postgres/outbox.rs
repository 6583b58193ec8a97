//! Postgres' outbox statements: a batch claimed with `SELECT … FOR UPDATE
//! SKIP LOCKED` and leased in the same statement (the migration's
//! `idem_outbox_claim`), `NOTIFY` on enqueue when asked, times as
//! `timestamptz`.

use std::time::Duration;

use sqlx::{PgConnection, Pool, Postgres, Row};

use super::{execute_on, fetch_all_on, named_statements, statement};

use crate::outbox::message::Message;
use crate::store::keys::millis;
use crate::store::outbox::{
    backlog_from_row, claimed_from_row, entry_from_row, headers_json, origin_from_row,
    outbox_reads, Backlog, Claimed, MessageState, Origin, Outbox, OutboxEntry, Settlement,
    BLOCKED_KEYS, NOTIFY_CHANNEL, ORIGIN_BY_ID,
};

/// `$n` milliseconds as an interval.
macro_rules! ms {
    ($n:literal) => {
        concat!("(", $n, "::float8 * interval '1 millisecond')")
    };
}

/// The columns the operator views read, as the shared decoders expect them
/// (ints as int8, times as Unix milliseconds).
const ENTRY_COLUMNS: &str = "message_id, scope, parent_key, step, sink, destination, \
     ordering_key, state, attempts::int8 AS attempts, max_attempts::int8 AS max_attempts, \
     last_error, receipt, content_type, payload, \
     (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms";

impl Outbox for Postgres {
    async fn insert_message<'a>(
        conn: &'a mut PgConnection,
        id: &'a str,
        step: &'static str,
        message: &'a Message,
        notify: bool,
    ) -> Result<Option<Origin>, sqlx::Error> {
        let done = statement(
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
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 1 {
            if notify {
                // Delivered by Postgres at commit, dropped on rollback.
                statement("SELECT pg_notify($1, '')")
                    .bind(NOTIFY_CHANNEL)
                    .execute(&mut *conn)
                    .await?;
            }
            return Ok(None);
        }
        let row = statement(ORIGIN_BY_ID)
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
        // The claim is a function (migration 20261207000001): it keeps
        // the planner to a plain index scan in id order.
        let query = sqlx::query(
            "SELECT id, lease_token, max_attempts::int8 AS max_attempts, sink, \
               message_id, step, destination, ordering_key, headers::text AS headers, \
               content_type, payload, attempts::int8 AS attempts, \
               (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms \
             FROM idem_outbox_claim($1, $2, $3, $4)",
        )
        .bind(sinks)
        .bind(i64::from(batch))
        .bind(millis(lease) as f64)
        .bind(owner);
        let rows = fetch_all_on(pool, query).await?;
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
        let done = execute_on(pool, query).await?;
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
        let query = sqlx::query(
            "UPDATE idem_outbox o SET state = 'sent', sent_at = now(), receipt = s.receipt, \
             lease_until = NULL, lease_owner = NULL \
             FROM unnest($1::int8[], $2::int8[], $3::text[]) AS s(id, token, receipt) \
             WHERE o.id = s.id AND o.lease_token = s.token AND o.state = 'pending' \
             RETURNING o.id",
        )
        .bind(rows)
        .bind(tokens)
        .bind(receipts);
        let marked = fetch_all_on(pool, query).await?;
        marked.iter().map(|row| row.try_get(0)).collect()
    }

    async fn release_leases<'a>(pool: &'a Pool<Self>, owner: &'a str) -> Result<u64, sqlx::Error> {
        let query = sqlx::query(
            "UPDATE idem_outbox SET lease_until = NULL, lease_owner = NULL, \
             attempts = greatest(attempts - 1, 0) \
             WHERE lease_owner = $1 AND state = 'pending' AND lease_until > now()",
        )
        .bind(owner);
        let done = execute_on(pool, query).await?;
        Ok(done.rows_affected())
    }

    async fn requeue_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> Result<bool, sqlx::Error> {
        let query = sqlx::query(
            "UPDATE idem_outbox SET state = 'pending', attempts = 0, available_at = now(), \
             lease_until = NULL, lease_owner = NULL WHERE message_id = $1 AND state = 'dead'",
        )
        .bind(message_id);
        let done = execute_on(pool, query).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn skip_message<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> Result<bool, sqlx::Error> {
        // Bumping the token fences a relay that holds the row right now.
        let query = sqlx::query(
            "UPDATE idem_outbox SET state = 'sent', receipt = 'skipped', sent_at = now(), \
             lease_until = NULL, lease_owner = NULL, lease_token = lease_token + 1 \
             WHERE message_id = $1 AND state <> 'sent'",
        )
        .bind(message_id);
        let done = execute_on(pool, query).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn listen_for_enqueues(pool: &Pool<Self>, wake: fn()) -> Result<(), sqlx::Error> {
        if !named_statements() {
            // Behind a transaction pooler `LISTEN` would hold a server
            // session the pooler hands to others: polling only.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "the outbox relay does not LISTEN behind a transaction pooler; it finds \
                     other processes' messages by polling (Relay::poll_interval)"
                );
            });
            return Ok(());
        }
        let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        loop {
            listener.recv().await?;
            wake();
        }
    }

    async fn outbox_backlog(pool: &Pool<Self>) -> Result<Backlog, sqlx::Error> {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE state = 'pending') AS pending, \
             count(*) FILTER (WHERE state = 'dead') AS dead, \
             (extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending')) \
               * 1000)::int8 AS oldest_ms, \
             {BLOCKED_KEYS} AS blocked FROM idem_outbox WHERE state <> 'sent'"
        );
        // No parameters: the simple protocol, one message on any pooler.
        let row = sqlx::raw_sql(&sql).fetch_one(pool).await?;
        Ok(backlog_from_row(&row))
    }

    async fn purge_sent_messages(
        pool: &Pool<Self>,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, sqlx::Error> {
        let query = sqlx::query(concat!(
            "DELETE FROM idem_outbox WHERE id IN (SELECT id FROM idem_outbox \
             WHERE state = 'sent' AND sent_at < now() - ",
            ms!("$1"),
            " ORDER BY sent_at LIMIT $2)"
        ))
        .bind(millis(retention) as f64)
        .bind(i64::from(batch));
        let done = execute_on(pool, query).await?;
        Ok(done.rows_affected())
    }

    outbox_reads!(columns: ENTRY_COLUMNS);
}
