//! SQLite: a file in WAL mode, opened the way idem opens it.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use idem_runtime::store::sqlite::open;
use idem_runtime::{Engine, IdemError, Policy, Problem, Via};
use sqlx::{Sqlite, SqlitePool};

use crate::charge::{
    keyed, replay_cache, through_macro, unprotected, user_hash, Business, CHARGE_CARD, REQUEST,
};
use crate::target::{BenchError, BoxFut, Target, TENANT};

const BUSINESS: &str =
    "INSERT INTO payments (tenant_id, amount_cents, currency) VALUES (?1, ?2, ?3) RETURNING id";

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL, \
     amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, created_at INTEGER NOT NULL DEFAULT (unixepoch()))",
    // The guide's table, with SQLite types (times in Unix milliseconds).
    "CREATE TABLE IF NOT EXISTS seed_keys (client_id TEXT NOT NULL, idem_key TEXT NOT NULL, \
     request_hash BLOB NOT NULL, status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed')), \
     response_code INTEGER, response_body TEXT, expires_at INTEGER NOT NULL, PRIMARY KEY (client_id, idem_key))",
    "CREATE INDEX IF NOT EXISTS seed_keys_expires_idx ON seed_keys (expires_at)",
];

const SEED_CLAIM: &str =
    "INSERT INTO seed_keys (client_id, idem_key, request_hash, status, expires_at) \
     VALUES (?1, ?2, ?3, 'in_progress', ?4 + 86400000) \
     ON CONFLICT (client_id, idem_key) DO UPDATE \
       SET request_hash = excluded.request_hash, status = 'in_progress', \
           response_code = NULL, response_body = NULL, expires_at = excluded.expires_at \
       WHERE seed_keys.expires_at < ?4 \
     RETURNING client_id";

const SEED_COMPLETE: &str =
    "UPDATE seed_keys SET status = 'completed', response_code = ?3, response_body = ?4 \
     WHERE client_id = ?1 AND idem_key = ?2";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A SQLite file with its pool and engine.
#[derive(Clone)]
pub struct Lite {
    /// The pool every scenario shares.
    pub pool: SqlitePool,
    /// The same engine keeping a replay cache.
    cached_engine: Engine<Sqlite>,
    /// The engine over that pool.
    pub engine: Engine<Sqlite>,
    /// An engine over the same file with group commit off.
    solo_engine: Engine<Sqlite>,
    version: String,
    settings: Vec<(String, String)>,
}

impl Lite {
    /// Opens (creating) the file at `path` with `connections`, migrates it.
    pub async fn setup(path: &Path, connections: u32) -> Result<Self, BenchError> {
        let pool = open(path, &Policy::default(), connections)
            .await
            .map_err(|e| format!("open: {e}"))?;
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
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&pool)
            .await?;
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&pool)
            .await?;
        let synchronous = match synchronous {
            0 => "OFF",
            1 => "NORMAL",
            2 => "FULL",
            _ => "EXTRA",
        };
        let settings = vec![
            ("journal_mode".into(), journal),
            ("synchronous".into(), synchronous.into()),
            (
                "busy_timeout".into(),
                format!("{}ms", Policy::default().wait_timeout.as_millis()),
            ),
            ("test_before_acquire".into(), "false".into()),
            ("pool_size".into(), connections.to_string()),
        ];
        Ok(Self {
            pool,
            cached_engine: engine.clone().with_replay_cache(replay_cache()),
            solo_engine: engine
                .clone()
                .with_policy(Policy::default().with_group_commit(None)),
            engine,
            version,
            settings,
        })
    }
}

impl Business for Sqlite {
    async fn business(conn: &mut sqlx::SqliteConnection, tenant: &str) -> Result<i64, Problem> {
        let id = sqlx::query_scalar(BUSINESS)
            .bind(tenant)
            .bind(REQUEST.0)
            .bind(REQUEST.1)
            .fetch_one(conn)
            .await?;
        Ok(id)
    }
}

impl Target for Lite {
    fn name(&self) -> &'static str {
        "sqlite"
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
            // SQLite has no data-modifying CTEs: both inserts go as one
            // multi-statement call (one message to the connection's worker).
            let fp: String = user_hash().iter().map(|b| format!("{b:02x}")).collect();
            let now = now_ms();
            let sql = format!(
                "INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('{TENANT}', {amount}, '{currency}'); \
                 INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, \
                   response_content_type, response_body, created_at, locked_until, expires_at) \
                 VALUES ('tenant:floor', '{key}', '{step}', X'{fp}', 'completed', 200, 'application/json', \
                   X'7b7d', {now}, {now}, {expires})",
                amount = REQUEST.0,
                currency = REQUEST.1,
                key = key.replace('\'', "''"),
                step = CHARGE_CARD.name(),
                expires = now + 86_400_000,
            );
            let mut tx = pool.begin().await?;
            let conn: &mut sqlx::SqliteConnection = &mut tx;
            sqlx::Executor::execute(conn, sqlx::raw_sql(&sql)).await?;
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

    fn idem_solo(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        let engine = self.solo_engine.clone();
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
                sqlx::query_scalar("SELECT count(*) FROM payments WHERE tenant_id = ?1")
                    .bind(tenant)
                    .fetch_one(&pool)
                    .await?,
            )
        })
    }
}

/// The guide's SQL for one key; with `replay`, a completed key is answered
/// from its stored row instead of failing.
async fn seed(pool: SqlitePool, key: String, replay: bool) -> Result<(), BenchError> {
    let hash = user_hash();
    let mut tx = pool.begin().await?;
    let claimed: Option<String> = sqlx::query_scalar(SEED_CLAIM)
        .bind(TENANT)
        .bind(&key)
        .bind(&hash)
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await?;
    if claimed.is_none() {
        tx.rollback().await?;
        if !replay {
            return Err(format!("seed-sql: key {key} was not fresh").into());
        }
        // The guide's conflict path: the stored row answers the retry.
        let (status, stored_hash, _code, _body): (String, Vec<u8>, Option<i64>, Option<String>) =
                    sqlx::query_as("SELECT status, request_hash, response_code, response_body FROM seed_keys WHERE client_id = ?1 AND idem_key = ?2")
                        .bind(TENANT)
                        .bind(&key)
                        .fetch_one(&pool)
                        .await?;
        if status != "completed" || stored_hash != hash {
            return Err(format!("seed-sql: key {key} is {status}").into());
        }
        return Ok(());
    }
    let id = Sqlite::business(&mut tx, TENANT)
        .await
        .map_err(|problem| problem.to_string())?;
    sqlx::query(SEED_COMPLETE)
        .bind(TENANT)
        .bind(&key)
        .bind(201i64)
        .bind(format!("{{\"payment_id\": {id}}}"))
        .execute(&mut *tx)
        .await?;
    Ok(tx.commit().await?)
}
