//! Postgres: a throwaway cluster with durable, as-shipped settings, or a
//! database given by URL (through a pooler, say).

use std::sync::atomic::{AtomicBool, Ordering};

use idem_runtime::store::postgres::{pool_options, pool_options_for, Pooler};
use idem_runtime::{Engine, IdemError, KeyLock, Policy, Problem, Via};
use idem_test_support::PgServer;
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgPool, Postgres};

use crate::charge::{
    keyed, replay_cache, through_macro, unprotected, user_hash, Business, CHARGE_CARD, REQUEST,
};
use crate::target::{BenchError, BoxFut, Target, TENANT};

/// Durable settings, as Postgres ships them, stated explicitly for the report.
pub const SETTINGS: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("full_page_writes", "on"),
];

const BUSINESS: &str =
    "INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id";

const SAME_WRITES: &str = "WITH p AS (INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id) \
     INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, response_content_type, \
       response_body, created_at, locked_until, expires_at) \
     SELECT $4, $5, $6, $7, 'completed', 200, 'application/json', convert_to(p.id::text, 'UTF8'), now(), now(), \
       now() + interval '24 hours' FROM p";

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, tenant_id text NOT NULL, \
     amount_cents bigint NOT NULL, currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    // The guide's table, verbatim in shape.
    "CREATE TABLE IF NOT EXISTS seed_keys (client_id text NOT NULL, idem_key text NOT NULL, \
     request_hash bytea NOT NULL, status text NOT NULL CHECK (status IN ('in_progress', 'completed')), \
     response_code int, response_body jsonb, \
     expires_at timestamptz NOT NULL DEFAULT now() + interval '24 hours', PRIMARY KEY (client_id, idem_key))",
    "CREATE INDEX IF NOT EXISTS seed_keys_expires_idx ON seed_keys (expires_at)",
];

const SEED_CLAIM: &str = "INSERT INTO seed_keys (client_id, idem_key, request_hash, status) \
     VALUES ($1, $2, $3, 'in_progress') \
     ON CONFLICT (client_id, idem_key) DO UPDATE \
       SET request_hash = EXCLUDED.request_hash, status = 'in_progress', \
           response_code = NULL, response_body = NULL, expires_at = now() + interval '24 hours' \
       WHERE seed_keys.expires_at < now() \
     RETURNING client_id";

const SEED_COMPLETE: &str =
    "UPDATE seed_keys SET status = 'completed', response_code = $3, response_body = $4::jsonb \
     WHERE client_id = $1 AND idem_key = $2";

/// Whether the run is behind a transaction pooler: then every scenario's
/// statements are unnamed (`persistent(false)`), the same as idem's own, so
/// they are compared on equal terms.
static TRANSACTION_POOLING: AtomicBool = AtomicBool::new(false);

/// Whether the scenarios' statements may be named prepared statements.
fn named() -> bool {
    !TRANSACTION_POOLING.load(Ordering::Relaxed)
}

/// A database on the throwaway server, with its pool and engine.
#[derive(Clone)]
pub struct Pg {
    /// The pool every scenario shares.
    pub pool: PgPool,
    /// The same engine keeping a replay cache.
    cached_engine: Engine<Postgres>,
    /// The engine over that pool.
    pub engine: Engine<Postgres>,
    /// The same engine, its claims holding keys by row locks.
    row_lock_engine: Engine<Postgres>,
    version: String,
    settings: Vec<(String, String)>,
    options: PgConnectOptions,
}

impl Pg {
    /// The same database reached through another port on this host (the
    /// delay proxy's), with a pool of its own of `connections`.
    pub async fn through_port(&self, port: u16, connections: u32) -> Result<Self, BenchError> {
        let options = self.options.clone().port(port);
        let pool = pool_options(&Policy::default(), connections)
            .connect_with(options.clone())
            .await
            .map_err(|e| format!("connect through port {port}: {e}"))?;
        let engine = Engine::new(pool.clone());
        Ok(Self {
            pool,
            row_lock_engine: engine.clone().with_key_lock(KeyLock::Row),
            cached_engine: engine.clone().with_replay_cache(replay_cache()),
            engine,
            version: self.version.clone(),
            settings: self.settings.clone(),
            options,
        })
    }

    /// How to reach the database.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// The server's address.
    pub fn address(&self) -> Result<std::net::SocketAddr, BenchError> {
        use std::net::ToSocketAddrs;
        (self.options.get_host(), self.options.get_port())
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| "the server's address does not resolve".into())
    }

    /// Creates a fresh database on `server`, migrates it and opens a pool of `connections`.
    pub async fn setup(server: &PgServer, connections: u32) -> Result<Self, BenchError> {
        let url = server.fresh_database().await;
        let mut pg = Self::at(&url, &url, connections, Pooler::Session).await?;
        pg.version = server.version().await;
        Ok(pg)
    }

    /// The database at `url` (through a pooler, say), migrated and given the
    /// scenarios' tables over `setup_url` (a direct connection: migrations
    /// hold a session-level advisory lock), with a pool of `connections`
    /// set for `pooler`.
    pub async fn at(
        url: &str,
        setup_url: &str,
        connections: u32,
        pooler: Pooler,
    ) -> Result<Self, BenchError> {
        if pooler == Pooler::Transaction {
            TRANSACTION_POOLING.store(true, Ordering::Relaxed);
        }
        let setup = PgPool::connect(setup_url)
            .await
            .map_err(|e| format!("connect to {setup_url}: {e}"))?;
        Engine::<Postgres>::new(setup.clone())
            .migrate()
            .await
            .map_err(|e| format!("migrate: {e}"))?;
        for ddl in SCHEMA {
            sqlx::raw_sql(ddl)
                .execute(&setup)
                .await
                .map_err(|e| format!("{ddl}: {e}"))?;
        }
        setup.close().await;
        let options: PgConnectOptions = url.parse().map_err(|e| format!("{e}"))?;
        let pool = pool_options_for(&Policy::default(), connections, pooler)
            .connect_with(options.clone())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let engine = Engine::new(pool.clone()).with_pooler(pooler);
        let mut settings = Vec::new();
        for name in [
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "shared_buffers",
            "wal_level",
        ] {
            let row = sqlx::raw_sql(&format!("SHOW {name}"))
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("SHOW {name}: {e}"))?;
            settings.push((name.to_string(), sqlx::Row::try_get(&row, 0)?));
        }
        let version = sqlx::raw_sql("SHOW server_version")
            .fetch_one(&pool)
            .await
            .and_then(|row| sqlx::Row::try_get::<String, _>(&row, 0))
            .map_err(|e| format!("SHOW server_version: {e}"))?;
        settings.push(("test_before_acquire".into(), "false".into()));
        settings.push(("pool_size".into(), connections.to_string()));
        settings.push(("pooler".into(), format!("{pooler:?}").to_lowercase()));
        Ok(Self {
            pool,
            row_lock_engine: engine.clone().with_key_lock(KeyLock::Row),
            cached_engine: engine.clone().with_replay_cache(replay_cache()),
            engine,
            version,
            settings,
            options,
        })
    }
}

impl Business for Postgres {
    async fn business(conn: &mut sqlx::PgConnection, tenant: &str) -> Result<i64, Problem> {
        let id = sqlx::query_scalar(BUSINESS)
            .persistent(named())
            .bind(tenant)
            .bind(REQUEST.0)
            .bind(REQUEST.1)
            .fetch_one(conn)
            .await?;
        Ok(id)
    }
}

impl Target for Pg {
    fn name(&self) -> &'static str {
        "postgres"
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
            let fp = user_hash();
            let mut tx = pool.begin().await?;
            sqlx::query(SAME_WRITES)
                .persistent(named())
                .bind(TENANT)
                .bind(REQUEST.0)
                .bind(REQUEST.1)
                .bind("tenant:floor")
                .bind(&key)
                .bind(CHARGE_CARD.name())
                .bind(&fp)
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

    fn idem_row_lock(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        let engine = self.row_lock_engine.clone();
        Box::pin(async move { keyed(&engine, key, tenant).await })
    }

    fn idem_macro(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        let engine = self.engine.clone();
        Box::pin(async move { through_macro(&engine, key, tenant).await })
    }

    fn payments_for(&self, tenant: String) -> BoxFut<Result<i64, BenchError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let count = sqlx::query_scalar("SELECT count(*) FROM payments WHERE tenant_id = $1")
                .persistent(named())
                .bind(tenant)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(count)
        })
    }
}

/// The guide's SQL for one key; with `replay`, a completed key is answered
/// from its stored row instead of failing.
pub async fn seed(pool: sqlx::PgPool, key: String, replay: bool) -> Result<(), BenchError> {
    let hash = user_hash();
    let mut tx = pool.begin().await?;
    let claimed: Option<String> = sqlx::query_scalar(SEED_CLAIM)
        .persistent(named())
        .bind(TENANT)
        .bind(&key)
        .bind(&hash)
        .fetch_optional(&mut *tx)
        .await?;
    if claimed.is_none() {
        if !replay {
            tx.rollback().await?;
            return Err(format!("seed-sql: key {key} was not fresh").into());
        }
        // The guide's conflict path: the stored row answers the retry (read
        // in the transaction, which holds its connection behind a pooler).
        let (status, stored_hash, _code, _body): (String, Vec<u8>, Option<i64>, Option<String>) =
                    sqlx::query_as("SELECT status, request_hash, response_code::int8, response_body::text FROM seed_keys WHERE client_id = $1 AND idem_key = $2")
                        .persistent(named())
                        .bind(TENANT)
                        .bind(&key)
                        .fetch_one(&mut *tx)
                        .await?;
        tx.rollback().await?;
        if status != "completed" || stored_hash != hash {
            return Err(format!("seed-sql: key {key} is {status}").into());
        }
        return Ok(());
    }
    let id = Postgres::business(&mut tx, TENANT)
        .await
        .map_err(|problem| problem.to_string())?;
    sqlx::query(SEED_COMPLETE)
        .persistent(named())
        .bind(TENANT)
        .bind(&key)
        .bind(201i32)
        .bind(format!("{{\"payment_id\": {id}}}"))
        .execute(&mut *tx)
        .await?;
    Ok(tx.commit().await?)
}
