//! MySQL: a throwaway MariaDB server with durable, as-shipped InnoDB settings.

use idem_runtime::store::mysql::pool_options;
use idem_runtime::{Engine, IdemError, Policy, Problem, Via};
use idem_test_support::MySqlServer;
use sqlx::{MySql, MySqlPool};

use crate::charge::{
    keyed, replay_cache, through_macro, unprotected, user_hash, Business, CHARGE_CARD, REQUEST,
};
use crate::target::{BenchError, BoxFut, Target, TENANT};

/// Durable settings, as InnoDB ships them, stated explicitly for the report:
/// every commit flushes the redo log to disk; pages are written twice. The
/// binary log is off (the harness starts the server with `--skip-log-bin`):
/// a replicated server also syncs it at each commit group.
pub const SETTINGS: &[(&str, &str)] = &[
    ("innodb-flush-log-at-trx-commit", "1"),
    ("innodb-doublewrite", "1"),
];

const BUSINESS: &str = "INSERT INTO payments (tenant_id, amount_cents, currency) VALUES (?, ?, ?)";

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS payments (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
     tenant_id VARCHAR(64) NOT NULL, amount_cents BIGINT NOT NULL, currency VARCHAR(8) NOT NULL, \
     created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
    // The guide's table with MySQL types.
    "CREATE TABLE IF NOT EXISTS seed_keys (client_id VARCHAR(255) NOT NULL, idem_key VARCHAR(255) NOT NULL, \
     request_hash VARBINARY(32) NOT NULL, \
     status VARCHAR(16) NOT NULL CHECK (status IN ('in_progress', 'completed')), \
     response_code INT, response_body LONGTEXT, expires_at DATETIME(6) NOT NULL, \
     PRIMARY KEY (client_id, idem_key), KEY seed_keys_expires_idx (expires_at))",
];

/// The guide's claim in MySQL's words: MySQL has no `ON CONFLICT … WHERE …
/// RETURNING`, so a hand-written claim inserts and treats a duplicate-key
/// error as "the key exists" (an expired key would be taken over by an
/// `UPDATE … WHERE expires_at < NOW()`; the benchmark's keys never expire).
const SEED_CLAIM: &str =
    "INSERT INTO seed_keys (client_id, idem_key, request_hash, status, expires_at) \
     VALUES (?, ?, ?, 'in_progress', NOW(6) + INTERVAL 24 HOUR)";

const SEED_COMPLETE: &str =
    "UPDATE seed_keys SET status = 'completed', response_code = ?, response_body = ? \
     WHERE client_id = ? AND idem_key = ?";

/// Two inserts in one transaction: MySQL has no data-modifying CTE.
const SAME_WRITES_KEY: &str =
    "INSERT INTO idempotency_keys (scope, `key`, step, fingerprint, status, \
     response_status, response_content_type, response_body, created_at, locked_until, expires_at) \
     VALUES ('tenant:floor', ?, ?, ?, 'completed', 200, 'application/json', '{}', 0, 0, 86400000)";

/// A database on the throwaway server, with its pool and engines.
#[derive(Clone)]
pub struct My {
    /// The pool every scenario shares.
    pub pool: MySqlPool,
    /// The same engine keeping a replay cache.
    cached_engine: Engine<MySql>,
    /// The engine over that pool.
    pub engine: Engine<MySql>,
    version: String,
    settings: Vec<(String, String)>,
}

impl My {
    /// Creates a fresh database on `server`, migrates it and opens a pool of `connections`.
    pub async fn setup(server: &MySqlServer, connections: u32) -> Result<Self, BenchError> {
        let url = server.fresh_database().await;
        let pool = pool_options(&Policy::default(), connections)
            .connect(&url)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let engine = Engine::new(pool.clone());
        engine
            .migrate()
            .await
            .map_err(|e| format!("migrate: {e}"))?;
        for ddl in SCHEMA {
            sqlx::query(ddl)
                .execute(&pool)
                .await
                .map_err(|e| format!("{ddl}: {e}"))?;
        }
        // `transaction_isolation` on MySQL 8 and MariaDB 11.1+, `tx_isolation` before.
        let mut settings: Vec<(String, String)> = sqlx::query_as(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_flush_log_at_trx_commit', \
             'innodb_doublewrite', 'log_bin', 'tx_isolation', 'transaction_isolation', \
             'innodb_buffer_pool_size')",
        )
        .fetch_all(&pool)
        .await
        .map_err(|e| format!("SHOW VARIABLES: {e}"))?;
        settings.push(("test_before_acquire".into(), "false".into()));
        settings.push(("pool_size".into(), connections.to_string()));
        Ok(Self {
            pool,
            cached_engine: engine.clone().with_replay_cache(replay_cache()),
            engine,
            version: server.version().await,
            settings,
        })
    }
}

impl Business for MySql {
    async fn business(conn: &mut sqlx::MySqlConnection, tenant: &str) -> Result<i64, Problem> {
        let done = sqlx::query(BUSINESS)
            .bind(tenant)
            .bind(REQUEST.0)
            .bind(REQUEST.1)
            .execute(conn)
            .await?;
        Ok(done.last_insert_id() as i64)
    }
}

impl Target for My {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn version(&self) -> String {
        self.version.clone()
    }

    fn settings(&self) -> Vec<(String, String)> {
        self.settings.clone()
    }

    fn unprotected(&self) -> BoxFut<Result<(), BenchError>> {
        Box::pin(unprotected(self.pool.clone()))
    }

    fn same_writes(&self, key: String) -> BoxFut<Result<(), BenchError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            MySql::business(&mut tx, TENANT)
                .await
                .map_err(|problem| problem.to_string())?;
            sqlx::query(SAME_WRITES_KEY)
                .bind(&key)
                .bind(CHARGE_CARD.name())
                .bind(user_hash())
                .execute(&mut *tx)
                .await?;
            Ok(tx.commit().await?)
        })
    }

    fn seed_sql(&self, key: String) -> BoxFut<Result<(), BenchError>> {
        Box::pin(seed(self.pool.clone(), key, false))
    }

    fn seed_sql_or_replay(&self, key: String) -> BoxFut<Result<(), BenchError>> {
        Box::pin(seed(self.pool.clone(), key, true))
    }

    fn idem_cached(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        let engine = self.cached_engine.clone();
        Box::pin(async move { keyed(&engine, key, tenant).await })
    }

    fn idem(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        let engine = self.engine.clone();
        Box::pin(async move { keyed(&engine, key, tenant).await })
    }

    fn idem_macro(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        let engine = self.engine.clone();
        Box::pin(async move { through_macro(&engine, key, tenant).await })
    }

    fn payments_for(&self, tenant: String) -> BoxFut<Result<i64, BenchError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            Ok(
                sqlx::query_scalar("SELECT COUNT(*) FROM payments WHERE tenant_id = ?")
                    .bind(tenant)
                    .fetch_one(&pool)
                    .await?,
            )
        })
    }
}

/// The guide's SQL for one key; with `replay`, a completed key is answered
/// from its stored row instead of failing.
async fn seed(pool: MySqlPool, key: String, replay: bool) -> Result<(), BenchError> {
    let hash = user_hash();
    let mut tx = pool.begin().await?;
    let claimed = sqlx::query(SEED_CLAIM)
        .bind(TENANT)
        .bind(&key)
        .bind(&hash)
        .execute(&mut *tx)
        .await;
    match claimed {
        Ok(_) => {}
        Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
            tx.rollback().await?;
            if !replay {
                return Err(format!("seed-sql: key {key} was not fresh").into());
            }
            // The guide's conflict path: the stored row answers the retry.
            let (status, stored_hash, _code, _body): (String, Vec<u8>, Option<i32>, Option<String>) =
                sqlx::query_as("SELECT status, request_hash, response_code, response_body FROM seed_keys WHERE client_id = ? AND idem_key = ?")
                    .bind(TENANT)
                    .bind(&key)
                    .fetch_one(&pool)
                    .await?;
            if status != "completed" || stored_hash != hash {
                return Err(format!("seed-sql: key {key} is {status}").into());
            }
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    }
    let id = MySql::business(&mut tx, TENANT)
        .await
        .map_err(|problem| problem.to_string())?;
    sqlx::query(SEED_COMPLETE)
        .bind(201i32)
        .bind(format!("{{\"payment_id\": {id}}}"))
        .bind(TENANT)
        .bind(&key)
        .execute(&mut *tx)
        .await?;
    Ok(tx.commit().await?)
}
