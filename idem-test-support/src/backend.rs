//! What the harness needs of each backend: a fresh store, a pool, and a few
//! statements on its connections. A new backend is one more
//! `impl_test_backend!` line here and one more store in
//! [`on_each_store!`](crate::on_each_store).

use std::future::Future;

use idem_runtime::{Backend, Policy};
use sqlx::{MySql, Pool, Postgres, Sqlite};

use crate::TestDb;

/// The per-backend pieces of the harness.
pub trait TestBackend: Backend {
    /// The module name the engine plan's tests live under.
    const MODULE: &'static str;
    /// A fresh, empty store of this backend.
    fn test_db() -> impl Future<Output = TestDb> + Send;
    /// A pool of eight connections to `url`, set up as the engine sets up its own.
    fn pool(url: &str, policy: &Policy) -> impl Future<Output = Pool<Self>> + Send {
        Self::pool_of(url, policy, 8)
    }
    /// A pool of exactly `connections` connections.
    fn pool_of(
        url: &str,
        policy: &Policy,
        connections: u32,
    ) -> impl Future<Output = Pool<Self>> + Send;
    /// Inserts one row of the tests' business table, `payments`.
    fn insert_payment<'c>(
        conn: &'c mut Self::Connection,
        tenant: &'c str,
        amount: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;
    /// Runs one statement on a connection (inside a claim's transaction).
    fn execute_on<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;
    /// Reads one integer on a connection (inside a claim's transaction).
    fn fetch_i64_on<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'c;
    /// Reads one count through the pool; panics with the statement on error.
    fn count(pool: &Pool<Self>, sql: &'static str) -> impl Future<Output = i64> + Send;
    /// Runs one statement through the pool; panics with the statement on error.
    fn execute(pool: &Pool<Self>, sql: &'static str) -> impl Future<Output = ()> + Send;
}

macro_rules! impl_test_backend {
    ($db:ty, $module:literal, $test_db:expr, $pool:expr) => {
        impl_test_backend!(
            $db,
            $module,
            $test_db,
            $pool,
            "INSERT INTO payments (tenant, amount) VALUES ($1, $2)"
        );
    };
    ($db:ty, $module:literal, $test_db:expr, $pool:expr, $insert_payment:literal) => {
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
                sqlx::query($insert_payment)
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

impl_test_backend!(
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
impl_test_backend!(
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
impl_test_backend!(
    MySql,
    "mysql",
    TestDb::mysql().await,
    |url: &str, policy: &Policy, connections: u32| {
        let url = url.to_owned();
        let policy = *policy;
        async move {
            idem_runtime::store::mysql::connect(&url, &policy, connections)
                .await
                .expect("connect mysql")
        }
    },
    "INSERT INTO payments (tenant, amount) VALUES (?, ?)"
);
