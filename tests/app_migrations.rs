//! An application's own sqlx migrations beside idem's, on both backends, in
//! either order, with no flags; a database an earlier idem migrated through
//! `_sqlx_migrations`; and idem's schema as SQL for other migration tools.

use idem_runtime::migrations::{self, TABLE};
use idem_runtime::{Engine, Policy};
use idem_test_support::{on_each_store, Harness, TestBackend};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{MySql, Pool, Postgres, Sqlite};

/// The application's migrations (`tests/app_migrations/`), embedded the way
/// an application embeds its own.
static APP: Migrator = sqlx::migrate!("tests/app_migrations");

/// What the tests need from a backend beyond the harness.
trait AppBackend: TestBackend {
    /// Runs the application's migrator.
    async fn app_migrate(pool: &Pool<Self>) -> Result<(), MigrateError>;
    /// Runs idem's migrations the way an earlier idem did: sqlx's migrator,
    /// bookkeeping in `_sqlx_migrations`.
    async fn legacy_idem_migrate(pool: &Pool<Self>) -> Result<(), MigrateError>;
    /// Runs a multi-statement script.
    async fn script(pool: &Pool<Self>, sql: &str);
}

macro_rules! app_backend {
    ($db:ty) => {
        impl AppBackend for $db {
            async fn app_migrate(pool: &Pool<Self>) -> Result<(), MigrateError> {
                APP.run(pool).await
            }
            async fn legacy_idem_migrate(pool: &Pool<Self>) -> Result<(), MigrateError> {
                let legacy = Migrator {
                    migrations: migrations::migrator::<$db>().migrations.clone(),
                    ignore_missing: true,
                    ..Migrator::DEFAULT
                };
                legacy.run(pool).await
            }
            async fn script(pool: &Pool<Self>, sql: &str) {
                sqlx::raw_sql(sql).execute(pool).await.expect("script");
            }
        }
    };
}
app_backend!(Sqlite);
app_backend!(Postgres);
app_backend!(MySql);

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test]
    app_migrations_first_then_idem,
    #[tokio::test]
    idem_first_then_app_migrations,
    #[tokio::test]
    idem_rows_in_sqlx_table_are_moved,
    #[tokio::test]
    printed_sql_builds_the_schema,
}

/// A fresh database with neither migration set applied.
async fn empty_engine<DB: AppBackend>() -> (Engine<DB>, idem_test_support::TestDb) {
    let db = DB::test_db().await;
    let policy = Policy::default();
    let engine = Engine::new(DB::pool(db.url(), &policy).await);
    (engine, db)
}

async fn sqlx_versions<DB: AppBackend>(pool: &Pool<DB>) -> i64 {
    DB::count(pool, "SELECT COUNT(*) FROM _sqlx_migrations").await
}

async fn app_migrations_first_then_idem<DB: AppBackend>(
    _harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let (engine, _db) = empty_engine::<DB>().await;
    DB::app_migrate(engine.pool()).await.expect("app first");
    engine.migrate().await.expect("idem after the app");
    // Every later start runs both again, in any order.
    DB::app_migrate(engine.pool()).await.expect("app again");
    engine.migrate().await.expect("idem again");
    DB::app_migrate(engine.pool())
        .await
        .expect("app after idem");

    assert_eq!(sqlx_versions(engine.pool()).await, 2, "only the app's rows");
    let idem_rows = DB::count(engine.pool(), "SELECT COUNT(*) FROM _idem_migrations").await;
    assert_eq!(
        idem_rows,
        migrations::migrator::<DB>().iter().count() as i64
    );
    assert!(migrations::pending(engine.pool()).await.unwrap().is_empty());
    DB::execute(
        engine.pool(),
        "INSERT INTO orders (id, customer, note) VALUES (1, 'c', 'n')",
    )
    .await;
    DB::execute(engine.pool(), "SELECT COUNT(*) FROM idempotency_keys").await;
}

async fn idem_first_then_app_migrations<DB: AppBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    // The harness has already run idem's migrations.
    let h = harness(Policy::default()).await;
    DB::app_migrate(h.engine.pool())
        .await
        .expect("app after idem");
    h.engine.migrate().await.expect("idem again");
    DB::app_migrate(h.engine.pool()).await.expect("app again");
    assert_eq!(sqlx_versions(h.engine.pool()).await, 2);
    assert_eq!(h.records().await, 0);
}

async fn idem_rows_in_sqlx_table_are_moved<DB: AppBackend>(
    _harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let (engine, db) = empty_engine::<DB>().await;
    DB::legacy_idem_migrate(engine.pool())
        .await
        .expect("legacy idem");
    // The state an earlier idem left: the application's migrator refuses it.
    // (On its own pool: sqlx returns that error without releasing its
    // Postgres migration lock, which would stay with a pooled connection.)
    let refused = DB::pool_of(db.url(), &Policy::default(), 1).await;
    let before = DB::app_migrate(&refused).await;
    refused.close().await;
    assert!(
        matches!(before, Err(MigrateError::VersionMissing(_))),
        "{before:?}"
    );
    // Counted as applied before they move; nothing to do.
    assert!(migrations::pending(engine.pool()).await.unwrap().is_empty());

    engine.migrate().await.expect("idem moves its rows");
    DB::app_migrate(engine.pool()).await.expect("app now runs");
    engine.migrate().await.expect("idem again");
    assert_eq!(sqlx_versions(engine.pool()).await, 2, "only the app's rows");
    let idem_rows = DB::count(engine.pool(), "SELECT COUNT(*) FROM _idem_migrations").await;
    assert_eq!(
        idem_rows,
        migrations::migrator::<DB>().iter().count() as i64
    );
    assert!(migrations::pending(engine.pool()).await.unwrap().is_empty());
    assert_eq!(TABLE, "_idem_migrations");
}

async fn printed_sql_builds_the_schema<DB: AppBackend>(
    _harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let (engine, _db) = empty_engine::<DB>().await;
    let pending = migrations::pending(engine.pool()).await.unwrap();
    assert_eq!(pending.len(), migrations::migrator::<DB>().iter().count());
    DB::script(engine.pool(), &migrations::sql::<DB>()).await;
    for table in ["idempotency_keys", "idem_outbox", "idem_poison"] {
        let sql: &'static str = format!("SELECT COUNT(*) FROM {table}").leak();
        assert_eq!(DB::count(engine.pool(), sql).await, 0, "{table}");
    }
}
