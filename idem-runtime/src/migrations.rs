//! idem's schema migrations, embedded per backend, and which of them a
//! database still lacks.
//!
//! [`Engine::migrate`](crate::Engine::migrate) applies them; [`pending`]
//! answers "does this database need a migration?" without writing anything,
//! for deploy pipelines (`idem migrate --check`).

use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{Executor, Pool};

use crate::store::Backend;

/// The embedded migrations of backend `DB`.
///
/// ```
/// let sqlite = idem_runtime::migrations::migrator::<sqlx::Sqlite>();
/// assert!(sqlite.iter().count() >= 1);
/// ```
pub fn migrator<DB: Backend>() -> &'static Migrator {
    DB::migrator()
}

/// One of idem's migrations a database has not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMigration {
    /// The migration's version (its file name's number).
    pub version: i64,
    /// Its description (the rest of its file name).
    pub description: String,
}

/// idem's migrations that `pool`'s database has not applied yet, oldest
/// first; empty when it is up to date. Reads only: a database that has never
/// been migrated (no `_sqlx_migrations` table) lacks them all. Migrations the
/// application keeps in the same table are ignored.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::migrate::MigrateError> {
/// let missing = idem_runtime::migrations::pending(&pool).await?;
/// if !missing.is_empty() {
///     eprintln!("{} idem migration(s) pending", missing.len());
/// }
/// # Ok(()) }
/// ```
pub async fn pending<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<PendingMigration>, MigrateError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Connection: Migrate,
{
    let mut conn = pool.acquire().await?;
    let applied = match conn.list_applied_migrations().await {
        Ok(applied) => applied,
        // The database answered but has no migrations table.
        Err(MigrateError::Execute(sqlx::Error::Database(_))) => Vec::new(),
        Err(error) => return Err(error),
    };
    Ok(migrator::<DB>()
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .filter(|m| !applied.iter().any(|a| a.version == m.version))
        .map(|m| PendingMigration {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect())
}
