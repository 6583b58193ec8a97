//! SQLite: the embedded default.
//!
//! Claims take the database's write lock up front (`BEGIN IMMEDIATE`) instead
//! of upgrading a deferred transaction, and wait for it at most the claim's
//! `wait_timeout` (its `busy_timeout`). Claims from one engine (and its
//! clones) queue in process, first come first served, for the engine's one
//! writer, so they are not left to the busy handler's sleeps (1, 2, 5 ... 100
//! ms), and share its commits: concurrent claims run as turns of one batch
//! and one `COMMIT` ([`GroupCommit`](crate::GroupCommit); docs/OPERATIONS.md,
//! "SQLite group commit"). Other processes still meet at `busy_timeout`.
//! Replays and conflicts are answered by a read in WAL mode, which never
//! waits for the write lock.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Sqlite, SqlitePool};

use super::keys::millis;
use super::migrate::{Dialect, PendingMigration, Schema};
use crate::policy::Policy;

mod inbox;
mod keys;
mod outbox;

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

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

impl Schema for Sqlite {
    fn migrator() -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    const MIGRATION_DIALECT: Dialect = Dialect {
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
        question_marks: false,
    };

    async fn run_migrations(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError> {
        super::migrate::run_on(pool).await
    }

    async fn pending_migrations(
        pool: &Pool<Self>,
    ) -> Result<Vec<PendingMigration>, sqlx::migrate::MigrateError> {
        super::migrate::pending_on(pool).await
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
