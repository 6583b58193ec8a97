//! Stores sharded by tenant: one [`Engine`] per database, a [`Router`] that
//! says which database a tenant's rows live on.
//!
//! A tenant's key records, outbox messages and inbox records live on the
//! shard where its business rows live, so a claim and the business write
//! stay one local transaction. [`Shards::engine`] picks the engine for an
//! operation's scope (its first part, the tenant); code written for one
//! [`Engine`] runs unchanged on the engine it returns.
//!
//! - An `#[idempotent(http)]` handler routes by itself: it takes
//!   [`Engines`] from the router's state, so the handler that serves
//!   `.with_state(engine)` serves `.with_state(shards)` as written, each
//!   request on its tenant's shard once the operation's scope is known.
//!   An application state holding shards implements
//!   `FromRef<AppState> for Engines<DB>` ([`Engines`] shows it).
//! - A plain `#[idempotent]` function takes `&Engine<DB>`: pass it the
//!   tenant's, `charge(shards.engine(&scope).await?, ...)`.
//! - With [`Engine::run`] or [`Engine::claim`], as below.
//!
//! A router that cannot answer (its directory down, a route to a shard that
//! does not exist) and a tenant being moved ([`TenantMove`]) are
//! [`IdemError::Unavailable`]: a 503 with `Retry-After`, nothing run.
//!
//! ```no_run
//! # async fn demo(urls: [&str; 3]) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::shard::{HashRouter, Shards};
//! use idem_runtime::{Engine, IdempotencyKey, Operation, Scope};
//! let mut engines = Vec::new();
//! for url in urls {
//!     engines.push(Engine::<sqlx::Postgres>::connect_postgres(url).await?);
//! }
//! let shards = Shards::new(engines, HashRouter);
//! shards.migrate().await?;
//! let op = Operation::new(Scope::tenant("acme"), IdempotencyKey::new("k-1")?, "charge.v1", &25);
//! let engine = shards.engine(op.scope()).await?;
//! let done = engine.run(&op, async |_tx| Ok::<_, idem_runtime::Problem>(1)).await?;
//! # let _ = done; Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::unavailable;
use crate::outbox::{Relay, RelayError, RelayHandle};
use crate::{Backend, Engine, IdemError, Purger, Scope};
use sha2::{Digest, Sha256};

#[cfg(feature = "postgres")]
pub mod tenant_move;
#[cfg(feature = "postgres")]
pub use tenant_move::{MoveError, Moved, TenantMove, FENCED};

/// Says which shard holds a tenant's rows.
pub trait Router: Send + Sync + 'static {
    /// The index (below `shards`) of the shard that holds `tenant`.
    fn shard_of<'a>(
        &'a self,
        tenant: &'a str,
        shards: usize,
    ) -> impl Future<Output = Result<usize, sqlx::Error>> + Send + 'a;
}

/// The default route: the first 8 bytes of the tenant's SHA-256, modulo the
/// number of shards. Stable across processes, builds and Rust versions; a
/// change in the number of shards moves tenants, so grow with a
/// [`DirectoryRouter`].
///
/// ```
/// use idem_runtime::shard::HashRouter;
/// assert_eq!(HashRouter::index("acme", 3), HashRouter::index("acme", 3));
/// assert!(HashRouter::index("acme", 3) < 3);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct HashRouter;

impl HashRouter {
    /// The shard of `tenant` among `shards` (at least one).
    pub fn index(tenant: &str, shards: usize) -> usize {
        let digest = Sha256::digest(tenant.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(first) % shards.max(1) as u64) as usize
    }
}

impl Router for HashRouter {
    async fn shard_of<'a>(&'a self, tenant: &'a str, shards: usize) -> Result<usize, sqlx::Error> {
        Ok(Self::index(tenant, shards))
    }
}

/// A route kept in a directory table on Postgres, `idem_tenant_shards
/// (tenant text PRIMARY KEY, shard int, moving_to int, moved_from int)`, on
/// a database of its own (or any shard): tenants listed there go to their
/// shard, the others where [`HashRouter`] puts them. Each lookup reads the
/// table, so a tenant moved by updating its row is routed to the new shard
/// by the next request. A tenant whose row has `moving_to` set is being
/// moved by a [`TenantMove`]: its lookups fail, which [`Shards::engine`]
/// answers with a 503 and `Retry-After`.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
pub struct DirectoryRouter {
    pool: sqlx::PgPool,
}

#[cfg(feature = "postgres")]
impl DirectoryRouter {
    /// The directory table's definition, for [`DirectoryRouter::create_table`].
    pub const TABLE: &'static str = "CREATE TABLE IF NOT EXISTS idem_tenant_shards \
         (tenant text PRIMARY KEY, shard int NOT NULL CHECK (shard >= 0))";

    /// A router reading the directory on `pool`.
    pub fn new(pool: sqlx::PgPool) -> Self {
        Self { pool }
    }

    /// The columns a [`TenantMove`] records its progress in, added to a
    /// directory table created before moves existed.
    pub const MOVE_COLUMNS: &'static str = "ALTER TABLE idem_tenant_shards \
         ADD COLUMN IF NOT EXISTS moving_to int CHECK (moving_to >= 0), \
         ADD COLUMN IF NOT EXISTS moved_from int CHECK (moved_from >= 0)";

    /// Creates the directory table if it is missing, and adds the columns
    /// of [`DirectoryRouter::MOVE_COLUMNS`] to one that lacks them. Routing
    /// works on a table without them; a [`TenantMove`] needs them.
    pub async fn create_table(&self) -> Result<(), sqlx::Error> {
        sqlx::query(Self::TABLE).execute(&self.pool).await?;
        sqlx::query(Self::MOVE_COLUMNS)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// The pool the directory is read on.
    pub fn pool(&self) -> &sqlx::PgPool {
        &self.pool
    }

    /// Routes `tenant` to `shard` from the next lookup on.
    pub async fn assign(&self, tenant: &str, shard: usize) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO idem_tenant_shards (tenant, shard) VALUES ($1, $2) \
             ON CONFLICT (tenant) DO UPDATE SET shard = EXCLUDED.shard",
        )
        .bind(tenant)
        .bind(shard as i32)
        .execute(&self.pool)
        .await
        .map(drop)
    }
}

/// A tenant's row in the directory table: its shard, and a [`TenantMove`]'s
/// progress.
///
/// ```no_run
/// # async fn demo(directory: idem_runtime::shard::DirectoryRouter) -> Result<(), sqlx::Error> {
/// if let Some(entry) = directory.entry("acme").await? {
///     if let Some(target) = entry.moving_to {
///         println!("acme is moving from shard {} to shard {target}", entry.shard);
///     }
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryEntry {
    /// The shard the tenant is routed to.
    pub shard: usize,
    /// The target of a move that fenced the tenant and has not flipped its
    /// route yet: its requests are refused until it does.
    pub moving_to: Option<usize>,
    /// The source of a move that flipped the route and has not deleted the
    /// tenant's copies there yet.
    pub moved_from: Option<usize>,
}

#[cfg(feature = "postgres")]
impl DirectoryRouter {
    /// The directory's row of `tenant`; `None` for a tenant it does not
    /// list (routed by [`HashRouter`]).
    pub async fn entry(&self, tenant: &str) -> Result<Option<DirectoryEntry>, sqlx::Error> {
        directory_entry(&self.pool, tenant).await
    }
}

/// The directory's row of `tenant` on `executor`. The move columns are read
/// from the row as JSON: a table created before moves existed, without
/// them, reads as one where no move ran.
#[cfg(feature = "postgres")]
pub(crate) async fn directory_entry<'c>(
    executor: impl sqlx::PgExecutor<'c>,
    tenant: &str,
) -> Result<Option<DirectoryEntry>, sqlx::Error> {
    let row: Option<(i32, Option<i32>, Option<i32>)> = sqlx::query_as(
        "SELECT shard, (to_jsonb(t) ->> 'moving_to')::int4, (to_jsonb(t) ->> 'moved_from')::int4 \
         FROM idem_tenant_shards t WHERE tenant = $1",
    )
    .bind(tenant)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|(shard, moving_to, moved_from)| DirectoryEntry {
        shard: shard as usize,
        moving_to: moving_to.map(|shard| shard as usize),
        moved_from: moved_from.map(|shard| shard as usize),
    }))
}

#[cfg(feature = "postgres")]
impl Router for DirectoryRouter {
    async fn shard_of<'a>(&'a self, tenant: &'a str, shards: usize) -> Result<usize, sqlx::Error> {
        match self.entry(tenant).await? {
            Some(DirectoryEntry {
                moving_to: Some(moving_to),
                ..
            }) => Err(sqlx::Error::Protocol(format!(
                "tenant {tenant:?} is moving to shard {moving_to}; retry once the move is done"
            ))),
            Some(entry) if entry.shard < shards => Ok(entry.shard),
            Some(entry) => Err(sqlx::Error::Protocol(format!(
                "idem_tenant_shards routes tenant {tenant:?} to shard {}, and there are {shards}",
                entry.shard
            ))),
            None => Ok(HashRouter::index(tenant, shards)),
        }
    }
}

/// One engine per shard and the router between them. Clones share them.
pub struct Shards<DB: Backend, R: Router = HashRouter> {
    inner: Arc<ShardSet<DB, R>>,
}

struct ShardSet<DB: Backend, R: Router> {
    engines: Vec<Engine<DB>>,
    router: R,
}

impl<DB: Backend, R: Router> ShardSet<DB, R> {
    async fn index(&self, scope: &Scope) -> Result<usize, IdemError> {
        self.router
            .shard_of(scope.first_part(), self.engines.len())
            .await
            .map_err(|source| unavailable(self.engines[0].policy(), source))
    }
}

impl<DB: Backend, R: Router> Clone for Shards<DB, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<DB: Backend, R: Router + std::fmt::Debug> std::fmt::Debug for Shards<DB, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("shards", &self.inner.engines.len())
            .field("router", &self.inner.router)
            .finish()
    }
}

impl<DB: Backend, R: Router> Shards<DB, R> {
    /// The shards, in the order the router's indexes name them. Each
    /// engine is marked with its index ([`Engine::with_shard`]), so its
    /// series, its relay's and its purger's carry a `shard` label.
    ///
    /// # Panics
    ///
    /// If `engines` is empty.
    pub fn new(engines: Vec<Engine<DB>>, router: R) -> Self {
        assert!(!engines.is_empty(), "Shards::new needs at least one engine");
        let engines = engines
            .into_iter()
            .enumerate()
            .map(|(index, engine)| engine.with_shard(index))
            .collect();
        Self {
            inner: Arc::new(ShardSet { engines, router }),
        }
    }

    /// Every shard's engine, by index.
    pub fn engines(&self) -> &[Engine<DB>] {
        &self.inner.engines
    }

    /// The router.
    pub fn router(&self) -> &R {
        &self.inner.router
    }

    /// The index of the shard that holds `scope`'s tenant (its first part).
    pub async fn index(&self, scope: &Scope) -> Result<usize, IdemError> {
        self.inner.index(scope).await
    }

    /// The engine of the shard that holds `scope`'s tenant: claims, the
    /// work's transaction and replays for that scope run there. A router
    /// that cannot answer (its directory down) is a store error: 503.
    pub async fn engine(&self, scope: &Scope) -> Result<&Engine<DB>, IdemError> {
        Ok(&self.engines()[self.index(scope).await?])
    }

    /// Runs idem's migrations on every shard, in order.
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        for engine in self.engines() {
            engine.migrate().await?;
        }
        Ok(())
    }

    /// One purger per shard ([`Engine::spawn_purger`]).
    pub fn spawn_purgers(&self, every: Duration, batch: u32) -> Vec<Purger> {
        self.engines()
            .iter()
            .map(|engine| engine.spawn_purger(every, batch))
            .collect()
    }

    /// One relay per shard, each built by `configure` from
    /// [`Relay::new`] on that shard's engine (so every shard gets the same
    /// sinks and settings) and started with [`Relay::spawn`]. The handles
    /// come back in shard order. If one fails to start, the ones already
    /// started are shut down and its error returned.
    ///
    /// ```no_run
    /// # async fn demo(shards: idem_runtime::shard::Shards<sqlx::Postgres>) -> Result<(), idem_runtime::outbox::RelayError> {
    /// use std::time::Duration;
    /// use idem_runtime::outbox::{Delivered, InProcessSink};
    /// let relays = shards
    ///     .spawn_relays(|relay| {
    ///         relay
    ///             .sink(InProcessSink::new("events", |_message| async {
    ///                 Ok(Delivered::Published { receipt: None })
    ///             }))
    ///             .poll_interval(Duration::from_millis(200))
    ///     })
    ///     .await?;
    /// // ... serve ...
    /// for relay in relays {
    ///     relay.shutdown().await;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn spawn_relays(
        &self,
        configure: impl Fn(Relay<DB>) -> Relay<DB>,
    ) -> Result<Vec<RelayHandle>, RelayError> {
        let mut relays = Vec::with_capacity(self.engines().len());
        for engine in self.engines() {
            match configure(Relay::new(engine)).spawn().await {
                Ok(relay) => relays.push(relay),
                Err(error) => {
                    for relay in relays {
                        relay.shutdown().await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(relays)
    }
}

/// The engines an operation may run on: one [`Engine`], or [`Shards`]
/// (their router erased), each operation on the engine of the shard that
/// holds its scope's tenant. Cheap to clone.
///
/// It is what an `#[idempotent(http)]` handler takes from the router's
/// state, so the same handler serves `.with_state(engine)` and
/// `.with_state(shards)` (axum's `FromRef`, implemented for both and for
/// any state the engine is taken from); an application state holding
/// shards says so in one `FromRef` impl:
///
/// ```
/// use axum::extract::FromRef;
/// use idem_runtime::shard::{DirectoryRouter, Shards};
/// use idem_runtime::Engines;
/// use sqlx::Postgres;
///
/// #[derive(Clone)]
/// struct AppState {
///     shards: Shards<Postgres, DirectoryRouter>,
/// }
///
/// impl FromRef<AppState> for Engines<Postgres> {
///     fn from_ref(state: &AppState) -> Self {
///         state.shards.clone().into()
///     }
/// }
/// ```
///
/// Outside a handler, [`Engines::for_scope`] picks the engine:
///
/// ```no_run
/// # async fn demo(engines: idem_runtime::Engines<sqlx::Postgres>) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{IdempotencyKey, Operation, Scope};
/// let op = Operation::new(Scope::tenant("acme"), IdempotencyKey::new("k-1")?, "charge.v1", &25);
/// let engine = engines.for_scope(op.scope()).await?;
/// let done = engine.run(&op, async |_tx| Ok::<_, idem_runtime::Problem>(1)).await?;
/// # let _ = done; Ok(()) }
/// ```
pub struct Engines<DB: Backend> {
    route: Route<DB>,
}

enum Route<DB: Backend> {
    One(Engine<DB>),
    Sharded(Arc<dyn ScopeRoute<DB>>),
}

/// The engine [`ScopeRoute::engine`] picks, once its future is awaited.
type Routed<'a, 's, DB> =
    Pin<Box<dyn Future<Output = Result<&'a Engine<DB>, IdemError>> + Send + 's>>;

/// [`Shards::engine`], its router erased.
trait ScopeRoute<DB: Backend>: Send + Sync {
    fn engine<'a: 's, 's>(&'a self, scope: &'s Scope) -> Routed<'a, 's, DB>;

    fn shards(&self) -> usize;
}

impl<DB: Backend, R: Router> ScopeRoute<DB> for ShardSet<DB, R> {
    fn engine<'a: 's, 's>(&'a self, scope: &'s Scope) -> Routed<'a, 's, DB> {
        Box::pin(async move { Ok(&self.engines[self.index(scope).await?]) })
    }

    fn shards(&self) -> usize {
        self.engines.len()
    }
}

impl<DB: Backend> Engines<DB> {
    /// The engine that holds `scope`'s keys: the one engine, or the engine
    /// of the shard its tenant is routed to ([`Shards::engine`]: a router
    /// that cannot answer, or a tenant being moved, is
    /// [`IdemError::Unavailable`], a 503 with `Retry-After`).
    pub async fn for_scope(&self, scope: &Scope) -> Result<&Engine<DB>, IdemError> {
        match &self.route {
            Route::One(engine) => Ok(engine),
            Route::Sharded(shards) => shards.engine(scope).await,
        }
    }
}

impl<DB: Backend> Clone for Engines<DB> {
    fn clone(&self) -> Self {
        let route = match &self.route {
            Route::One(engine) => Route::One(engine.clone()),
            Route::Sharded(shards) => Route::Sharded(shards.clone()),
        };
        Self { route }
    }
}

impl<DB: Backend> std::fmt::Debug for Engines<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.route {
            Route::One(engine) => f.debug_tuple("Engines::One").field(engine).finish(),
            Route::Sharded(shards) => f
                .debug_struct("Engines::Sharded")
                .field("shards", &shards.shards())
                .finish(),
        }
    }
}

impl<DB: Backend> From<Engine<DB>> for Engines<DB> {
    fn from(engine: Engine<DB>) -> Self {
        Self {
            route: Route::One(engine),
        }
    }
}

impl<DB: Backend, R: Router> From<Shards<DB, R>> for Engines<DB> {
    fn from(shards: Shards<DB, R>) -> Self {
        Self {
            route: Route::Sharded(shards.inner),
        }
    }
}
