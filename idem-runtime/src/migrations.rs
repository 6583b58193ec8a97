//! idem's schema migrations: embedded per backend, applied with their own
//! bookkeeping table, and available as plain SQL for other migration tools.
//!
//! [`Engine::migrate`](crate::Engine::migrate) applies them; [`pending`]
//! answers "does this database need a migration?" without writing anything,
//! for deploy pipelines (`idem migrate --check`); [`sql`] is the whole schema
//! as one script.
//!
//! # Beside the application's own migrations
//!
//! idem records what it applied in its own table, [`TABLE`]
//! (`_idem_migrations`, the same columns as sqlx's `_sqlx_migrations`), so an
//! application's `sqlx::migrate!().run(&pool)` on the same database never
//! sees idem's versions, and idem never sees the application's. Either may run
//! first, on every start, with no flags.
//!
//! A database migrated by an earlier idem kept idem's versions in
//! `_sqlx_migrations`, where the application's migrator refuses them
//! (`VersionMissing`). The first [`Engine::migrate`](crate::Engine::migrate)
//! moves those rows, and only those (same version and same checksum as one of
//! idem's migrations), into [`TABLE`]; the application's rows stay.
//!
//! On Postgres, idem holds its own advisory lock while it migrates, so
//! replicas starting together apply each migration once.
//!
//! The application's `sqlx::migrate!()` needs a direct `sqlx` dependency (the
//! same 0.8 release): the macro's expansion names the crate `::sqlx`, which a
//! re-export such as `idem::sqlx` cannot stand in for.

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::Pool;

use crate::store::migrate::up_migrations;
pub use crate::store::migrate::{PendingMigration, TABLE};
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

/// idem's whole schema for backend `DB` as one SQL script, oldest migration
/// first, each under a `-- idem migration <version>: <description>` comment:
/// for teams that apply schema changes with another tool (Flyway, Liquibase,
/// Atlas, plain `psql`). The same text is printed by
/// `idem migrate --sql sqlite|postgres`.
///
/// A database set up this way must not also run
/// [`Engine::migrate`](crate::Engine::migrate): it would find no bookkeeping
/// rows in [`TABLE`] and apply the statements again. Apply each new
/// migration of a later idem release the same way.
///
/// ```
/// let script = idem_runtime::migrations::sql::<sqlx::Postgres>();
/// assert!(script.contains("CREATE TABLE"));
/// assert!(script.contains("-- idem migration 20261201000001: idempotency keys"));
/// ```
pub fn sql<DB: Backend>() -> String {
    let mut script = String::new();
    for migration in up_migrations::<DB>() {
        script.push_str(&format!(
            "-- idem migration {}: {}\n{}\n",
            migration.version,
            migration.description,
            migration.sql.trim_end()
        ));
        script.push('\n');
    }
    script
}

/// idem's migrations that `pool`'s database has not applied yet, oldest
/// first; empty when it is up to date. Reads only: a database that has never
/// been migrated lacks them all, and idem's versions an earlier release
/// recorded in `_sqlx_migrations` count as applied (the next
/// [`Engine::migrate`](crate::Engine::migrate) moves them).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::migrate::MigrateError> {
/// let missing = idem_runtime::migrations::pending(&pool).await?;
/// if !missing.is_empty() {
///     eprintln!("{} idem migration(s) pending", missing.len());
/// }
/// # Ok(()) }
/// ```
pub async fn pending<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<PendingMigration>, MigrateError> {
    DB::pending_migrations(pool).await
}
