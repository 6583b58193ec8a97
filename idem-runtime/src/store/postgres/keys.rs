//! Postgres' claim statements (see the [module docs](super) for the
//! protocol): the advisory or row lock, the record read under it, the
//! completed record and the commit in one message.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, Pool, Postgres, Row, Transaction};

use super::{
    execute_on, fetch_one_on, named_statements, statement, KeyLock, PgSettings, Pooler, WaitBound,
};
use crate::operation::Operation;
use crate::outcome::StoredResponse;
use crate::policy::Policy;
use crate::store::keys::{
    encode_headers, key_administration, keyed, millis, record_writes, response_from_columns, Fresh,
    KeyFilter, KeyRecord, Keys, Locked, Record, RecordStatus, StepCount, BODY_EXCERPT,
};

/// The record's read, shared by the two statements below.
macro_rules! select_record {
    () => {
        "SELECT status, fingerprint, response_status::int8, response_content_type, response_body, \
           expires_at <= statement_timestamp() AS expired, \
           (EXTRACT(EPOCH FROM (locked_until - statement_timestamp())) * 1000)::int8 AS lock_left_ms, \
           response_headers \
         FROM idempotency_keys WHERE scope = $1 AND key = $2"
    };
}

const SELECT_RECORD: &str = select_record!();

/// The record's read under its row lock ([`KeyLock::Row`]).
const LOCK_RECORD: &str = concat!(select_record!(), " FOR UPDATE");

fn record(row: &PgRow) -> Result<Record, sqlx::Error> {
    let status: String = row.try_get(0)?;
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
        expired: row.try_get(5)?,
        lock_left: (lock_left_ms > 0).then(|| Duration::from_millis(lock_left_ms as u64)),
    })
}

/// The SQLSTATE the fresh message's check refuses a key with a record with.
const HAS_RECORD: &str = "IDEMK";

/// The SQLSTATE of an `EXECUTE` of a statement this session has not prepared.
const NOT_PREPARED: &str = "26000";

/// Opens a full claim's transaction on a connection that then holds the
/// prepared statements of the fresh path and of the completion (those the
/// session lacks: one after a pooler's `DEALLOCATE ALL`, one opened by a pool
/// without [`prepare_claims`]).
const PREPARE_THEN_BEGIN: &str = "SELECT idem_prepare_claims(); BEGIN";

/// The record the fresh message's check sends back in its error's DETAIL.
#[derive(serde::Deserialize)]
struct FoundRecord {
    status: String,
    fingerprint: String,
    response_status: Option<i64>,
    response_content_type: Option<String>,
    response_body: Option<String>,
    expired: bool,
    lock_left_ms: Option<i64>,
    response_headers: Option<String>,
}

/// Decodes the DETAIL of a refusal; `None` if it is not one, or if
/// its stored response is unreadable (the claim then reads the record the
/// ordinary way, which reports the corruption as a store error).
fn record_from_detail(detail: &str) -> Option<Record> {
    let found: FoundRecord = serde_json::from_str(detail).ok()?;
    let body = match found.response_body {
        Some(hex) => Some(crate::hex::decode(&hex)?),
        None => None,
    };
    let lock_left_ms = found.lock_left_ms.unwrap_or(0);
    Some(Record {
        status: RecordStatus::parse(&found.status),
        fingerprint: crate::hex::decode(&found.fingerprint)?,
        response: response_from_columns(
            found.response_status,
            found.response_content_type,
            body,
            found.response_headers,
        )
        .ok()?,
        expired: found.expired,
        lock_left: (lock_left_ms > 0).then(|| Duration::from_millis(lock_left_ms as u64)),
    })
}

/// `text` as a Postgres escape-string literal (`E'…'`): backslashes and quotes
/// escaped, so it reads the same whatever `standard_conforming_strings` says.
/// `None` for text with a NUL, which no Postgres text can hold.
fn literal(text: &str) -> Option<String> {
    let mut quoted = String::with_capacity(text.len() + 4);
    quoted.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => quoted.push_str("\\\\"),
            '\'' => quoted.push_str("''"),
            '\0' => return None,
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    Some(quoted)
}

/// Bounds the claim's lock waits; answers the bound it replaces.
const BOUND_LOCK_WAIT: &str =
    "SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)";

/// A row-locked claim's own row, for a key without a committed record. A
/// duplicate's insert waits on it until this transaction ends.
macro_rules! insert_claim_row {
    () => {
        "INSERT INTO idempotency_keys \
         (scope, key, step, fingerprint, status, created_at, locked_until, expires_at) \
         VALUES ($1, $2, $3, $4, 'in_progress', now(), now(), now() + $5 * interval '1 millisecond') \
         ON CONFLICT (scope, key) DO NOTHING"
    };
}

/// The claim row's insert that also restores the lock wait bound
/// ([`WaitBound::SetConfig`]).
const INSERT_CLAIM_ROW: &str = concat!(
    insert_claim_row!(),
    " RETURNING set_config('lock_timeout', $6, true)"
);

/// The claim row's insert alone ([`WaitBound::SetLocal`] restores the bound
/// with a statement of its own).
const INSERT_CLAIM_ROW_ONLY: &str = concat!(insert_claim_row!(), " RETURNING true");

const RESTORE_LOCK_WAIT: &str = "SELECT set_config('lock_timeout', $1, true)";

/// The completed record's insert, its values bound (the migration prepares
/// the same statement in each session as `idem_v1_insert_completed`).
macro_rules! insert_completed {
    () => {
        "INSERT INTO idempotency_keys \
         (scope, key, step, fingerprint, status, response_status, response_content_type, response_body, \
          response_headers, claim_token, created_at, locked_until, expires_at) \
         VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $9, NULL, now(), now(), now() + $8 * interval '1 millisecond')"
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
    " ON CONFLICT (scope, key) DO UPDATE SET step = EXCLUDED.step, fingerprint = EXCLUDED.fingerprint, \
       status = 'completed', response_status = EXCLUDED.response_status, \
       response_content_type = EXCLUDED.response_content_type, response_body = EXCLUDED.response_body, \
       response_headers = EXCLUDED.response_headers, claim_token = NULL, created_at = EXCLUDED.created_at, \
       locked_until = EXCLUDED.locked_until, expires_at = EXCLUDED.expires_at"
);

/// Bodies up to this size travel as literals in the commit message; a larger
/// one is bound to a prepared insert (its hex literal would be parsed by the
/// server at twice its size).
const LITERAL_BODY_LIMIT: usize = 64 * 1024;

/// `bound` with each parameter `$n` replaced by `values[n - 1]`, in one pass
/// (a value's own text is never read as a parameter).
fn spell_out(bound: &str, values: &[String]) -> String {
    let mut sql =
        String::with_capacity(bound.len() + values.iter().map(String::len).sum::<usize>());
    let mut rest = bound;
    while let Some(at) = rest.find('$') {
        sql.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len() - at - 1, |end| end);
        let n: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .expect("a bound parameter");
        sql.push_str(&values[n - 1]);
        rest = &rest[at + 1 + digits..];
    }
    sql.push_str(rest);
    sql
}

/// The completed record's insert (or upsert, with `replace`) with its values
/// as literals, then `COMMIT; BEGIN`: one simple-protocol message that stores
/// the record and commits the claim. With `prepared` (the claim's
/// fresh-first message executed this session's prepared statements) the
/// insert is `idem_v1_insert_completed`, planned once per connection;
/// otherwise the statement itself. The empty transaction it leaves open is
/// the one sqlx's [`Transaction`] ends with its queued `ROLLBACK` when
/// dropped (sent with the pool's check on the connection's return, off the
/// request's path). `None` when a value cannot travel as a literal (a NUL in
/// text, a large body).
fn commit_message(
    op: &Operation,
    response: &StoredResponse,
    policy: &Policy,
    replace: bool,
    prepared: bool,
) -> Option<String> {
    if response.body.len() > LITERAL_BODY_LIMIT {
        return None;
    }
    let bytes = |value: &[u8]| format!("decode('{}', 'hex')", crate::hex::encode(value));
    let headers = match encode_headers(&response.headers) {
        Some(headers) => literal(&headers)?,
        None => "NULL".to_owned(),
    };
    // In the order of the bound statements' parameters.
    let values = [
        literal(op.scope.as_stored())?,
        literal(op.key.as_str())?,
        literal(op.step)?,
        bytes(&op.fingerprint.0),
        response.status.to_string(),
        literal(&response.content_type)?,
        bytes(&response.body),
        millis(policy.retention).to_string(),
        headers,
    ];
    // A fresh-first claim found no record: it never replaces one.
    let statement = if prepared && !replace {
        format!("EXECUTE idem_v1_insert_completed({})", values.join(", "))
    } else {
        spell_out(
            if replace {
                UPSERT_COMPLETED
            } else {
                INSERT_COMPLETED
            },
            &values,
        )
    };
    Some(statement + "; COMMIT; BEGIN")
}

const UPSERT_IN_PROGRESS: &str = "INSERT INTO idempotency_keys AS k \
     (scope, key, step, fingerprint, status, claim_token, created_at, locked_until, expires_at) \
     VALUES ($1, $2, $3, $4, 'in_progress', $5, now(), \
             statement_timestamp() + $6 * interval '1 millisecond', now() + $7 * interval '1 millisecond') \
     ON CONFLICT (scope, key) DO UPDATE SET step = EXCLUDED.step, fingerprint = EXCLUDED.fingerprint, \
       status = 'in_progress', response_status = NULL, response_content_type = NULL, response_body = NULL, \
       response_headers = NULL, claim_token = EXCLUDED.claim_token, created_at = EXCLUDED.created_at, \
       locked_until = EXCLUDED.locked_until, expires_at = EXCLUDED.expires_at";

const COMPLETE_CLAIM: &str =
    "UPDATE idempotency_keys SET status = 'completed', response_status = $4, \
       response_content_type = $5, response_body = $6, response_headers = $8, claim_token = NULL, locked_until = now(), \
       expires_at = now() + $7 * interval '1 millisecond' \
     WHERE scope = $1 AND key = $2 AND claim_token = $3 AND status = 'in_progress'";

impl Keys for Postgres {
    type Settings = PgSettings;
    const SELECT_RECORD: &'static str = SELECT_RECORD;

    fn decode_record(row: &<Self as sqlx::Database>::Row) -> Result<Record, sqlx::Error> {
        record(row)
    }

    async fn lock_and_read<'a>(
        conn: PoolConnection<Self>,
        op: &'a Operation,
        policy: &'a Policy,
        settings: PgSettings,
    ) -> Result<Locked<Self>, sqlx::Error> {
        let PgSettings {
            key_lock,
            pooler,
            wait_bound,
            ..
        } = settings;
        // Behind a transaction pooler the session is not the claim's: no
        // statements prepared in it, and each of idem's statements unnamed,
        // inside the transaction that holds the server connection.
        let session = pooler == Pooler::Session;
        // sqlx's constructor for a transaction on a connection already taken
        // from the pool (public, hidden from its docs; what `Pool::begin`
        // calls); with advisory locks, opened after the fresh path's
        // statements are prepared, for the connection's next claims.
        let begin = (key_lock == KeyLock::Advisory && session).then_some(PREPARE_THEN_BEGIN.into());
        let mut tx = Transaction::begin(conn, begin).await?;
        let wait_ms = i32::try_from(millis(policy.wait_timeout))
            .unwrap_or(i32::MAX)
            .max(1);
        if key_lock == KeyLock::Row {
            return lock_row_and_read(tx, op, policy, wait_ms, session, wait_bound).await;
        }
        let row = sqlx::query("SELECT * FROM idem_lock_and_read($1, $2, $3, $4)")
            .persistent(session)
            .bind(op.lock_id())
            .bind(wait_ms)
            .bind(op.scope.as_stored())
            .bind(op.key.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let record = row.as_ref().map(record).transpose()?;
        Ok(Locked {
            tx,
            record,
            holds_row: false,
        })
    }

    fn fresh_first(settings: PgSettings) -> bool {
        settings.key_lock == KeyLock::Advisory && settings.pooler == Pooler::Session
    }

    fn reads_before_lock(settings: PgSettings) -> bool {
        // An unlocked read is a statement outside any transaction, which a
        // transaction pooler may split across server connections.
        settings.pooler == Pooler::Session
    }

    async fn lock_if_fresh<'a>(
        conn: PoolConnection<Self>,
        op: &'a Operation,
        policy: &'a Policy,
    ) -> Result<Fresh<Self>, sqlx::Error> {
        let wait_ms = i32::try_from(millis(policy.wait_timeout))
            .unwrap_or(i32::MAX)
            .max(1);
        // One simple-protocol message: the lock and the check run in its
        // implicit transaction, which the trailing BEGIN turns into the
        // claim's transaction (rows discarded; an error rolls all of it back
        // and leaves the connection idle). The values travel as literals.
        let (Some(scope), Some(key)) = (literal(op.scope.as_stored()), literal(op.key.as_str()))
        else {
            // Not expressible as a literal: claimed the usual way, whose
            // bound parameters give the database's own error.
            return Ok(Fresh::Found(None));
        };
        let statement = format!(
            "EXECUTE idem_v1_lock({}, {wait_ms}); EXECUTE idem_v1_check({scope}, {key}); BEGIN",
            op.lock_id(),
        );
        // sqlx's constructor for a transaction on a connection already taken
        // from the pool, with the statement that opens it.
        match Transaction::begin(conn, Some(statement.into())).await {
            Ok(tx) => Ok(Fresh::Locked(tx)),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(HAS_RECORD) => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|pg| pg.detail());
                Ok(Fresh::Found(detail.and_then(record_from_detail)))
            }
            // A connection without the prepared statements yet: nothing ran;
            // the full claim prepares them on the connection it gets.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(NOT_PREPARED) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        "a pool connection lacks idem's prepared statements, so its claims take \
                         the full way (slower, and an error line in the server's log each time): \
                         build the pool with idem_runtime::store::postgres::pool_options, or call \
                         prepare_claims from its after_connect"
                    );
                });
                Ok(Fresh::Found(None))
            }
            Err(error) => Err(error),
        }
    }

    async fn commit_completed<'a>(
        mut tx: Transaction<'static, Self>,
        op: &'a Operation,
        response: &'a StoredResponse,
        policy: &'a Policy,
        replace: bool,
        fresh_first: bool,
    ) -> Result<(), sqlx::Error> {
        let Some(message) = commit_message(op, response, policy, replace, fresh_first) else {
            Self::write_completed(&mut tx, op, response, policy, replace).await?;
            return tx.commit().await;
        };
        // A failed insert skips the rest of the message and leaves the
        // transaction aborted; dropping `tx` rolls it back either way.
        sqlx::Executor::execute(&mut *tx, message.as_str()).await?;
        Ok(())
    }

    async fn write_in_progress<'a>(
        conn: &'a mut PgConnection,
        op: &'a Operation,
        token: i64,
        policy: &'a Policy,
    ) -> Result<(), sqlx::Error> {
        keyed(UPSERT_IN_PROGRESS, op)
            .persistent(named_statements())
            .bind(op.step)
            .bind(&op.fingerprint.0[..])
            .bind(token)
            .bind(millis(policy.lock_ttl) as f64)
            .bind(millis(policy.retention.max(policy.lock_ttl)) as f64)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn write_claimed<'a>(
        conn: &'a mut PgConnection,
        op: &'a Operation,
        token: i64,
        response: &'a StoredResponse,
        policy: &'a Policy,
    ) -> Result<bool, sqlx::Error> {
        let done = keyed(COMPLETE_CLAIM, op)
            .persistent(named_statements())
            .bind(token)
            .bind(response.status as i16)
            .bind(&response.content_type)
            .bind(&response.body)
            .bind(millis(policy.retention) as f64)
            .bind(encode_headers(&response.headers))
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_batch(
        pool: &Pool<Self>,
        batch: u32,
        from: i64,
    ) -> Result<(u64, i64), sqlx::Error> {
        // No row locks taken ahead of the delete (each would be one more WAL
        // record per row). The outer `expires_at` check is evaluated again on a
        // row a claim rewrote meanwhile, so a record it just renewed stays.
        // `from` (microseconds since the epoch) is where the previous batch
        // stopped: the index entries before it point at rows deleted moments
        // ago, which a scan from the start would step over again every batch.
        // Nothing older can appear: a record expires after it is written.
        let query = sqlx::query(
            "WITH purged AS (\
               DELETE FROM idempotency_keys WHERE expires_at < now() AND (scope, key) IN \
                 (SELECT scope, key FROM idempotency_keys \
                  WHERE expires_at < now() AND expires_at >= 'epoch'::timestamptz + $2 * interval '1 microsecond' \
                  ORDER BY expires_at LIMIT $1) \
               RETURNING expires_at) \
             SELECT count(*), (extract(epoch FROM max(expires_at)) * 1000000)::int8 FROM purged",
        )
        .bind(i64::from(batch))
        .bind(from);
        let row = fetch_one_on(pool, query).await?;
        let (deleted, last): (i64, Option<i64>) = (row.try_get(0)?, row.try_get(1)?);
        Ok((deleted as u64, last.unwrap_or(from)))
    }

    async fn live_steps(pool: &Pool<Self>) -> Result<Vec<String>, sqlx::Error> {
        // No parameters: the simple protocol, one message on any pooler.
        let rows = sqlx::raw_sql(
            "SELECT DISTINCT step FROM idempotency_keys WHERE expires_at > now() ORDER BY step",
        )
        .fetch_all(pool)
        .await?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }

    async fn run_raw(conn: &mut PgConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, sql).await.map(drop)
    }

    fn is_lock_busy(error: &sqlx::Error) -> bool {
        // 55P03 lock_not_available: lock_timeout fired while waiting for the key's lock.
        matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
    }

    fn is_duplicate_record(error: &sqlx::Error) -> bool {
        // 23505 unique_violation on the key table's primary key: the only
        // statement of the commit message that inserts is the record's.
        matches!(error, sqlx::Error::Database(db)
            if db.code().as_deref() == Some("23505")
                && db.constraint() == Some("idempotency_keys_pkey"))
    }

    record_writes!();
    key_administration!(columns: admin_columns(), now: "now()");
}

/// A completed-record statement of this file with its values bound.
fn bind_completed<'q>(
    sql: &'q str,
    op: &'q Operation,
    response: &'q StoredResponse,
    policy: &Policy,
) -> Query<'q, Postgres, PgArguments> {
    keyed(sql, op)
        .persistent(named_statements())
        .bind(op.step)
        .bind(&op.fingerprint.0[..])
        .bind(response.status as i16)
        .bind(&response.content_type)
        .bind(&response.body)
        .bind(millis(policy.retention) as f64)
        .bind(encode_headers(&response.headers))
}

/// The key record's columns as operators see them.
fn admin_columns() -> String {
    format!(
        "scope::text, key::text, step, status, fingerprint, \
         response_status::int8 AS response_status, response_content_type, \
         substring(response_body FROM 1 FOR {BODY_EXCERPT}) AS body_excerpt, \
         octet_length(response_body)::int8 AS body_bytes, \
         (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms, \
         (extract(epoch FROM locked_until) * 1000)::int8 AS locked_until_ms, \
         (extract(epoch FROM expires_at) * 1000)::int8 AS expires_at_ms, \
         (extract(epoch FROM now()) * 1000)::int8 AS read_at_ms"
    )
}

/// [`KeyLock::Row`]: the key's own row is its lock (see the module docs).
async fn lock_row_and_read(
    mut tx: Transaction<'static, Postgres>,
    op: &Operation,
    policy: &Policy,
    wait_ms: i32,
    session: bool,
    wait_bound: WaitBound,
) -> Result<Locked<Postgres>, sqlx::Error> {
    let previous = bound_lock_wait(&mut tx, wait_ms, session, wait_bound).await?;
    loop {
        let insert = match wait_bound {
            WaitBound::SetConfig => INSERT_CLAIM_ROW,
            WaitBound::SetLocal => INSERT_CLAIM_ROW_ONLY,
        };
        let mut insert = keyed(insert, op)
            .persistent(session)
            .bind(op.step)
            .bind(&op.fingerprint.0[..])
            .bind(millis(policy.retention) as f64);
        if wait_bound == WaitBound::SetConfig {
            insert = insert.bind(&previous);
        }
        if insert.fetch_optional(&mut *tx).await?.is_some() {
            if wait_bound == WaitBound::SetLocal {
                restore_lock_wait(&mut tx, &previous, session, wait_bound).await?;
            }
            return Ok(Locked {
                tx,
                record: None,
                holds_row: true,
            });
        }
        // The key has a committed record (the insert waited for its
        // writer): lock it, then lift the bound. A record purged in between
        // sends the claim back to the insert.
        let Some(row) = keyed(LOCK_RECORD, op)
            .persistent(session)
            .fetch_optional(&mut *tx)
            .await?
        else {
            continue;
        };
        restore_lock_wait(&mut tx, &previous, session, wait_bound).await?;
        return Ok(Locked {
            record: Some(record(&row)?),
            tx,
            holds_row: false,
        });
    }
}

/// Bounds the claim's lock waits at `wait_ms`; answers the bound it replaces.
async fn bound_lock_wait(
    tx: &mut Transaction<'static, Postgres>,
    wait_ms: i32,
    session: bool,
    wait_bound: WaitBound,
) -> Result<String, sqlx::Error> {
    match wait_bound {
        WaitBound::SetConfig => {
            let (previous, _): (String, String) = sqlx::query_as(BOUND_LOCK_WAIT)
                .persistent(session)
                .bind(format!("{wait_ms}ms"))
                .fetch_one(&mut **tx)
                .await?;
            Ok(previous)
        }
        WaitBound::SetLocal => {
            // One simple-protocol message; the SET has no rows.
            let message = format!(
                "SELECT current_setting('lock_timeout'); SET LOCAL lock_timeout = '{wait_ms}ms'"
            );
            let rows = sqlx::Executor::fetch_all(&mut **tx, message.as_str()).await?;
            rows.first().ok_or(sqlx::Error::RowNotFound)?.try_get(0)
        }
    }
}

/// Puts back the bound [`bound_lock_wait`] replaced.
async fn restore_lock_wait(
    tx: &mut Transaction<'static, Postgres>,
    previous: &str,
    session: bool,
    wait_bound: WaitBound,
) -> Result<(), sqlx::Error> {
    match wait_bound {
        WaitBound::SetConfig => {
            sqlx::query(RESTORE_LOCK_WAIT)
                .persistent(session)
                .bind(previous)
                .execute(&mut **tx)
                .await?;
        }
        WaitBound::SetLocal => {
            // The server's own spelling of the setting it just showed.
            let previous = previous.replace('\'', "''");
            let statement = format!("SET LOCAL lock_timeout = '{previous}'");
            sqlx::Executor::execute(&mut **tx, statement.as_str()).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_spelled_out_once() {
        let values = ["E'$2'".to_owned(), "E'$1 and $10'".to_owned()];
        assert_eq!(
            spell_out("VALUES ($1, $2) -- $2", &values),
            "VALUES (E'$2', E'$1 and $10') -- E'$1 and $10'"
        );
    }
}
