//! MySQL's claim statements (see the [module docs](super) for the protocol):
//! the key's row as its lock, the record read with a locking read, the
//! completed record written in the claim's transaction.

use std::time::Duration;

use sqlx::mysql::{MySqlArguments, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::{MySql, MySqlConnection, Pool, Row, Transaction};

use super::now_ms;
use crate::operation::Operation;
use crate::outcome::StoredResponse;
use crate::policy::Policy;
use crate::store::keys::{
    encode_headers, keyed, millis, response_from_columns, KeyFilter, KeyRecord, Keys, Locked,
    Record, RecordStatus, StepCount, BODY_EXCERPT,
};

/// The record's read, shared by the two statements below. The times come
/// back as `expired` (0/1) and the lock's milliseconds left.
macro_rules! select_record {
    () => {
        concat!(
            "SELECT status, fingerprint, CAST(response_status AS SIGNED), response_content_type, \
               response_body, CAST(expires_at <= ",
            now_ms!(),
            " AS SIGNED) AS expired, \
               CAST(locked_until - ",
            now_ms!(),
            " AS SIGNED) AS lock_left_ms, response_headers \
             FROM idempotency_keys WHERE scope = ? AND `key` = ?"
        )
    };
}

const SELECT_RECORD: &str = select_record!();

/// The record's read under a shared row lock: a locking read, so it sees the
/// latest committed version (a plain read under `REPEATABLE READ` would read
/// the snapshot), and holds the row until the claim's transaction ends.
const LOCK_RECORD: &str = concat!(select_record!(), " LOCK IN SHARE MODE");

fn record(row: &MySqlRow) -> Result<Record, sqlx::Error> {
    let status: String = row.try_get(0)?;
    let expired: i64 = row.try_get(5)?;
    let lock_left_ms: i64 = row.try_get(6)?;
    Ok(Record {
        status: RecordStatus::parse(&status),
        fingerprint: row.try_get(1)?,
        response: response_from_columns(
            row.try_get(2)?,
            row.try_get(3)?,
            row.try_get(4)?,
            row.try_get(7)?,
        )?,
        expired: expired != 0,
        lock_left: (lock_left_ms > 0).then(|| Duration::from_millis(lock_left_ms as u64)),
    })
}

/// The claim's own row, for a key without a record. A duplicate's insert
/// waits on it until this transaction ends.
const INSERT_CLAIM_ROW: &str = concat!(
    "INSERT INTO idempotency_keys \
     (scope, `key`, step, fingerprint, status, created_at, locked_until, expires_at) \
     VALUES (?, ?, ?, ?, 'in_progress', ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + ?)"
);

/// The completed record's insert, shared by the statements below.
macro_rules! insert_completed {
    () => {
        concat!(
            "INSERT INTO idempotency_keys \
             (scope, `key`, step, fingerprint, status, response_status, response_content_type, \
              response_body, response_headers, claim_token, created_at, locked_until, expires_at) \
             VALUES (?, ?, ?, ?, 'completed', ?, ?, ?, ?, NULL, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ", ",
            now_ms!(),
            " + ?)"
        )
    };
}

/// The completed record, for a claim that found no row.
const INSERT_COMPLETED: &str = insert_completed!();

/// The completed record unless the key has one (a no-op update, never
/// `INSERT IGNORE`, which would also turn data errors into warnings).
const INSERT_COMPLETED_IF_ABSENT: &str = concat!(
    insert_completed!(),
    " ON DUPLICATE KEY UPDATE scope = scope"
);

/// The completed record over the row the claim holds (its own `in_progress`
/// row, or an expired or taken-over record it locked): an update of that
/// row, cheaper in InnoDB than an upsert meeting its duplicate.
const REPLACE_COMPLETED: &str = concat!(
    "UPDATE idempotency_keys SET step = ?, fingerprint = ?, status = 'completed', \
       response_status = ?, response_content_type = ?, response_body = ?, response_headers = ?, \
       claim_token = NULL, created_at = ",
    now_ms!(),
    ", locked_until = ",
    now_ms!(),
    ", expires_at = ",
    now_ms!(),
    " + ? WHERE scope = ? AND `key` = ?"
);

const UPSERT_IN_PROGRESS: &str = concat!(
    "INSERT INTO idempotency_keys \
     (scope, `key`, step, fingerprint, status, claim_token, created_at, locked_until, expires_at) \
     VALUES (?, ?, ?, ?, 'in_progress', ?, ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + ?, ",
    now_ms!(),
    " + ?) \
     ON DUPLICATE KEY UPDATE step = VALUES(step), fingerprint = VALUES(fingerprint), \
       status = 'in_progress', response_status = NULL, response_content_type = NULL, \
       response_body = NULL, response_headers = NULL, claim_token = VALUES(claim_token), \
       created_at = VALUES(created_at), locked_until = VALUES(locked_until), \
       expires_at = VALUES(expires_at)"
);

const COMPLETE_CLAIM: &str = concat!(
    "UPDATE idempotency_keys SET status = 'completed', response_status = ?, \
       response_content_type = ?, response_body = ?, response_headers = ?, claim_token = NULL, \
       locked_until = ",
    now_ms!(),
    ", expires_at = ",
    now_ms!(),
    " + ? \
     WHERE scope = ? AND `key` = ? AND claim_token = ? AND status = 'in_progress'"
);

/// MySQL's error numbers for a lock wait that timed out and a deadlock.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
const DEADLOCK: u16 = 1213;
const DUPLICATE_KEY: u16 = 1062;

/// Whether `error` is a duplicate key (error 1062).
pub(super) fn is_duplicate_key(error: &sqlx::Error) -> bool {
    error_number(error) == Some(DUPLICATE_KEY)
}

fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|my| my.number()),
        _ => None,
    }
}

/// The opening of a claim's transaction, its lock waits bounded by `policy`
/// (InnoDB counts them in whole seconds).
fn begin_claim(policy: &Policy) -> String {
    let seconds = policy
        .wait_timeout
        .as_millis()
        .div_ceil(1000)
        .clamp(1, 3600);
    format!("SET SESSION innodb_lock_wait_timeout = {seconds}; START TRANSACTION")
}

impl Keys for MySql {
    type Settings = ();
    const SELECT_RECORD: &'static str = SELECT_RECORD;

    fn decode_record(row: &MySqlRow) -> Result<Record, sqlx::Error> {
        record(row)
    }

    async fn lock_and_read<'a>(
        conn: PoolConnection<Self>,
        op: &'a Operation,
        policy: &'a Policy,
        (): (),
    ) -> Result<Locked<Self>, sqlx::Error> {
        // sqlx's constructor for a transaction on a connection already taken
        // from the pool (public, hidden from its docs; what `Pool::begin` calls).
        let mut tx = Transaction::begin(conn, Some(begin_claim(policy).into())).await?;
        loop {
            let inserted = keyed(INSERT_CLAIM_ROW, op)
                .bind(op.step)
                .bind(&op.fingerprint.0[..])
                .bind(millis(policy.retention))
                .execute(&mut *tx)
                .await;
            match inserted {
                Ok(_) => {
                    return Ok(Locked {
                        tx,
                        record: None,
                        holds_row: true,
                    })
                }
                Err(error) if is_duplicate_key(&error) => {}
                Err(error) => return Err(error),
            }
            // The key has a committed record (the insert waited for its
            // writer, if any): read it under its lock. A record purged in
            // between sends the claim back to the insert.
            if let Some(row) = keyed(LOCK_RECORD, op).fetch_optional(&mut *tx).await? {
                return Ok(Locked {
                    record: Some(record(&row)?),
                    tx,
                    holds_row: false,
                });
            }
        }
    }

    async fn lookup_unlocked<'a>(
        conn: &'a mut MySqlConnection,
        op: &'a Operation,
    ) -> Result<Option<Record>, sqlx::Error> {
        crate::store::keys::lookup_unlocked::<Self>(conn, op).await
    }

    async fn write_completed<'a>(
        conn: &'a mut MySqlConnection,
        op: &'a Operation,
        response: &'a StoredResponse,
        policy: &'a Policy,
        replace: bool,
    ) -> Result<(), sqlx::Error> {
        if replace {
            // The pool's sessions report matched rows (sqlx sets
            // CLIENT_FOUND_ROWS): 0 means no row was there to replace.
            let replaced = sqlx::query(REPLACE_COMPLETED)
                .bind(op.step)
                .bind(&op.fingerprint.0[..])
                .bind(i64::from(response.status))
                .bind(&response.content_type)
                .bind(&response.body)
                .bind(encode_headers(&response.headers))
                .bind(millis(policy.retention))
                .bind(op.scope.as_stored())
                .bind(op.key.as_str())
                .execute(&mut *conn)
                .await?;
            if replaced.rows_affected() == 1 {
                return Ok(());
            }
        }
        bind_completed(INSERT_COMPLETED, op, response, policy.retention)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn write_completed_if_absent<'a>(
        conn: &'a mut MySqlConnection,
        op: &'a Operation,
        response: &'a StoredResponse,
        retention: Duration,
    ) -> Result<(), sqlx::Error> {
        bind_completed(INSERT_COMPLETED_IF_ABSENT, op, response, retention)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn write_in_progress<'a>(
        conn: &'a mut MySqlConnection,
        op: &'a Operation,
        token: i64,
        policy: &'a Policy,
    ) -> Result<(), sqlx::Error> {
        keyed(UPSERT_IN_PROGRESS, op)
            .bind(op.step)
            .bind(&op.fingerprint.0[..])
            .bind(token)
            .bind(millis(policy.lock_ttl))
            .bind(millis(policy.retention.max(policy.lock_ttl)))
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn write_claimed<'a>(
        conn: &'a mut MySqlConnection,
        op: &'a Operation,
        token: i64,
        response: &'a StoredResponse,
        policy: &'a Policy,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(COMPLETE_CLAIM)
            .bind(i64::from(response.status))
            .bind(&response.content_type)
            .bind(&response.body)
            .bind(encode_headers(&response.headers))
            .bind(millis(policy.retention))
            .bind(op.scope.as_stored())
            .bind(op.key.as_str())
            .bind(token)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_claim<'a>(
        pool: &'a Pool<Self>,
        op: &'a Operation,
        token: i64,
    ) -> Result<(), sqlx::Error> {
        keyed(
            "DELETE FROM idempotency_keys \
             WHERE scope = ? AND `key` = ? AND claim_token = ? AND status = 'in_progress'",
            op,
        )
        .bind(token)
        .execute(pool)
        .await?;
        Ok(())
    }

    async fn purge_batch(
        pool: &Pool<Self>,
        batch: u32,
        from: i64,
    ) -> Result<(u64, i64), sqlx::Error> {
        // Oldest first by the expiry index, in one statement; InnoDB removes
        // a deleted row's index entries at purge time, so each batch starts
        // where the previous one stopped (`from`, Unix milliseconds).
        let mut tx = pool.begin().await?;
        let last: Option<i64> = sqlx::query_scalar(concat!(
            "SELECT MAX(expires_at) FROM (SELECT expires_at FROM idempotency_keys \
             WHERE expires_at < ",
            now_ms!(),
            " AND expires_at >= ? ORDER BY expires_at LIMIT ?) AS batch"
        ))
        .bind(from)
        .bind(i64::from(batch))
        .fetch_one(&mut *tx)
        .await?;
        let done = sqlx::query(concat!(
            "DELETE FROM idempotency_keys WHERE expires_at < ",
            now_ms!(),
            " AND expires_at >= ? ORDER BY expires_at LIMIT ?"
        ))
        .bind(from)
        .bind(i64::from(batch))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((done.rows_affected(), last.unwrap_or(from)))
    }

    async fn live_steps(pool: &Pool<Self>) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(concat!(
            "SELECT DISTINCT step FROM idempotency_keys WHERE expires_at > ",
            now_ms!(),
            " ORDER BY step"
        ))
        .fetch_all(pool)
        .await
    }

    fn is_lock_busy(error: &sqlx::Error) -> bool {
        matches!(error_number(error), Some(LOCK_WAIT_TIMEOUT | DEADLOCK))
    }

    async fn run_raw(conn: &mut MySqlConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, sql).await.map(drop)
    }

    async fn delete_record<'a>(
        conn: &'a mut MySqlConnection,
        scope: &'a str,
        key: &'a str,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query("DELETE FROM idempotency_keys WHERE scope = ? AND `key` = ?")
            .bind(scope)
            .bind(key)
            .execute(conn)
            .await
            .map(|done| done.rows_affected() > 0)
    }

    async fn key_record<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a str,
    ) -> Result<Option<KeyRecord>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM idempotency_keys WHERE scope = ? AND `key` = ?",
            admin_columns()
        );
        sqlx::query_as(&sql)
            .bind(scope)
            .bind(key)
            .fetch_optional(pool)
            .await
    }

    async fn key_records<'a>(
        pool: &'a Pool<Self>,
        filter: &'a KeyFilter,
    ) -> Result<Vec<KeyRecord>, sqlx::Error> {
        let mut conditions = Vec::new();
        let mut binds = Vec::new();
        for (column, value) in [
            ("scope", &filter.scope),
            ("step", &filter.step),
            ("status", &filter.status),
        ] {
            if let Some(value) = value {
                binds.push(value.as_str());
                conditions.push(format!("{column} = ?"));
            }
        }
        if !filter.include_expired {
            conditions.push(format!("expires_at > {}", now_ms!()));
        }
        let mut sql = format!("SELECT {} FROM idempotency_keys", admin_columns());
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(&format!(
            " ORDER BY created_at DESC, scope, `key` LIMIT {}",
            filter.limit
        ));
        let mut query = sqlx::query_as(&sql);
        for value in binds {
            query = query.bind(value);
        }
        query.fetch_all(pool).await
    }

    async fn inbox_records<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> Result<Vec<KeyRecord>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM idempotency_keys WHERE `key` = ? AND scope LIKE '%:inbox/%' \
             ORDER BY scope",
            admin_columns()
        );
        sqlx::query_as(&sql).bind(message_id).fetch_all(pool).await
    }

    async fn step_counts(pool: &Pool<Self>) -> Result<Vec<StepCount>, sqlx::Error> {
        let now = now_ms!();
        let sql = format!(
            "SELECT CAST(step AS CHAR) AS step, \
               CAST(SUM(CASE WHEN expires_at > {now} THEN 1 ELSE 0 END) AS SIGNED) AS live, \
               CAST(SUM(CASE WHEN expires_at > {now} AND status = 'in_progress' \
                 AND locked_until > {now} THEN 1 ELSE 0 END) AS SIGNED) AS in_progress, \
               CAST(COUNT(*) AS SIGNED) AS total \
             FROM idempotency_keys GROUP BY step ORDER BY step"
        );
        sqlx::query_as(&sql).fetch_all(pool).await
    }

    async fn count_expired(pool: &Pool<Self>) -> Result<u64, sqlx::Error> {
        sqlx::query_scalar::<_, i64>(concat!(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM idempotency_keys WHERE expires_at <= ",
            now_ms!()
        ))
        .fetch_one(pool)
        .await
        .map(|n| n.max(0) as u64)
    }
}

/// A completed-record statement of this file with its values bound.
fn bind_completed<'q>(
    sql: &'q str,
    op: &'q Operation,
    response: &'q StoredResponse,
    retention: Duration,
) -> Query<'q, MySql, MySqlArguments> {
    keyed(sql, op)
        .bind(op.step)
        .bind(&op.fingerprint.0[..])
        .bind(i64::from(response.status))
        .bind(&response.content_type)
        .bind(&response.body)
        .bind(encode_headers(&response.headers))
        .bind(millis(retention))
}

/// The key record's columns as operators see them. Text in a binary
/// collation is cast, so it decodes as text.
fn admin_columns() -> String {
    format!(
        "CAST(scope AS CHAR) AS scope, CAST(`key` AS CHAR) AS `key`, CAST(step AS CHAR) AS step, \
         CAST(status AS CHAR) AS status, fingerprint, \
         CAST(response_status AS SIGNED) AS response_status, \
         CAST(response_content_type AS CHAR) AS response_content_type, \
         SUBSTRING(response_body, 1, {BODY_EXCERPT}) AS body_excerpt, \
         CAST(LENGTH(response_body) AS SIGNED) AS body_bytes, created_at AS created_at_ms, \
         locked_until AS locked_until_ms, expires_at AS expires_at_ms, \
         {} AS read_at_ms",
        now_ms!()
    )
}
