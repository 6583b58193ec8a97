//! SQLite: the embedded default.
//!
//! Claims take the database's write lock up front (`BEGIN IMMEDIATE`) instead
//! of upgrading a deferred transaction, and wait for it at most the claim's
//! `wait_timeout` (its `busy_timeout`). Claims from one engine (and its
//! clones) queue in process, first come first served, before asking for the
//! lock, so they are not left
//! to the busy handler's sleeps (1, 2, 5 ... 100 ms): under 64 concurrent
//! duplicates of one key that took 0.4-1.8 s per key; queued, it takes tens of
//! milliseconds. Other processes still meet at `busy_timeout`. Replays and
//! conflicts are answered by a read in WAL mode, which never waits for the
//! write lock.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Pool, Row, Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::{
    encode_headers, keyed, millis, response_from_columns, Locked, Record, RecordStatus, Store,
};
use crate::operation::Operation;
use crate::outcome::StoredResponse;
use crate::policy::Policy;

/// idem's migrations, applied by [`crate::migrations`] with their own
/// bookkeeping table.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate::Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("../migrations/sqlite")
};

/// Opens (creating if missing) a SQLite database file configured for idem:
/// WAL journal, `synchronous = FULL`, a `busy_timeout` of `policy.wait_timeout`,
/// and a pool of `max_connections`.
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use idem_runtime::{store::sqlite, Policy};
/// let pool = sqlite::open("idem.db", &Policy::default(), 8).await?;
/// # Ok(()) }
/// ```
pub async fn open(
    path: impl AsRef<Path>,
    policy: &Policy,
    max_connections: u32,
) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    pool(options, policy, max_connections).await
}

/// Like [`open`], from a `sqlite:` URL (`sqlite::memory:` included).
pub async fn connect(
    url: &str,
    policy: &Policy,
    max_connections: u32,
) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(url)?.create_if_missing(true);
    pool(options, policy, max_connections).await
}

async fn pool(
    options: SqliteConnectOptions,
    policy: &Policy,
    max_connections: u32,
) -> Result<SqlitePool, sqlx::Error> {
    let options = options
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(policy.wait_timeout);
    SqlitePoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .acquire_timeout(policy.wait_timeout.max(Duration::from_secs(5)))
        .connect_with(options)
        .await
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

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

impl Store for Sqlite {
    const SERIALIZE_WRITERS: bool = true;

    type Settings = ();
    const SELECT_RECORD: &'static str = SELECT_RECORD;

    fn record(row: &<Self as sqlx::Database>::Row) -> Result<Record, sqlx::Error> {
        record(row)
    }

    fn migrator() -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    const MIGRATION_DIALECT: crate::migrations::Dialect = crate::migrations::Dialect {
        create_table: "CREATE TABLE IF NOT EXISTS _idem_migrations (
            version BIGINT PRIMARY KEY,
            description TEXT NOT NULL,
            installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
            success BOOLEAN NOT NULL,
            checksum BLOB NOT NULL,
            execution_time BIGINT NOT NULL
        )",
        count_tables: "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
        lock: None,
        after: None,
    };

    async fn run_migrations(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError> {
        crate::migrations::run_on(pool).await
    }

    async fn pending_migrations(
        pool: &Pool<Self>,
    ) -> Result<Vec<crate::migrations::PendingMigration>, sqlx::migrate::MigrateError> {
        crate::migrations::pending_on(pool).await
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

    async fn lookup_unlocked<'a>(
        conn: &'a mut SqliteConnection,
        op: &'a Operation,
    ) -> Result<Option<Record>, sqlx::Error> {
        super::lookup_unlocked::<Self>(conn, op).await
    }

    async fn write_completed<'a>(
        conn: &'a mut SqliteConnection,
        op: &'a Operation,
        response: &'a StoredResponse,
        policy: &'a Policy,
        replace: bool,
    ) -> Result<(), sqlx::Error> {
        let now = now_ms();
        keyed(
            if replace {
                UPSERT_COMPLETED
            } else {
                INSERT_COMPLETED
            },
            op,
        )
        .bind(op.step)
        .bind(&op.fingerprint.0[..])
        .bind(i64::from(response.status))
        .bind(&response.content_type)
        .bind(&response.body)
        .bind(now)
        .bind(now.saturating_add(millis(policy.retention)))
        .bind(encode_headers(&response.headers))
        .execute(conn)
        .await?;
        Ok(())
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

    async fn release_claim<'a>(
        pool: &'a Pool<Self>,
        op: &'a Operation,
        token: i64,
    ) -> Result<(), sqlx::Error> {
        keyed("DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND status = 'in_progress'", op)
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

    fn is_lock_busy(error: &sqlx::Error) -> bool {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        let code = match error {
            sqlx::Error::Database(db) => db.code().and_then(|code| code.parse::<i32>().ok()),
            _ => None,
        };
        matches!(code.map(|c| c & 0xff), Some(5 | 6))
    }
}

impl crate::Engine<Sqlite> {
    /// An engine on a SQLite file (created if missing) with the default policy
    /// and a pool of 8 connections.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), sqlx::Error> {
    /// let engine = idem_runtime::Engine::<sqlx::Sqlite>::open_sqlite("idem.db").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open_sqlite(path: impl AsRef<Path>) -> Result<Self, sqlx::Error> {
        Ok(Self::new(open(path, &Policy::default(), 8).await?))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use crate::{Claim, Engine, IdemError, IdempotencyKey, Operation, Policy, Scope};

    /// An engine opened with the default policy, then given a shorter
    /// `wait_timeout`, waits that long for another writer's lock, not the
    /// default's 5 s.
    #[tokio::test]
    async fn a_later_policy_bounds_the_wait_for_the_write_lock() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("idem-busy-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("idem.db");
        let engine = Engine::<sqlx::Sqlite>::open_sqlite(&path)
            .await
            .unwrap()
            .with_policy(Policy::default().with_wait_timeout(Duration::from_millis(200)));
        engine.migrate().await.unwrap();
        // Another process's writer: its own pool, holding the write lock.
        let other = super::open(&path, &Policy::default(), 1).await.unwrap();
        let mut holder = other.acquire().await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *holder)
            .await
            .unwrap();
        let op = Operation::new(
            Scope::tenant("acme"),
            IdempotencyKey::new("k-busy").unwrap(),
            "charge.v1",
            &1i64,
        );
        let started = Instant::now();
        match engine.claim(&op).await {
            Err(IdemError::StoreBusy { .. }) => {}
            Err(other) => panic!("expected store busy, got {other:?}"),
            Ok(Claim::Execute(_)) => panic!("claimed while another writer holds the lock"),
            Ok(Claim::Replay(_)) => panic!("replayed a key never stored"),
        }
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(2), "waited {waited:?}");
        sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
        drop(holder);
        other.close().await;
        engine.pool().close().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
