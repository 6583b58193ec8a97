//! Postgres: production.
//!
//! A claim opens its transaction, then takes a transaction-scoped advisory lock
//! on a hash of `(scope, key)` and reads the record in one statement (the
//! migration's `idem_lock_and_read` function), waiting at most the policy's
//! `wait_timeout`. A duplicate waits on that lock, not on a row, and reads the
//! winner's committed record once it is released. The completed
//! record is written once, just before the commit that carries the business
//! writes: one tuple per operation, never an insert followed by an update.
//!
//! A claim starts fresh-first: the engine sends `EXECUTE idem_v1_lock(…);
//! EXECUTE idem_v1_check(…); BEGIN` as one simple-protocol message (the lock
//! id, the wait and the key as literals; the statements prepared in the
//! session, so planned once per connection). The lock and the check run in
//! the message's implicit transaction, which the trailing `BEGIN` turns into
//! the claim's transaction: a fresh key is locked and its transaction open
//! after one round trip, and the work's statements follow. The check is its
//! own statement, so it reads with a snapshot taken after the lock. A key
//! with any record is refused with SQLSTATE `IDEMK`, which rolls the whole
//! message back (lock included) and leaves the connection idle; the error's
//! `DETAIL` carries the record read under the lock, so a replay, a mismatch or
//! a live in-progress claim is answered from it, also in one round trip. Only
//! an expired record, a crashed durable claim or a connection without the
//! prepared statements goes on to the full claim below (`BEGIN`, then the lock
//! and the read in one statement). A free key's lock is taken with
//! `pg_try_advisory_xact_lock`; only a busy one sets `lock_timeout` and waits.
//! A key with no record gets a plain `INSERT` of its completed record; an
//! expired or taken-over one, an upsert. The record and the `COMMIT` travel as
//! one message (`EXECUTE idem_v1_insert_completed(…); COMMIT; BEGIN`, values
//! as literals; bodies over 64 KiB are bound to an insert instead), so a
//! fresh key costs 3 round trips: the lock-and-check message, the work's
//! statement, the commit message. Connections prepare the statements when
//! they open ([`prepare_claims`], in the pool options of [`connect`] and
//! [`pool_options`]); a full claim's transaction prepares those missing, for
//! the connection's next claims, and writes its own record with the
//! statement itself (only a claim whose fresh message ran is sure its
//! connection has them). The pool skips sqlx's ping before each acquire;
//! sqlx still checks each connection it gets back with one exchange, off the
//! request's path.
//!
//! With [`KeyLock::Row`], for Postgres-compatible engines without advisory
//! locks, the key's own row is its lock instead: the claim bounds its wait
//! with `set_config('lock_timeout', …, true)`, inserts an `in_progress` row
//! with `INSERT … ON CONFLICT DO NOTHING` (a duplicate waits on the
//! uncommitted row) or, when the key has a committed record, locks it with
//! `SELECT … FOR UPDATE`; the completion then upserts over that row. With
//! [`WaitBound::SetLocal`] the bound is sent as `SET LOCAL lock_timeout`
//! instead, which Citus propagates to the workers a transaction touches.
//!
//! SQL stays within what Postgres-compatible engines accept where it costs
//! nothing: no `ctid`, batched deletes by primary key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, PgPool, Pool, Postgres};

use super::migrate::{Dialect, PendingMigration, Schema};
use crate::policy::Policy;

mod inbox;
mod keys;
mod outbox;
mod server;

pub use server::Server;

/// idem's migrations, applied by [`crate::migrations`] with their own
/// bookkeeping table.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate::Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("../migrations/postgres")
};

/// Connects a pool configured for idem: each new connection prepares the
/// statements of a fresh key's claim ([`prepare_claims`]), no ping before each
/// acquire (one round trip saved per operation), and an acquire timeout of
/// `policy.wait_timeout` (at least 5 s) so a down server fails closed quickly.
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use idem_runtime::{store::postgres, Policy};
/// let pool = postgres::connect("postgres://localhost/app", &Policy::default(), 8).await?;
/// # Ok(()) }
/// ```
pub async fn connect(
    url: &str,
    policy: &Policy,
    max_connections: u32,
) -> Result<PgPool, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    pool_options(policy, max_connections)
        .connect_with(options)
        .await
}

/// The pool options [`connect`] uses, for callers that build their own pool.
pub fn pool_options(policy: &Policy, max_connections: u32) -> PgPoolOptions {
    pool_options_for(policy, max_connections, Pooler::Session)
}

/// Prepares, in `conn`'s session, the statements a fresh key's claim and its
/// completion execute; a database that cannot (not migrated yet, its key
/// table gone) leaves the connection as it is, as claims then do without. The
/// pools of [`connect`] and [`pool_options`] call it on every new connection;
/// a pool built otherwise can too, from its own `after_connect`. A claim on a
/// connection without them still works: it is refused before anything runs
/// (one `prepared statement does not exist` error in the server's log), and
/// the key is claimed the full way, which prepares them.
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use idem_runtime::store::postgres;
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .after_connect(|conn, _| Box::pin(postgres::prepare_claims(conn)))
///     .connect("postgres://localhost/app")
///     .await?;
/// # Ok(()) }
/// ```
pub async fn prepare_claims(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(conn, PREPARE_CLAIMS).await?;
    Ok(())
}

/// What [`prepare_claims`] sends.
const PREPARE_CLAIMS: &str = "DO $$ BEGIN PERFORM idem_prepare_claims(); \
     EXCEPTION WHEN OTHERS THEN NULL; END $$";

impl Schema for Postgres {
    fn migrator() -> &'static sqlx::migrate::Migrator {
        &MIGRATOR
    }

    const MIGRATION_DIALECT: Dialect = Dialect {
        create_table: "CREATE TABLE IF NOT EXISTS _idem_migrations (
            version BIGINT PRIMARY KEY,
            description TEXT NOT NULL,
            installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
            success BOOLEAN NOT NULL,
            checksum BYTEA NOT NULL,
            execution_time BIGINT NOT NULL
        )",
        count_tables: "SELECT COUNT(*) FROM pg_catalog.pg_tables \
             WHERE tablename = $1 AND schemaname = ANY (current_schemas(false))",
        // idem's own advisory lock (not sqlx's), so the application's migrator
        // and idem's never wait for each other. The key is "idem-mig" in ASCII.
        lock: Some((
            "SELECT pg_advisory_lock(7594877498727753063)",
            "SELECT pg_advisory_unlock(7594877498727753063)",
        )),
        after: Some(PREPARE_CLAIMS),
        question_marks: false,
    };

    async fn run_migrations(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError> {
        super::migrate::run_on(pool).await
    }

    async fn pending_migrations(
        pool: &Pool<Self>,
    ) -> Result<Vec<PendingMigration>, sqlx::migrate::MigrateError> {
        super::migrate::pending_on(pool).await
    }
}

/// How a Postgres claim holds its key against concurrent duplicates.
///
/// Every engine and step on one database must use the same kind: a claim of
/// one kind does not wait for a claim of the other. A setting of
/// `Engine<Postgres>` only: SQLite's write lock is database-wide.
///
/// ```
/// use idem_runtime::{Engine, KeyLock};
/// # async fn demo(pool: sqlx::PgPool) {
/// // For a Postgres-compatible engine without advisory locks:
/// let engine = Engine::new(pool).with_key_lock(KeyLock::Row);
/// assert_eq!(engine.key_lock(), KeyLock::Row);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyLock {
    /// A transaction-scoped advisory lock on a hash of `(scope, key)`, taken
    /// with the record's read in one statement; the record is written once,
    /// completed, just before the commit. The default, and the fastest.
    #[default]
    Advisory,
    /// The key's own row: the claim inserts an `in_progress` row with plain
    /// `INSERT … ON CONFLICT DO NOTHING` (a duplicate waits on the uncommitted
    /// row, at most `wait_timeout`) or locks the existing one with `SELECT …
    /// FOR UPDATE`, and the completion updates it. For Postgres-compatible
    /// engines without advisory locks; it writes two tuple versions per key
    /// and takes more statements.
    Row,
}

/// How a claim on the row path ([`KeyLock::Row`]) bounds its wait for a
/// key another attempt holds, and lifts the bound before the work runs.
/// Both end with the claim's transaction, so neither leaves anything in the
/// session (safe behind a transaction pooler). A setting of
/// `Engine<Postgres>` only; advisory locks bound their wait inside the
/// migration's functions.
///
/// ```
/// use idem_runtime::{Engine, KeyLock, WaitBound};
/// # async fn demo(pool: sqlx::PgPool) {
/// // On Citus: the row path, its bound propagated to the workers.
/// let engine = Engine::new(pool)
///     .with_key_lock(KeyLock::Row)
///     .with_wait_bound(WaitBound::SetLocal);
/// assert_eq!(engine.wait_bound(), WaitBound::SetLocal);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitBound {
    /// `set_config('lock_timeout', …, true)` in the claim's first `SELECT`,
    /// lifted by the claim row's insert itself: no round trip of its own.
    /// The default.
    #[default]
    SetConfig,
    /// `SET LOCAL lock_timeout = '…'`, a statement Citus propagates to the
    /// workers a distributed transaction touches (with
    /// `citus.propagate_set_commands = 'local'`), where a function call in
    /// a `SELECT` runs on the coordinator only. Sent with the read of the
    /// bound it replaces as one simple-protocol message; lifting it is one
    /// more round trip per claim.
    SetLocal,
}

/// What stands between the engine's pool and the Postgres server, and so
/// what a claim may keep in the server's session.
///
/// sqlx 0.8 runs every statement with bound parameters as a named prepared
/// statement (`sqlx_s_N`) cached per client connection, and prepares it in
/// one exchange (`Parse`, `Describe`, `Sync`) and runs it in another
/// (`Bind`, `Execute`, `Sync`). A pooler in transaction mode that does not
/// track prepared statements (PgBouncer before 1.21, or 1.21 and later
/// without `max_prepared_statements`) hands the server connection to
/// another client between transactions, and outside a transaction between
/// those two exchanges: a named statement then meets a server that lacks
/// it, or one where another client prepared the same name.
/// `statement_cache_capacity(0)` does not help: sqlx still names each
/// statement, with a new name each time, and never closes it.
///
/// ```
/// use idem_runtime::{store::postgres::Pooler, Engine};
/// # async fn demo(pool: sqlx::PgPool) {
/// let engine = Engine::new(pool).with_pooler(Pooler::Transaction);
/// assert_eq!(engine.pooler(), Pooler::Transaction);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Each pool connection is one server session for its whole life: a
    /// direct connection, or PgBouncer in session mode. Connections prepare
    /// the fresh claim's statements once ([`prepare_claims`]). The default.
    #[default]
    Session,
    /// PgBouncer in transaction mode (or any pooler that may give each
    /// transaction another server connection): claims keep nothing in the
    /// session. No statement of idem's own is prepared (`PREPARE`,
    /// `EXECUTE`), the fresh-first message is not sent, the record is read
    /// under the key's lock inside the claim's transaction (a repeat costs
    /// that transaction instead of one read), every statement of the claim
    /// with bound parameters runs unnamed (`persistent(false)`) inside it,
    /// and the completed record travels as literal SQL with the `COMMIT`.
    /// Lock waits are bounded with `set_config(…, true)`, which ends with
    /// the transaction. Build the pool with [`pool_options_for`].
    ///
    /// The rest of idem's statements follow, in the whole process, once an
    /// engine or a pool is set to this: the outbox's enqueue and relay, the
    /// inbox's poison rows, durable claims' records, the purges and the
    /// registry's check run unnamed, inside a transaction (their own when
    /// they have none), and statements without parameters use the simple
    /// protocol. The relay polls: `LISTEN` holds a server session, which a
    /// transaction pooler does not give, so [`Relay::listen`](crate::outbox::Relay::listen)
    /// is ignored (with a warning) and enqueues in other processes are found
    /// within [`Relay::poll_interval`](crate::outbox::Relay::poll_interval).
    /// The operators' reads and `migrate` (a session-level advisory lock)
    /// are meant for a direct connection or a session-mode pool.
    Transaction,
}

/// Set once any engine or pool of the process is behind a transaction
/// pooler ([`Engine::with_pooler`](crate::Engine::with_pooler),
/// [`pool_options_for`] with [`Pooler::Transaction`]); never cleared.
static TRANSACTION_POOLING: AtomicBool = AtomicBool::new(false);

fn keep_no_session_state_if(pooler: Pooler) {
    if pooler == Pooler::Transaction {
        TRANSACTION_POOLING.store(true, Ordering::Relaxed);
    }
}

/// Whether the statements idem sends outside a claim (the outbox's enqueue
/// and relay, the inbox's poison rows, durable claims' records, the purges)
/// may be sqlx's named prepared statements: yes unless something in this
/// process is behind a transaction pooler. Those statements get a
/// connection or a pool, not an engine, so the setting is the process's: a
/// direct pool in a process that also has a pooled one runs them unnamed
/// too, which costs it a round trip per statement and nothing else.
pub(crate) fn named_statements() -> bool {
    !TRANSACTION_POOLING.load(Ordering::Relaxed)
}

/// `sqlx::query(sql)`, named (cached per connection) unless
/// [`named_statements`] says no. For statements inside a transaction, which
/// holds its server connection until it ends.
pub(crate) fn statement(sql: &str) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(sql).persistent(named_statements())
}

/// Runs `query` on `pool`. Behind a transaction pooler, inside a
/// transaction of its own, unnamed: sqlx prepares a statement with bound
/// parameters in one exchange and runs it in a second, and between the two
/// a transaction pooler may hand the server connection to another client
/// unless a transaction holds it.
pub(crate) async fn execute_on(
    pool: &Pool<Postgres>,
    query: Query<'_, Postgres, PgArguments>,
) -> Result<PgQueryResult, sqlx::Error> {
    if named_statements() {
        return query.execute(pool).await;
    }
    let mut tx = pool.begin().await?;
    let done = query.persistent(false).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(done)
}

/// [`execute_on`] for a statement's rows.
pub(crate) async fn fetch_all_on(
    pool: &Pool<Postgres>,
    query: Query<'_, Postgres, PgArguments>,
) -> Result<Vec<PgRow>, sqlx::Error> {
    if named_statements() {
        return query.fetch_all(pool).await;
    }
    let mut tx = pool.begin().await?;
    let rows = query.persistent(false).fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

/// [`execute_on`] for a statement's one row.
pub(crate) async fn fetch_one_on(
    pool: &Pool<Postgres>,
    query: Query<'_, Postgres, PgArguments>,
) -> Result<PgRow, sqlx::Error> {
    if named_statements() {
        return query.fetch_one(pool).await;
    }
    let mut tx = pool.begin().await?;
    let row = query.persistent(false).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(row)
}

/// The Postgres engine's own settings: its [`KeyLock`], its [`Pooler`] and
/// its [`WaitBound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PgSettings {
    /// How claims hold their key.
    pub key_lock: KeyLock,
    /// What stands between the pool and the server.
    pub pooler: Pooler,
    /// How the row path bounds its lock waits.
    pub wait_bound: WaitBound,
    /// Whether `key_lock` was chosen ([`Engine::with_key_lock`](crate::Engine::with_key_lock)),
    /// so that [`Engine::detect_server`](crate::Engine::detect_server) keeps it.
    key_lock_chosen: bool,
}

/// [`pool_options`] for a pool behind `pooler`: with [`Pooler::Transaction`]
/// the connections prepare nothing when they open (a prepared statement
/// would stay on one server connection of the pooler's).
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use idem_runtime::{store::postgres::{self, Pooler}, Policy};
/// let pool = postgres::pool_options_for(&Policy::default(), 8, Pooler::Transaction)
///     .connect("postgres://127.0.0.1:6432/app")
///     .await?;
/// # Ok(()) }
/// ```
pub fn pool_options_for(policy: &Policy, max_connections: u32, pooler: Pooler) -> PgPoolOptions {
    keep_no_session_state_if(pooler);
    let options = PgPoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .acquire_timeout(policy.wait_timeout.max(Duration::from_secs(5)));
    match pooler {
        Pooler::Session => options.after_connect(|conn, _| Box::pin(prepare_claims(conn))),
        Pooler::Transaction => options,
    }
}

impl crate::Engine<Postgres> {
    /// Sets how claims hold their key ([`KeyLock::Advisory`] by default; see
    /// [`KeyLock`] for when to choose [`KeyLock::Row`]).
    pub fn with_key_lock(mut self, key_lock: KeyLock) -> Self {
        self.settings.key_lock = key_lock;
        self.settings.key_lock_chosen = true;
        self
    }

    /// Reads the server's `version()` ([`Server::detect`]) and, unless a key
    /// lock was chosen with [`Engine::with_key_lock`](Self::with_key_lock), takes the one that
    /// server needs ([`Server::key_lock`]): the row path on CockroachDB and
    /// YugabyteDB, advisory locks on Postgres. One statement, once;
    /// [`Engine::connect_postgres`](Self::connect_postgres) calls it.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
    /// use idem_runtime::Engine;
    /// let engine = Engine::new(pool).detect_server().await?;
    /// println!("claims take {:?}", engine.key_lock());
    /// # Ok(()) }
    /// ```
    pub async fn detect_server(mut self) -> Result<Self, sqlx::Error> {
        let server = Server::detect(self.pool()).await?;
        if !self.settings.key_lock_chosen {
            self.settings.key_lock = server.key_lock();
        }
        if server != Server::Postgres {
            tracing::info!(?server, key_lock = ?self.settings.key_lock, "detected the Postgres-compatible server");
        }
        Ok(self)
    }

    /// How claims hold their key.
    pub fn key_lock(&self) -> KeyLock {
        self.settings.key_lock
    }

    /// Sets what stands between the pool and the server ([`Pooler::Session`]
    /// by default; [`Pooler::Transaction`] behind PgBouncer in transaction
    /// mode).
    ///
    /// [`Pooler::Transaction`] also switches, for the whole process, every
    /// statement idem sends outside a claim (see [`Pooler::Transaction`]).
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        keep_no_session_state_if(pooler);
        self.settings.pooler = pooler;
        self
    }

    /// What stands between the pool and the server.
    pub fn pooler(&self) -> Pooler {
        self.settings.pooler
    }

    /// Sets how claims on the row path bound their lock waits
    /// ([`WaitBound::SetConfig`] by default; [`WaitBound::SetLocal`] on
    /// Citus).
    pub fn with_wait_bound(mut self, wait_bound: WaitBound) -> Self {
        self.settings.wait_bound = wait_bound;
        self
    }

    /// How claims on the row path bound their lock waits.
    pub fn wait_bound(&self) -> WaitBound {
        self.settings.wait_bound
    }

    /// An engine on a Postgres URL with the default policy and a pool of 8
    /// connections, its key lock the one the server needs
    /// ([`Engine::detect_server`](Self::detect_server)).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), sqlx::Error> {
    /// let engine = idem_runtime::Engine::<sqlx::Postgres>::connect_postgres("postgres://localhost/app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_postgres(url: &str) -> Result<Self, sqlx::Error> {
        Self::new(connect(url, &Policy::default(), 8).await?)
            .detect_server()
            .await
    }
}
