//! Counting a consumer's effects per message id (rows in `payments` whose
//! `tenant` column holds the message id).
#![allow(dead_code)]

use sqlx::{MySql, Pool, Postgres, Sqlite};

/// Effects per logical operation.
pub trait Effects: sqlx::Database {
    /// Payments recorded for message `id`.
    fn effects<'a>(
        pool: &'a Pool<Self>,
        id: &'a str,
    ) -> impl std::future::Future<Output = i64> + Send + 'a;
}

impl Effects for Sqlite {
    async fn effects<'a>(pool: &'a Pool<Self>, id: &'a str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM payments WHERE tenant = ?1")
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("count effects")
    }
}

impl Effects for MySql {
    async fn effects<'a>(pool: &'a Pool<Self>, id: &'a str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM payments WHERE tenant = ?")
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("count effects")
    }
}

impl Effects for Postgres {
    async fn effects<'a>(pool: &'a Pool<Self>, id: &'a str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM payments WHERE tenant = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("count effects")
    }
}
