//! How idem applies its migrations: its own bookkeeping table, adoption of
//! the rows an earlier release kept in sqlx's table, one migration per
//! transaction. The public face is [`crate::migrations`].

use std::future::Future;
use std::time::Instant;

use sqlx::migrate::{MigrateError, Migration, Migrator};
use sqlx::{Connection, Executor, Pool, Row};

/// The table where idem records the migrations it applied.
pub const TABLE: &str = "_idem_migrations";

/// Where sqlx's own migrator keeps its records (and earlier idem releases
/// kept idem's).
const SQLX_TABLE: &str = "_sqlx_migrations";

/// The migration statements that differ between backends.
#[derive(Debug)]
pub struct Dialect {
    /// Creates [`TABLE`] if it is missing.
    pub(crate) create_table: &'static str,
    /// One row, one `BIGINT` column: how many tables named `$1` the
    /// connection sees.
    pub(crate) count_tables: &'static str,
    /// Taken before migrating, released after (Postgres: an advisory lock).
    pub(crate) lock: Option<(&'static str, &'static str)>,
    /// Run on the migrating connection once its migrations are in (Postgres:
    /// prepares the claims' statements, which a connection opened before
    /// them could not).
    pub(crate) after: Option<&'static str>,
    /// Whether the backend's placeholders are `?` (MySQL) rather than `$n`:
    /// the shared statements below are rewritten for it.
    pub(crate) question_marks: bool,
}

/// One of idem's migrations a database has not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMigration {
    /// The migration's version (its file name's number).
    pub version: i64,
    /// Its description (the rest of its file name).
    pub description: String,
}

/// idem's schema on a backend: its embedded migrations and the statements
/// that apply them. Part of the sealed [`Backend`](super::Backend).
pub trait Schema: sqlx::Database + Sized {
    /// The embedded migrations.
    fn migrator() -> &'static Migrator;

    /// The migration statements that differ between backends.
    const MIGRATION_DIALECT: Dialect;

    /// Applies idem's missing migrations ([`run_on`] for this backend).
    fn run_migrations(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), MigrateError>> + Send + '_;

    /// idem's migrations the database lacks ([`pending_on`] for this backend).
    fn pending_migrations(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<PendingMigration>, MigrateError>> + Send + '_;
}

pub(crate) fn up_migrations<DB: Schema>() -> impl Iterator<Item = &'static Migration> {
    DB::migrator()
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
}

/// The versions and checksums recorded in `table`, or none when it does not
/// exist.
async fn recorded<DB: Schema>(
    conn: &mut DB::Connection,
    table: &str,
) -> Result<Vec<(i64, Vec<u8>, bool)>, MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> Vec<u8>: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let tables: i64 = sqlx::query(DB::MIGRATION_DIALECT.count_tables)
        .bind(table)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    if tables == 0 {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(&format!(
        "SELECT version, checksum, success FROM {table} ORDER BY version"
    ))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(MigrateError::from)
}

/// `sql`, whose parameters are `$1`, `$2`... in the order they are bound, in
/// the backend's placeholder style.
fn placeholders<DB: Schema>(sql: String) -> String {
    if !DB::MIGRATION_DIALECT.question_marks {
        return sql;
    }
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `(version, checksum)` is one of idem's migrations, exactly.
fn is_ours<DB: Schema>(version: i64, checksum: &[u8]) -> bool {
    up_migrations::<DB>().any(|m| m.version == version && *m.checksum == *checksum)
}

/// [`crate::migrations::pending`] for a backend whose column types sqlx knows.
pub(crate) async fn pending_on<DB: Schema>(
    pool: &Pool<DB>,
) -> Result<Vec<PendingMigration>, MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> Vec<u8>: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let mut conn = pool.acquire().await?;
    let mut applied: Vec<i64> = recorded::<DB>(&mut conn, TABLE)
        .await?
        .into_iter()
        .filter(|(_, _, success)| *success)
        .map(|(version, _, _)| version)
        .collect();
    applied.extend(
        recorded::<DB>(&mut conn, SQLX_TABLE)
            .await?
            .into_iter()
            .filter(|(version, checksum, success)| *success && is_ours::<DB>(*version, checksum))
            .map(|(version, _, _)| version),
    );
    Ok(up_migrations::<DB>()
        .filter(|m| !applied.contains(&m.version))
        .map(|m| PendingMigration {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect())
}

/// [`Engine::migrate`](crate::Engine::migrate) for a backend whose column
/// types sqlx knows: lock, adopt idem's rows from `_sqlx_migrations`, apply
/// what is missing, unlock (also after a failure).
pub(crate) async fn run_on<DB: Schema>(pool: &Pool<DB>) -> Result<(), MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB>,
    for<'q> &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> Vec<u8>: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let mut conn = pool.acquire().await?;
    if let Some((lock, _)) = DB::MIGRATION_DIALECT.lock {
        conn.execute(lock).await?;
    }
    let mut result = apply_missing::<DB>(&mut conn).await;
    if let (Ok(()), Some(after)) = (&result, DB::MIGRATION_DIALECT.after) {
        result = conn.execute(after).await.map(|_| ()).map_err(Into::into);
    }
    if let Some((_, unlock)) = DB::MIGRATION_DIALECT.lock {
        if let Err(error) = conn.execute(unlock).await {
            // A session lock must not go back to the pool with the connection.
            conn.detach();
            return result.and(Err(error.into()));
        }
    }
    result
}

async fn apply_missing<DB: Schema>(conn: &mut DB::Connection) -> Result<(), MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB>,
    for<'q> &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> Vec<u8>: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    conn.execute(DB::MIGRATION_DIALECT.create_table).await?;
    adopt_from_sqlx_table::<DB>(conn).await?;

    let applied = recorded::<DB>(conn, TABLE).await?;
    if let Some((version, _, _)) = applied.iter().find(|(_, _, success)| !success) {
        return Err(MigrateError::Dirty(*version));
    }
    for migration in up_migrations::<DB>() {
        match applied
            .iter()
            .find(|(version, _, _)| *version == migration.version)
        {
            Some((_, checksum, _)) if **checksum != *migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => apply::<DB>(conn, migration).await?,
        }
    }
    Ok(())
}

/// Moves the rows an earlier idem wrote into `_sqlx_migrations` (idem's
/// versions with idem's checksums) into [`TABLE`], in one transaction.
async fn adopt_from_sqlx_table<DB: Schema>(conn: &mut DB::Connection) -> Result<(), MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB>,
    for<'r> i64: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> Vec<u8>: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let ours: Vec<i64> = recorded::<DB>(conn, SQLX_TABLE)
        .await?
        .into_iter()
        .filter(|(version, checksum, success)| *success && is_ours::<DB>(*version, checksum))
        .map(|(version, _, _)| version)
        .collect();
    if ours.is_empty() {
        return Ok(());
    }
    let mut tx = Connection::begin(&mut *conn).await?;
    for version in ours {
        let adopt = if DB::MIGRATION_DIALECT.question_marks {
            format!(
                "INSERT IGNORE INTO {TABLE} (version, description, installed_on, success, checksum, execution_time) \
                 SELECT version, description, installed_on, success, checksum, execution_time \
                 FROM {SQLX_TABLE} WHERE version = ?"
            )
        } else {
            format!(
                "INSERT INTO {TABLE} (version, description, installed_on, success, checksum, execution_time) \
                 SELECT version, description, installed_on, success, checksum, execution_time \
                 FROM {SQLX_TABLE} WHERE version = $1 ON CONFLICT (version) DO NOTHING"
            )
        };
        sqlx::query(&adopt).bind(version).execute(&mut *tx).await?;
        sqlx::query(&placeholders::<DB>(format!(
            "DELETE FROM {SQLX_TABLE} WHERE version = $1"
        )))
        .bind(version)
        .execute(&mut *tx)
        .await?;
        tracing::info!(
            version,
            "moved idem's migration record from {SQLX_TABLE} to {TABLE}"
        );
    }
    tx.commit().await?;
    Ok(())
}

/// Runs one migration and records it, in one transaction.
async fn apply<DB: Schema>(
    conn: &mut DB::Connection,
    migration: &Migration,
) -> Result<(), MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let started = Instant::now();
    let mut tx = Connection::begin(&mut *conn).await?;
    tx.execute(&*migration.sql)
        .await
        .map_err(|error| MigrateError::ExecuteMigration(error, migration.version))?;
    let description: &str = &migration.description;
    let checksum: &[u8] = &migration.checksum;
    sqlx::query(&placeholders::<DB>(format!(
        "INSERT INTO {TABLE} (version, description, success, checksum, execution_time) \
         VALUES ($1, $2, TRUE, $3, $4)"
    )))
    .bind(migration.version)
    .bind(description)
    .bind(checksum)
    .bind(i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(
        version = migration.version,
        description,
        "applied idem migration"
    );
    Ok(())
}
