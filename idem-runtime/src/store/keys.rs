//! The key records: the claim's statements each backend implements, and
//! what every backend shares (the record's read, its columns' decoding).

use std::future::Future;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Transaction, Type};

use crate::operation::Operation;
use crate::outcome::StoredResponse;
use crate::policy::Policy;

/// The state of a stored key record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStatus {
    /// Claimed by an attempt that has not completed (durable claims only).
    InProgress,
    /// Completed; the response is stored.
    Completed,
}

impl RecordStatus {
    pub(crate) fn parse(text: &str) -> Self {
        if text == "completed" {
            Self::Completed
        } else {
            Self::InProgress
        }
    }
}

/// A key record as read by a claim.
#[derive(Debug, Clone)]
pub struct Record {
    /// In progress or completed.
    pub status: RecordStatus,
    /// The fingerprint of the request that created it.
    pub fingerprint: Vec<u8>,
    /// The stored response, for completed records.
    pub response: Option<StoredResponse>,
    /// Whether `expires_at` has passed.
    pub expired: bool,
    /// Time left on the lock; `None` once `locked_until` has passed.
    pub lock_left: Option<Duration>,
}

/// What a claim's first statements leave: its open transaction holding the
/// key's lock, and the record found under that lock.
#[derive(Debug)]
pub struct Locked<DB: sqlx::Database> {
    /// The claim's transaction.
    pub tx: Transaction<'static, DB>,
    /// The record the key had, if any.
    pub record: Option<Record>,
    /// Whether the claim wrote a row of its own for the key (a row lock), which
    /// the completed record then replaces.
    pub holds_row: bool,
}

/// What [`Keys::lock_if_fresh`] found.
#[derive(Debug)]
pub enum Fresh<DB: sqlx::Database> {
    /// The key had no record: the claim's transaction, holding its lock.
    Locked(Transaction<'static, DB>),
    /// The key has a record, read under its lock (`None` if it could not
    /// be brought back); nothing is held.
    Found(Option<Record>),
}

/// What a backend does for the engine's claims. Reachable by no one outside
/// this crate, which seals [`Backend`](super::Backend).
pub trait Keys: sqlx::Database + Sized {
    /// Settings that only this backend has (Postgres: its [`KeyLock`](super::postgres::KeyLock)).
    type Settings: Copy + Default + std::fmt::Debug + Send + Sync + 'static;

    /// The record's read by `(scope, key)`, for [`lookup_unlocked`](lookup_unlocked).
    const SELECT_RECORD: &'static str;

    /// Decodes a row of [`Keys::SELECT_RECORD`].
    fn decode_record(row: &Self::Row) -> Result<Record, sqlx::Error>;

    /// Whether the write lock is database-wide, so an engine queues its own
    /// claims in process before asking for it (SQLite).
    const SERIALIZE_WRITERS: bool = false;

    /// Opens the claim's transaction on `conn`, takes the key's lock as
    /// `settings` say (waiting at most `policy.wait_timeout`) and reads the
    /// record under it.
    fn lock_and_read<'a>(
        conn: PoolConnection<Self>,
        op: &'a Operation,
        policy: &'a Policy,
        settings: Self::Settings,
    ) -> impl Future<Output = Result<Locked<Self>, sqlx::Error>> + Send + 'a;

    /// Whether a claim reads the record before taking the key's lock, so a
    /// repeat is answered by one read without a transaction. Default: yes;
    /// Postgres behind a transaction pooler reads it under the lock only.
    fn reads_before_lock(_settings: Self::Settings) -> bool {
        true
    }

    /// Whether a claim first tries [`Keys::lock_if_fresh`] (Postgres with
    /// advisory key locks), instead of reading the record before the lock.
    fn fresh_first(_settings: Self::Settings) -> bool {
        false
    }

    /// Opens the claim's transaction on `conn` holding the key's lock, in
    /// one round trip, if the key has no record at all; when it has one
    /// (completed, in progress or expired), answers it, read under the
    /// lock, with nothing held and the connection gone back to the pool
    /// (`Found(None)` when the record, or the key, cannot travel this way:
    /// the caller then claims the usual way). Waits for a busy lock at
    /// most `policy.wait_timeout`. Called only when
    /// [`fresh_first`](Keys::fresh_first) says so; a backend that never
    /// claims fresh-first keeps this default, which sends nothing.
    fn lock_if_fresh<'a>(
        _conn: PoolConnection<Self>,
        _op: &'a Operation,
        _policy: &'a Policy,
    ) -> impl Future<Output = Result<Fresh<Self>, sqlx::Error>> + Send + 'a {
        std::future::ready(Ok(Fresh::Found(None)))
    }

    /// [`lookup_unlocked`](lookup_unlocked) for this backend.
    fn lookup_unlocked<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a;

    /// A group commit's turn opening on the writer's `conn`: `savepoint` (a
    /// statement without parameters), then [`Keys::lookup_unlocked`]. A
    /// backend that can sends both in one call.
    fn savepoint_and_lookup<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        savepoint: &'static str,
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a {
        async move {
            Self::run_raw(conn, savepoint).await?;
            Self::lookup_unlocked(conn, op).await
        }
    }

    /// Writes the completed record: a plain insert when the claim found no
    /// record, an upsert when it replaces an expired or taken-over one.
    fn write_completed<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        response: &'a StoredResponse,
        policy: &'a Policy,
        replace: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// [`write_completed`](Keys::write_completed), then commits `tx`. A
    /// backend that can send both in one message overrides this;
    /// `fresh_first` says the claim was locked by
    /// [`lock_if_fresh`](Keys::lock_if_fresh) on `tx`'s connection.
    fn commit_completed<'a>(
        mut tx: Transaction<'static, Self>,
        op: &'a Operation,
        response: &'a StoredResponse,
        policy: &'a Policy,
        replace: bool,
        _fresh_first: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a {
        async move {
            Self::write_completed(&mut tx, op, response, policy, replace).await?;
            tx.commit().await
        }
    }

    /// Writes an `in_progress` record owned by `token` (durable claims).
    fn write_in_progress<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        token: i64,
        policy: &'a Policy,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Writes the response into the `in_progress` record owned by `token`;
    /// `false` if another attempt took it over.
    fn write_claimed<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        token: i64,
        response: &'a StoredResponse,
        policy: &'a Policy,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Deletes the `in_progress` record owned by `token`, so a retry runs at once.
    fn release_claim<'a>(
        pool: &'a Pool<Self>,
        op: &'a Operation,
        token: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Deletes up to `batch` expired records, oldest first, by primary key,
    /// starting at `from`: `0` for a purge's first batch, then what the
    /// previous batch returned (a backend-specific position in `expires_at`).
    /// Returns how many went and where the next batch starts.
    fn purge_batch(
        pool: &Pool<Self>,
        batch: u32,
        from: i64,
    ) -> impl Future<Output = Result<(u64, i64), sqlx::Error>> + Send + '_;

    /// The distinct steps that still have unexpired records.
    fn live_steps(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + '_;

    /// Whether `error` means "the key's lock is held by another attempt".
    fn is_lock_busy(error: &sqlx::Error) -> bool;

    /// Whether `error`, from [`Keys::commit_completed`], means the key's
    /// record was committed meanwhile by another attempt, which this
    /// transaction's snapshot did not show it (a unique violation on the
    /// key under `REPEATABLE READ` or `SERIALIZABLE`). Default: never.
    fn is_duplicate_record(_error: &sqlx::Error) -> bool {
        false
    }

    /// Runs `sql`, statements without parameters (the group commit's
    /// savepoints), on `conn`.
    fn run_raw<'a>(
        conn: &'a mut Self::Connection,
        sql: &'static str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Writes a completed record for `op` carrying `response` unless the key
    /// has one (the inbox's rejection of a poisoned message), expiring after
    /// `retention`.
    fn write_completed_if_absent<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        response: &'a StoredResponse,
        retention: Duration,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Deletes the record of `(scope, key)`, whatever its state; whether
    /// there was one.
    fn delete_record<'a>(
        conn: &'a mut Self::Connection,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// The record of `(scope, key)` as operators see it, expired or not.
    fn key_record<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<KeyRecord>, sqlx::Error>> + Send + 'a;

    /// The records `filter` selects, newest first.
    fn key_records<'a>(
        pool: &'a Pool<Self>,
        filter: &'a KeyFilter,
    ) -> impl Future<Output = Result<Vec<KeyRecord>, sqlx::Error>> + Send + 'a;

    /// The records every consumer's inbox keeps for `message_id`.
    fn inbox_records<'a>(
        pool: &'a Pool<Self>,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Vec<KeyRecord>, sqlx::Error>> + Send + 'a;

    /// Every step with records, with its counts, sorted by step.
    fn step_counts(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<StepCount>, sqlx::Error>> + Send + '_;

    /// How many records have expired and await the purge.
    fn count_expired(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;
}

/// The first bytes of a stored body an operator's view carries.
pub const BODY_EXCERPT: usize = 512;

/// One key record, as operators see it. Times are Unix milliseconds.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct KeyRecord {
    /// The stored scope (`<len>:<part>/...`).
    pub scope: String,
    /// The key (left out of serialized views: keys can carry client data).
    #[serde(skip)]
    pub key: String,
    /// The step that wrote it.
    pub step: String,
    /// `in_progress` or `completed`.
    pub status: String,
    /// The request's SHA-256.
    #[serde(skip)]
    pub fingerprint: Vec<u8>,
    /// The stored response's status.
    pub response_status: Option<i64>,
    /// The stored response's content type.
    pub response_content_type: Option<String>,
    /// The first [`BODY_EXCERPT`] bytes of the stored body.
    #[serde(skip)]
    pub body_excerpt: Option<Vec<u8>>,
    /// The whole body's length in bytes.
    pub body_bytes: Option<i64>,
    /// When the record was created.
    pub created_at_ms: i64,
    /// Until when its claim holds the key.
    pub locked_until_ms: i64,
    /// When it expires (is treated as absent, then purged).
    pub expires_at_ms: i64,
    /// The store's clock when the record was read.
    pub read_at_ms: i64,
}

/// A step's records in one store.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct StepCount {
    /// The step.
    pub step: String,
    /// Unexpired records.
    pub live: i64,
    /// Unexpired records whose claim still holds the key.
    pub in_progress: i64,
    /// All records, expired ones included.
    pub total: i64,
}

/// Which records [`key_records`](crate::admin::key_records) returns.
#[derive(Debug, Clone, Default)]
pub struct KeyFilter {
    /// Only this stored scope.
    pub scope: Option<String>,
    /// Only this step.
    pub step: Option<String>,
    /// Only this status.
    pub status: Option<String>,
    /// Expired ones too.
    pub include_expired: bool,
    /// At most this many, newest first.
    pub limit: u32,
}

/// The record writes that are the same on every backend but for the
/// statements' text: expands to those methods of [`Keys`], calling the
/// backend's own `INSERT_COMPLETED`, `UPSERT_COMPLETED`,
/// `INSERT_COMPLETED_IF_ABSENT`, `bind_completed` and `execute_on` (a
/// statement on the pool, as the backend's pooling needs it).
macro_rules! record_writes {
    () => {
        async fn lookup_unlocked<'a>(
            conn: &'a mut Self::Connection,
            op: &'a Operation,
        ) -> Result<Option<Record>, sqlx::Error> {
            crate::store::keys::lookup_unlocked::<Self>(conn, op).await
        }

        async fn write_completed<'a>(
            conn: &'a mut Self::Connection,
            op: &'a Operation,
            response: &'a StoredResponse,
            policy: &'a Policy,
            replace: bool,
        ) -> Result<(), sqlx::Error> {
            let sql = if replace {
                UPSERT_COMPLETED
            } else {
                INSERT_COMPLETED
            };
            bind_completed(sql, op, response, policy)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn write_completed_if_absent<'a>(
            conn: &'a mut Self::Connection,
            op: &'a Operation,
            response: &'a StoredResponse,
            retention: Duration,
        ) -> Result<(), sqlx::Error> {
            let policy = Policy::default().with_retention(retention);
            bind_completed(INSERT_COMPLETED_IF_ABSENT, op, response, &policy)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn release_claim<'a>(
            pool: &'a Pool<Self>,
            op: &'a Operation,
            token: i64,
        ) -> Result<(), sqlx::Error> {
            let query = keyed(
                "DELETE FROM idempotency_keys \
                 WHERE scope = $1 AND key = $2 AND claim_token = $3 AND status = 'in_progress'",
                op,
            )
            .bind(token);
            execute_on(pool, query).await?;
            Ok(())
        }
    };
}
pub(crate) use record_writes;

/// The operators' statements on the key table, the same on every backend
/// but for the record's columns (`$columns`, with `$now`, the backend's
/// clock in the columns' type): expands to those methods of [`Keys`],
/// calling the backend's own `statement` (a statement inside a transaction).
macro_rules! key_administration {
    (columns: $columns:expr, now: $now:expr) => {
        async fn delete_record<'a>(
            conn: &'a mut Self::Connection,
            scope: &'a str,
            key: &'a str,
        ) -> Result<bool, sqlx::Error> {
            statement("DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2")
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
                "SELECT {} FROM idempotency_keys WHERE scope = $1 AND key = $2",
                $columns
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
                    conditions.push(format!("{column} = ${}", binds.len()));
                }
            }
            if !filter.include_expired {
                conditions.push(format!("expires_at > {}", $now));
            }
            let mut sql = format!("SELECT {} FROM idempotency_keys", $columns);
            if !conditions.is_empty() {
                sql.push_str(" WHERE ");
                sql.push_str(&conditions.join(" AND "));
            }
            sql.push_str(&format!(
                " ORDER BY created_at DESC, scope, key LIMIT {}",
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
                "SELECT {} FROM idempotency_keys WHERE key = $1 AND scope LIKE '%:inbox/%' \
                 ORDER BY scope",
                $columns
            );
            sqlx::query_as(&sql).bind(message_id).fetch_all(pool).await
        }

        async fn step_counts(pool: &Pool<Self>) -> Result<Vec<StepCount>, sqlx::Error> {
            let now = $now;
            let sql = format!(
                "SELECT step, \
                   CAST(sum(CASE WHEN expires_at > {now} THEN 1 ELSE 0 END) AS BIGINT) AS live, \
                   CAST(sum(CASE WHEN expires_at > {now} AND status = 'in_progress' \
                     AND locked_until > {now} THEN 1 ELSE 0 END) AS BIGINT) AS in_progress, \
                   CAST(count(*) AS BIGINT) AS total \
                 FROM idempotency_keys GROUP BY step ORDER BY step"
            );
            sqlx::query_as(&sql).fetch_all(pool).await
        }

        async fn count_expired(pool: &Pool<Self>) -> Result<u64, sqlx::Error> {
            let sql = format!(
                "SELECT CAST(count(*) AS BIGINT) FROM idempotency_keys WHERE expires_at <= {}",
                $now
            );
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(pool)
                .await
                .map(|n| n.max(0) as u64)
        }
    };
}
pub(crate) use key_administration;

/// Reads the record outside any transaction: a claim starts with this read
/// (after the fresh-first message, on a backend that sends one), so replays
/// and conflicts never take a lock or open a transaction.
pub(crate) async fn lookup_unlocked<'c, DB: Keys>(
    conn: &'c mut DB::Connection,
    op: &Operation,
) -> Result<Option<Record>, sqlx::Error>
where
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    lookup_by::<DB>(conn, op, DB::SELECT_RECORD).await
}

/// The record's read by `sql`: [`Keys::SELECT_RECORD`], alone or after
/// statements without parameters sent in the same call.
pub(crate) async fn lookup_by<'c, DB: Keys>(
    conn: &'c mut DB::Connection,
    op: &Operation,
    sql: &str,
) -> Result<Option<Record>, sqlx::Error>
where
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    let row = keyed(sql, op).fetch_optional(conn).await?;
    row.as_ref().map(DB::decode_record).transpose()
}

/// `sql` with the operation's scope and key bound as its first two parameters.
pub(crate) fn keyed<'q, DB: Database>(
    sql: &'q str,
    op: &'q Operation,
) -> Query<'q, DB, DB::Arguments<'q>>
where
    &'q str: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(op.scope.as_stored())
        .bind(op.key.as_str())
}

pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The stored response of a record, from its columns: `None` for a record
/// without one (in progress). A status that is not an HTTP status (a row
/// changed or damaged outside idem) is an error, so the claim fails closed
/// instead of taking the record for one without a response and running the
/// work again, or replaying a status no handler answered.
pub(crate) fn response_from_columns(
    status: Option<i64>,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    headers: Option<String>,
) -> Result<Option<StoredResponse>, sqlx::Error> {
    let Some(status) = status else {
        return Ok(None);
    };
    let status = u16::try_from(status)
        .ok()
        .filter(|status| (100..=599).contains(status))
        .ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "response_status".to_owned(),
            source: format!("the stored response's status {status} is not an HTTP status").into(),
        })?;
    Ok(Some(StoredResponse {
        status,
        content_type: content_type.unwrap_or_default(),
        body: body.unwrap_or_default(),
        headers: decode_headers(headers.as_deref()),
    }))
}

/// The `response_headers` column: a JSON array of `[name, value]` pairs, or
/// NULL when the response kept no headers (and in rows written before the
/// column existed).
pub(crate) fn encode_headers(headers: &[(String, String)]) -> Option<String> {
    if headers.is_empty() {
        return None;
    }
    serde_json::to_string(headers).ok()
}

/// Reads the `response_headers` column back; a value that is not such an
/// array replays no headers (and is logged), never fails the replay.
pub(crate) fn decode_headers(column: Option<&str>) -> Vec<(String, String)> {
    let Some(text) = column else {
        return Vec::new();
    };
    serde_json::from_str(text).unwrap_or_else(|error| {
        tracing::warn!(%error, "stored response headers could not be read; replaying without them");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_old_rows_have_none() {
        let headers = vec![
            ("location".to_owned(), "/payments/p_1".to_owned()),
            ("link".to_owned(), "</a>; rel=\"next\"".to_owned()),
            ("link".to_owned(), "</b>; rel=\"prev\"".to_owned()),
        ];
        let column = encode_headers(&headers);
        assert_eq!(decode_headers(column.as_deref()), headers);
        assert_eq!(encode_headers(&[]), None);
        assert!(decode_headers(None).is_empty());
        assert!(decode_headers(Some("not json")).is_empty());
    }

    #[test]
    fn a_stored_status_that_is_not_an_http_status_is_an_error() {
        for status in [-1, 0, 99, 600, 65_535, 70_000, i64::MIN] {
            assert!(
                response_from_columns(Some(status), None, None, None).is_err(),
                "{status}"
            );
        }
        assert!(response_from_columns(None, None, None, None)
            .unwrap()
            .is_none());
        let stored = response_from_columns(Some(201), None, Some(b"{}".to_vec()), None)
            .unwrap()
            .unwrap();
        assert_eq!((stored.status, stored.body.as_slice()), (201, &b"{}"[..]));
    }
}
