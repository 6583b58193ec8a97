//! MySQL: MySQL 8.0+ and MariaDB 10.6+, on InnoDB.
//!
//! InnoDB has no transaction-scoped advisory lock, so a claim's lock is the
//! key's own row. The claim opens its transaction (with its lock waits bounded
//! by `innodb_lock_wait_timeout`, the policy's `wait_timeout` rounded up to
//! whole seconds) and inserts an `in_progress` row for the key. A duplicate's
//! insert waits on that uncommitted row until the winner's transaction ends;
//! if the winner committed, the insert fails with a duplicate-key error and
//! the claim reads the record with a *locking* read (`LOCK IN SHARE MODE`),
//! which sees the latest committed version whatever the isolation level. If
//! the winner rolled back, the duplicate's insert goes in and it owns the key.
//! The completed record then replaces the claim's own row in the same
//! transaction (`INSERT … ON DUPLICATE KEY UPDATE`), just before the commit
//! that carries the business writes.
//!
//! Isolation: the claim's transaction runs at the server's default (InnoDB's
//! `REPEATABLE READ`), so the application's work sees the isolation it
//! expects. idem itself never relies on a plain read inside that
//! transaction: under `REPEATABLE READ` a plain `SELECT` after a lock wait
//! would read the transaction's snapshot, not the winner's committed record;
//! every read of the key record inside a claim is a locking read. `READ
//! COMMITTED` works as well.
//!
//! Errors: a lock wait that outlasts `innodb_lock_wait_timeout` (error 1205)
//! and a deadlock InnoDB resolves by rolling a claim back (error 1213,
//! SQLSTATE 40001) answer as a key held by another attempt (the client
//! retries later), as Postgres' `lock_timeout` does.
//!
//! Times are Unix milliseconds from the server's clock; connections of
//! [`connect`] and [`pool_options`] set the session `time_zone` to UTC, so
//! `NOW()` converts without daylight-saving ambiguity.
//!
//! MariaDB and MySQL 8 differ in places idem's statements avoid: neither has
//! `UPDATE … RETURNING` (MariaDB has `DELETE`/`INSERT … RETURNING` only, MySQL
//! none), so the relay selects its batch `FOR UPDATE SKIP LOCKED` and leases it
//! with an update by id in the same transaction; the upsert uses `VALUES(col)`
//! (deprecated but accepted by MySQL 8, the only form MariaDB knows); shared
//! locks are taken with `LOCK IN SHARE MODE`, which both accept. See
//! docs/MYSQL.md.

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{MySql, MySqlPool, Pool};

use super::migrate::{Dialect, PendingMigration, Schema};
use crate::policy::Policy;

mod inbox;
mod keys;
mod outbox;

/// idem's migrations, applied by [`crate::migrations`] with their own
/// bookkeeping table.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate::Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("../migrations/mysql")
};

/// The server's clock in Unix milliseconds, as SQL.
macro_rules! now_ms {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    };
}
pub(crate) use now_ms;

/// What each new connection of [`connect`] and [`pool_options`] runs.
const SESSION_SETUP: &str = "SET time_zone = '+00:00'";

/// Connects a pool configured for idem: sessions in UTC, no ping before each
/// acquire, and an acquire timeout of `policy.wait_timeout` (at least 5 s) so
/// a down server fails closed quickly.
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use idem_runtime::{store::mysql, Policy};
/// let pool = mysql::connect("mysql://root@localhost/app", &Policy::default(), 8).await?;
/// # Ok(()) }
/// ```
pub async fn connect(
    url: &str,
    policy: &Policy,
    max_connections: u32,
) -> Result<MySqlPool, sqlx::Error> {
    let options: MySqlConnectOptions = url.parse()?;
    pool_options(policy, max_connections)
        .connect_with(options)
        .await
}

/// The pool options [`connect`] uses, for callers that build their own pool.
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use idem_runtime::{store::mysql, Policy};
/// let pool = mysql::pool_options(&Policy::default(), 16)
///     .connect("mysql://root@localhost/app")
///     .await?;
/// # Ok(()) }
/// ```
pub fn pool_options(policy: &Policy, max_connections: u32) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .acquire_timeout(policy.wait_timeout.max(Duration::from_secs(5)))
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, SESSION_SETUP).await?;
                Ok(())
            })
        })
}

impl Schema for MySql {
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
        count_tables: "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_name = ? AND table_schema = DATABASE()",
        // idem's own named lock (not sqlx's), per database, so the
        // application's migrator and idem's never wait for each other. A
        // session lock: a connection whose release fails is detached.
        lock: Some((
            "SELECT GET_LOCK(CONCAT('idem-migrate:', DATABASE()), -1)",
            "SELECT RELEASE_LOCK(CONCAT('idem-migrate:', DATABASE()))",
        )),
        after: None,
        question_marks: true,
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

impl crate::Engine<MySql> {
    /// An engine on a MySQL URL with the default policy and a pool of 8 connections.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), sqlx::Error> {
    /// let engine = idem_runtime::Engine::<sqlx::MySql>::connect_mysql("mysql://root@localhost/app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_mysql(url: &str) -> Result<Self, sqlx::Error> {
        Ok(Self::new(connect(url, &Policy::default(), 8).await?))
    }
}
