//! SQLite's claim statements: the write lock up front, the record read
//! under it, the completed record written in the claim's transaction.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Pool, Row, Sqlite, SqliteConnection, Transaction};

use super::now_ms;
use crate::operation::Operation;
use crate::outcome::StoredResponse;
use crate::policy::Policy;
use crate::store::keys::{
    encode_headers, key_administration, keyed, millis, record_writes, response_from_columns,
    KeyFilter, KeyRecord, Keys, Locked, Record, RecordStatus, StepCount, BODY_EXCERPT,
};

const SELECT_RECORD: &str =
    "SELECT status, fingerprint, response_status, response_content_type, response_body, \
     expires_at, locked_until, response_headers FROM idempotency_keys WHERE scope = ?1 AND key = ?2";

fn record(row: &SqliteRow) -> Result<Record, sqlx::Error> {
    let now = now_ms();
    let status: String = row.try_get(0)?;
    let expires_at: i64 = row.try_get(5)?;
    let locked_until: i64 = row.try_get(6)?;
    Ok(Record {
        status: RecordStatus::parse(&status),
        fingerprint: row.try_get(1)?,
        response: response_from_columns(
            row.try_get(2)?,
            row.try_get(3)?,
            row.try_get(4)?,
            row.try_get(7)?,
        )?,
        expired: expires_at <= now,
        lock_left: (locked_until > now).then(|| Duration::from_millis((locked_until - now) as u64)),
    })
}

/// The completed record's insert, shared by the two statements below.
macro_rules! insert_completed {
    () => {
        "INSERT INTO idempotency_keys \
         (scope, key, step, fingerprint, status, response_status, response_content_type, response_body, \
          response_headers, claim_token, created_at, locked_until, expires_at) \
         VALUES (?1, ?2, ?3, ?4, 'completed', ?5, ?6, ?7, ?10, NULL, ?8, ?8, ?9)"
    };
}

/// The completed record, for a claim that found none.
const INSERT_COMPLETED: &str = insert_completed!();

/// The completed record unless the key has one.
const INSERT_COMPLETED_IF_ABSENT: &str =
    concat!(insert_completed!(), " ON CONFLICT (scope, key) DO NOTHING");

/// The completed record, replacing an expired or taken-over one.
const UPSERT_COMPLETED: &str = concat!(
    insert_completed!(),
    " \
     ON CONFLICT (scope, key) DO UPDATE SET step = excluded.step, fingerprint = excluded.fingerprint, \
       status = 'completed', response_status = excluded.response_status, \
       response_content_type = excluded.response_content_type, response_body = excluded.response_body, \
       response_headers = excluded.response_headers, \
       claim_token = NULL, created_at = excluded.created_at, locked_until = excluded.locked_until, \
       expires_at = excluded.expires_at"
);

const UPSERT_IN_PROGRESS: &str = "INSERT INTO idempotency_keys \
     (scope, key, step, fingerprint, status, claim_token, created_at, locked_until, expires_at) \
     VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, ?7, ?8) \
     ON CONFLICT (scope, key) DO UPDATE SET step = excluded.step, fingerprint = excluded.fingerprint, \
       status = 'in_progress', response_status = NULL, response_content_type = NULL, response_body = NULL, \
       response_headers = NULL, claim_token = excluded.claim_token, created_at = excluded.created_at, \
       locked_until = excluded.locked_until, expires_at = excluded.expires_at";

const COMPLETE_CLAIM: &str = "UPDATE idempotency_keys SET status = 'completed', response_status = ?4, \
       response_content_type = ?5, response_body = ?6, response_headers = ?9, claim_token = NULL, locked_until = ?7, \
       expires_at = ?8 \
     WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND status = 'in_progress'";

impl Keys for Sqlite {
    const SERIALIZE_WRITERS: bool = true;

    type Settings = ();
    const SELECT_RECORD: &'static str = SELECT_RECORD;

    fn decode_record(row: &<Self as sqlx::Database>::Row) -> Result<Record, sqlx::Error> {
        record(row)
    }

    async fn lock_and_read<'a>(
        conn: PoolConnection<Self>,
        op: &'a Operation,
        policy: &'a Policy,
        (): (),
    ) -> Result<Locked<Self>, sqlx::Error> {
        // The write lock up front: a deferred transaction that upgrades later
        // can fail with SQLITE_BUSY_SNAPSHOT instead of waiting. The wait is
        // bounded by this claim's own policy, set in the same call as the
        // `BEGIN` (SQLite runs both statements at once), so an engine's later
        // `with_policy` or an operation's override applies without a round trip.
        // sqlx's constructor for a transaction on a connection already taken
        // from the pool (public, hidden from its docs; what `Pool::begin` calls).
        let begin = format!(
            "PRAGMA busy_timeout = {}; BEGIN IMMEDIATE",
            millis(policy.wait_timeout).clamp(1, i64::from(i32::MAX))
        );
        let mut tx = Transaction::begin(conn, Some(begin.into())).await?;
        let row = keyed(SELECT_RECORD, op).fetch_optional(&mut *tx).await?;
        let record = row.as_ref().map(record).transpose()?;
        Ok(Locked {
            tx,
            record,
            holds_row: false,
        })
    }

    async fn write_in_progress<'a>(
        conn: &'a mut SqliteConnection,
        op: &'a Operation,
        token: i64,
        policy: &'a Policy,
    ) -> Result<(), sqlx::Error> {
        let now = now_ms();
        keyed(UPSERT_IN_PROGRESS, op)
            .bind(op.step)
            .bind(&op.fingerprint.0[..])
            .bind(token)
            .bind(now)
            .bind(now.saturating_add(millis(policy.lock_ttl)))
            .bind(now.saturating_add(millis(policy.retention.max(policy.lock_ttl))))
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn write_claimed<'a>(
        conn: &'a mut SqliteConnection,
        op: &'a Operation,
        token: i64,
        response: &'a StoredResponse,
        policy: &'a Policy,
    ) -> Result<bool, sqlx::Error> {
        let now = now_ms();
        let done = keyed(COMPLETE_CLAIM, op)
            .bind(token)
            .bind(i64::from(response.status))
            .bind(&response.content_type)
            .bind(&response.body)
            .bind(now)
            .bind(now.saturating_add(millis(policy.retention)))
            .bind(encode_headers(&response.headers))
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn savepoint_and_lookup<'a>(
        conn: &'a mut SqliteConnection,
        op: &'a Operation,
        savepoint: &'static str,
    ) -> Result<Option<Record>, sqlx::Error> {
        // One call to the connection's worker: it runs the statements in turn.
        let sql = format!("{savepoint}; {SELECT_RECORD}");
        crate::store::keys::lookup_by::<Self>(conn, op, &sql).await
    }

    async fn purge_batch(
        pool: &Pool<Self>,
        batch: u32,
        from: i64,
    ) -> Result<(u64, i64), sqlx::Error> {
        // SQLite removes a deleted row's index entries at once, so every batch
        // can start from the oldest record and `from` is handed back as is.
        let done = sqlx::query(
            "DELETE FROM idempotency_keys WHERE (scope, key) IN \
             (SELECT scope, key FROM idempotency_keys WHERE expires_at < ?1 ORDER BY expires_at LIMIT ?2)",
        )
        .bind(now_ms())
        .bind(i64::from(batch))
        .execute(pool)
        .await?;
        Ok((done.rows_affected(), from))
    }

    async fn live_steps(pool: &Pool<Self>) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT DISTINCT step FROM idempotency_keys WHERE expires_at > ?1 ORDER BY step",
        )
        .bind(now_ms())
        .fetch_all(pool)
        .await
    }

    async fn run_raw(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, sql).await.map(drop)
    }

    fn is_lock_busy(error: &sqlx::Error) -> bool {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        let code = match error {
            sqlx::Error::Database(db) => db.code().and_then(|code| code.parse::<i32>().ok()),
            _ => None,
        };
        matches!(code.map(|c| c & 0xff), Some(5 | 6))
    }

    record_writes!();
    key_administration!(columns: admin_columns(), now: now_ms());
}

/// `sqlx::query(sql)`: SQLite's connections are their own sessions.
fn statement(sql: &str) -> Query<'_, Sqlite, SqliteArguments<'_>> {
    sqlx::query(sql)
}

/// Runs `query` on `pool`.
async fn execute_on<'q>(
    pool: &Pool<Sqlite>,
    query: Query<'q, Sqlite, SqliteArguments<'q>>,
) -> Result<sqlx::sqlite::SqliteQueryResult, sqlx::Error> {
    query.execute(pool).await
}

/// A completed-record statement of this file with its values bound.
fn bind_completed<'q>(
    sql: &'q str,
    op: &'q Operation,
    response: &'q StoredResponse,
    policy: &Policy,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    let now = now_ms();
    keyed(sql, op)
        .bind(op.step)
        .bind(&op.fingerprint.0[..])
        .bind(i64::from(response.status))
        .bind(&response.content_type)
        .bind(&response.body)
        .bind(now)
        .bind(now.saturating_add(millis(policy.retention)))
        .bind(encode_headers(&response.headers))
}

/// The key record's columns as operators see them, read at `now`.
fn admin_columns() -> String {
    format!(
        "scope, key, step, status, fingerprint, response_status, response_content_type, \
         substr(response_body, 1, {BODY_EXCERPT}) AS body_excerpt, \
         length(response_body) AS body_bytes, created_at AS created_at_ms, \
         locked_until AS locked_until_ms, expires_at AS expires_at_ms, \
         CAST({} AS BIGINT) AS read_at_ms",
        now_ms()
    )
}
