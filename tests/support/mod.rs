//! The test harness: a real store per test (a temp SQLite file, or a fresh
//! database on the throwaway Postgres server, from
//! [`idem_runtime::test_support::TestDb`]), an engine on it, a `payments`
//! business table, and a child-process entry point for crash tests.
#![allow(dead_code)]

use std::process::{Command, ExitStatus};

/// Emits, for each listed store (a harness constructor of this module:
/// `sqlite`, `postgres`, `postgres_row_lock`), a module of that name with one
/// test per listed body, which calls the generic body with the constructor,
/// plus the ignored `child_process_entry` that [`Harness::run_child`] starts.
///
/// ```ignore
/// on_each_store! {
///     stores: sqlite, postgres;
///     #[tokio::test]
///     executes_once,
/// }
/// async fn executes_once<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) { ... }
/// ```
#[allow(unused_macros)] // not every test binary that shares this module uses it
macro_rules! on_each_store {
    (stores: ; $($tests:tt)*) => {};
    (stores: $store:ident $(, $rest:ident)*; $($tests:tt)*) => {
        $crate::support::on_each_store!(@store $store; $($tests)*);
        $crate::support::on_each_store!(stores: $($rest),*; $($tests)*);
    };
    (@store $store:ident; $($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod $store {
            $(
                $(#[$attr])*
                async fn $name() {
                    super::$name(crate::support::$store).await;
                }
            )*

            /// Runs inside the child process spawned by the crash tests.
            #[tokio::test]
            #[ignore = "entry point for child processes"]
            async fn child_process_entry() {
                crate::support::child_entry(crate::support::$store).await;
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_each_store;

use idem_runtime::test_support::TestDb;
use idem_runtime::{
    Backend, Engine, IdemError, IdempotencyKey, Operation, Policy, Problem, Scope, Via,
};
use sqlx::{Pool, Postgres, Sqlite};

/// What each test gets: an engine on its own store.
pub struct Harness<DB: TestBackend> {
    pub engine: Engine<DB>,
    /// The store; a SQLite file lives as long as this.
    pub db: TestDb,
}

/// The per-backend pieces of the harness.
pub trait TestBackend: Backend {
    /// The module name the engine plan's tests live under.
    const MODULE: &'static str;
    /// A fresh, empty store of this backend.
    fn test_db() -> impl std::future::Future<Output = TestDb> + Send;
    fn pool(url: &str, policy: &Policy) -> impl std::future::Future<Output = Pool<Self>> + Send {
        Self::pool_of(url, policy, 8)
    }
    /// A pool of exactly `connections` connections.
    fn pool_of(
        url: &str,
        policy: &Policy,
        connections: u32,
    ) -> impl std::future::Future<Output = Pool<Self>> + Send;
    fn insert_payment<'c>(
        conn: &'c mut Self::Connection,
        tenant: &'c str,
        amount: i64,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'c;
    /// Runs one statement on a connection (inside a claim's transaction).
    fn execute_on<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'c;
    /// Reads one integer on a connection (inside a claim's transaction).
    fn fetch_i64_on<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl std::future::Future<Output = Result<i64, sqlx::Error>> + Send + 'c;
    fn count(pool: &Pool<Self>, sql: &'static str)
        -> impl std::future::Future<Output = i64> + Send;
    fn execute(
        pool: &Pool<Self>,
        sql: &'static str,
    ) -> impl std::future::Future<Output = ()> + Send;
}

macro_rules! test_backend {
    ($db:ty, $module:literal, $test_db:expr, $pool:expr) => {
        impl TestBackend for $db {
            const MODULE: &'static str = $module;
            async fn test_db() -> TestDb {
                $test_db
            }
            async fn pool_of(url: &str, policy: &Policy, connections: u32) -> Pool<Self> {
                let connect = $pool;
                connect(url, policy, connections).await
            }
            async fn insert_payment<'c>(
                conn: &'c mut Self::Connection,
                tenant: &'c str,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query("INSERT INTO payments (tenant, amount) VALUES ($1, $2)")
                    .bind(tenant)
                    .bind(amount)
                    .execute(conn)
                    .await
                    .map(drop)
            }
            async fn execute_on<'c>(
                conn: &'c mut Self::Connection,
                sql: &'c str,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(sql).execute(conn).await.map(drop)
            }
            async fn fetch_i64_on<'c>(
                conn: &'c mut Self::Connection,
                sql: &'c str,
            ) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar(sql).fetch_one(conn).await
            }
            async fn count(pool: &Pool<Self>, sql: &'static str) -> i64 {
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(pool)
                    .await
                    .expect(sql)
            }
            async fn execute(pool: &Pool<Self>, sql: &'static str) {
                sqlx::query(sql).execute(pool).await.expect(sql);
            }
        }
    };
}

test_backend!(
    Sqlite,
    "sqlite",
    TestDb::sqlite(),
    |url: &str, policy: &Policy, connections: u32| {
        let url = url.to_owned();
        let policy = *policy;
        async move {
            idem_runtime::store::sqlite::connect(&url, &policy, connections)
                .await
                .expect("open sqlite")
        }
    }
);
test_backend!(
    Postgres,
    "postgres",
    TestDb::postgres().await,
    |url: &str, policy: &Policy, connections: u32| {
        let url = url.to_owned();
        let policy = *policy;
        async move {
            idem_runtime::store::postgres::connect(&url, &policy, connections)
                .await
                .expect("connect postgres")
        }
    }
);

const CREATE_PAYMENTS: &str =
    "CREATE TABLE IF NOT EXISTS payments (tenant TEXT NOT NULL, amount BIGINT NOT NULL)";

impl<DB: TestBackend> Harness<DB> {
    /// An engine with `policy` on a fresh store, migrated, with the
    /// `payments` table.
    pub async fn new(policy: Policy) -> Self {
        let db = DB::test_db().await;
        let engine = Engine::new(DB::pool(db.url(), &policy).await).with_policy(policy);
        engine.migrate().await.expect("migrate");
        DB::execute(engine.pool(), CREATE_PAYMENTS).await;
        Harness { engine, db }
    }
}

/// The tests' operation: charging `amount` under `key`, scoped by `tenant`.
pub fn operation(tenant: &str, key: &str, amount: i64) -> Operation {
    Operation::new(
        Scope::tenant(tenant),
        IdempotencyKey::new(key).expect("key"),
        "charge-card.v1",
        &amount,
    )
}

/// Runs `op` with one payment row for `acme` as its work; answers how it
/// was answered.
pub async fn charge<DB: TestBackend>(h: &Harness<DB>, op: &Operation) -> Result<Via, IdemError> {
    h.engine
        .run(op, async |tx| {
            DB::insert_payment(tx, "acme", 1).await?;
            Ok::<i64, Problem>(1)
        })
        .await
        .map(|answer| answer.via)
}

/// A harness on a fresh SQLite file.
pub async fn sqlite(policy: Policy) -> Harness<Sqlite> {
    Harness::new(policy).await
}

/// A harness on a fresh database of the test Postgres server.
pub async fn postgres(policy: Policy) -> Harness<Postgres> {
    Harness::new(policy).await
}

/// A harness on a fresh database of the test Postgres server whose claims
/// hold their keys by row locks ([`idem_runtime::KeyLock::Row`]).
pub async fn postgres_row_lock(policy: Policy) -> Harness<Postgres> {
    let h = postgres(policy).await;
    let engine = h.engine.clone().with_key_lock(idem_runtime::KeyLock::Row);
    h.with_engine(engine)
}

impl<DB: TestBackend> Harness<DB> {
    /// The same store behind another engine.
    pub fn with_engine(self, engine: Engine<DB>) -> Self {
        Self { engine, ..self }
    }

    /// Rows in the business table: the side effects.
    pub async fn payments(&self) -> i64 {
        DB::count(self.engine.pool(), "SELECT COUNT(*) FROM payments").await
    }

    /// Rows in the key table.
    pub async fn records(&self) -> i64 {
        DB::count(self.engine.pool(), "SELECT COUNT(*) FROM idempotency_keys").await
    }

    /// Makes every claim fail as if the store were down, while business
    /// tables stay writable.
    pub async fn break_key_table(&self) {
        DB::execute(
            self.engine.pool(),
            "ALTER TABLE idempotency_keys RENAME TO idempotency_keys_gone",
        )
        .await;
    }

    /// Runs one charge in a child process that aborts at `mode`
    /// (`before-commit` or `after-commit`), and returns how it exited.
    pub fn run_child(&self, mode: &str, tenant: &str, key: &str, amount: i64) -> ExitStatus {
        let exe = std::env::current_exe().expect("test binary");
        Command::new(exe)
            .args([
                "--exact",
                &format!("{}::child_process_entry", DB::MODULE),
                "--include-ignored",
                "--nocapture",
            ])
            .env("IDEM_CHILD_MODE", mode)
            .env("IDEM_CHILD_URL", self.db.url())
            .env("IDEM_CHILD_TENANT", tenant)
            .env("IDEM_CHILD_KEY", key)
            .env("IDEM_CHILD_AMOUNT", amount.to_string())
            .status()
            .expect("spawn child")
    }
}

/// The child side of [`Harness::run_child`]: charges once, aborting where told,
/// on the backend `store` opens (only its type is used).
/// Does nothing unless started by `run_child`.
pub async fn child_entry<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let Ok(mode) = std::env::var("IDEM_CHILD_MODE") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let (url, tenant, key) = (
        var("IDEM_CHILD_URL"),
        var("IDEM_CHILD_TENANT"),
        var("IDEM_CHILD_KEY"),
    );
    let amount: i64 = var("IDEM_CHILD_AMOUNT").parse().expect("amount");
    let engine = Engine::new(DB::pool(&url, &Policy::default()).await);
    let op = operation(&tenant, &key, amount);
    let abort_before_commit = mode == "before-commit";
    let scope = op.scope().to_string();
    let done = engine
        .run(&op, async move |tx| {
            DB::insert_payment(tx, &scope, amount).await?;
            if abort_before_commit {
                std::process::abort();
            }
            Ok::<i64, Problem>(amount)
        })
        .await
        .expect("child charge");
    assert!(done.value.is_ok());
    // Committed; the response is never sent.
    std::process::abort();
}

/// Captures what a `tracing` subscriber writes on this thread, as text.
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// A subscriber that writes here, for `tracing::subscriber::set_default`.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish()
    }
}
