//! A tenant moved from one Postgres shard to another without a retry running
//! twice: [`TenantMove`].
//!
//! The move runs in steps, each recorded before the next starts, so a move
//! killed anywhere is finished by running it again:
//!
//! 1. **Route fenced.** The tenant's directory row gets `moving_to = <target>`.
//!    From then on [`Shards::engine`] answers the tenant with
//!    [`IdemError::Unavailable`](crate::IdemError::Unavailable) (503 with
//!    `Retry-After`), so no new request reaches either shard.
//! 2. **Source fenced.** On the source shard, a row in `idem_tenant_fences`
//!    marks the tenant as moved away, and the move takes an exclusive
//!    advisory lock on the tenant (held until the source's copies are
//!    deleted). A trigger on `idempotency_keys` (insert, update) and
//!    `idem_outbox` (insert) refuses the tenant's writes with SQLSTATE
//!    `IDEMF` while the lock is held or the fence row exists: it takes the
//!    tenant's lock in shared mode (`pg_try_advisory_xact_lock_shared`,
//!    never waiting), then reads the fence row in a snapshot of its own. A
//!    claim that was routed to the source before step 1 and commits after
//!    the fence is rolled back and answered 503; one whose record was
//!    written before holds the shared lock until it commits, and the move
//!    waits for it before it copies. The trigger, the fence table and the
//!    lock exist only on databases that took part in a move: an engine on
//!    a database of its own is unchanged.
//! 3. **Messages parked.** The tenant's pending outbox messages on the source
//!    are leased to the move for ever (`lease_owner = 'idem-tenant-move'`,
//!    the lease token bumped), once no relay holds a live lease on any of
//!    them (the move waits for those leases to end, at most
//!    [`TenantMove::lease_wait`]). The source's relay skips them from then
//!    on, so only the target's relay can deliver them.
//! 4. **Copied.** In one transaction on the target shard: the tenant's
//!    records whose retention has not run out (completed, and in progress
//!    too), its pending and dead outbox messages (lease cleared, oldest
//!    first), and the removal of any fence left by an earlier move away
//!    from the target. Records the target has already are kept, so a copy
//!    repeated after a crash adds nothing twice.
//! 5. **Flipped.** The directory row routes the tenant to the target and
//!    records the source in `moved_from`; requests are served by the target.
//! 6. **Deleted.** In one transaction on the source, the tenant's key
//!    records and its unsent messages. The fence row stays, so a request
//!    routed before the flip and arriving late is refused, never run on the
//!    source.
//! 7. **Done.** `moved_from` is cleared.
//!
//! A kill at any step leaves the directory routing the tenant to one shard
//! (the source, fenced and answering 503, until the flip; the target after
//! it) and every record on the source until the flip; after it, on the
//! target. Running the move again with the same target resumes it.
//!
//! What is moved is idem's own rows. The business rows of the tenant are the
//! service's, and are moved by the service while the tenant is fenced
//! (between steps 2 and 5). The inbox's claims are key records and move with
//! the tenant when their scope starts with the tenant; `idem_poison` rows
//! have no tenant and stay where they are.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool, Postgres};

use super::{directory_entry, DirectoryEntry, DirectoryRouter, HashRouter, Shards};
use crate::faults::{abort_at, FaultPoint};
use crate::Scope;

/// The advisory lock class of a tenant's fence on a shard ("idmv"); the
/// second key is `hashtext(tenant)`.
const FENCE_LOCK_CLASS: i32 = 0x6964_6d76;

/// The advisory lock class of the moves themselves ("idmd"): on the
/// directory, one move of a tenant at a time (second key `hashtext(tenant)`);
/// on a shard, one installation of the fence at a time (second key 0).
const MOVE_LOCK_CLASS: i32 = 0x6964_6d64;

/// Who holds a parked message's lease.
const MOVE_LEASE_OWNER: &str = "idem-tenant-move";

/// The SQLSTATE the fence's trigger refuses a fenced tenant's write with.
pub const FENCED: &str = "IDEMF";

/// The fence's table, its trigger and the function that finds a stored
/// scope's tenant, installed on a shard by the first move that touches it.
const FENCE_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS idem_tenant_fences (
    tenant    text COLLATE "C" PRIMARY KEY,
    moved_to  int         NOT NULL,
    fenced_at timestamptz NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION idem_scope_tenant(p_scope text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN split_part(p_scope, ':', 1) ~ '^[0-9]{1,9}$'
        THEN convert_from(substring(convert_to(p_scope, 'UTF8')
                 FROM length(split_part(p_scope, ':', 1)) + 2
                 FOR split_part(p_scope, ':', 1)::int), 'UTF8')
        ELSE '' END
$$;
CREATE OR REPLACE FUNCTION idem_tenant_fence() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_tenant text := idem_scope_tenant(NEW.scope);
BEGIN
    -- Two statements: the fence row is read in a snapshot taken after the
    -- shared lock is granted, so a fence committed before a move's
    -- exclusive lock is always seen.
    IF NOT pg_try_advisory_xact_lock_shared(1768189302, hashtext(v_tenant)) THEN
        RAISE EXCEPTION USING ERRCODE = 'IDEMF',
            MESSAGE = format('tenant %s is moving to another shard; retry later', v_tenant);
    END IF;
    IF EXISTS (SELECT 1 FROM idem_tenant_fences WHERE tenant = v_tenant) THEN
        RAISE EXCEPTION USING ERRCODE = 'IDEMF',
            MESSAGE = format('tenant %s moved to another shard', v_tenant);
    END IF;
    RETURN NEW;
END
$$;
"#;

/// The fence's triggers. Creating one locks its table against writes until
/// the transactions writing it end, so they are created once per shard, by
/// the first move that touches it, and never replaced.
const FENCE_TRIGGERS: &str = r#"
CREATE TRIGGER idem_tenant_fence BEFORE INSERT OR UPDATE ON idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION idem_tenant_fence();
CREATE TRIGGER idem_tenant_fence BEFORE INSERT ON idem_outbox
    FOR EACH ROW EXECUTE FUNCTION idem_tenant_fence();
"#;

/// The rows of the tenant whose stored scope prefix is `$1`.
const OF_TENANT: &str = "(scope = $1 OR starts_with(scope, $1 || '/'))";

/// Why a move did not finish.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The target is not one of the shards.
    #[error("shard {shard} does not exist: there are {shards} shards, numbered from 0")]
    ShardOutOfRange {
        /// The target asked for.
        shard: usize,
        /// How many shards there are.
        shards: usize,
    },
    /// The tenant is not in the directory and has no records on the shard
    /// the hash routes it to.
    #[error("tenant {0:?} is not in the directory and has no records on its shard")]
    UnknownTenant(String),
    /// The tenant is in the middle of a move to another shard: finish that
    /// one first (run it again with its target).
    #[error(
        "tenant {tenant:?} is being moved to shard {moving_to}; run that move again to finish it"
    )]
    AnotherMove {
        /// The tenant.
        tenant: String,
        /// The target of the unfinished move.
        moving_to: usize,
    },
    /// Another process is moving this tenant right now.
    #[error("another process is moving tenant {0:?} right now")]
    MoveRunning(String),
    /// A relay still held a live lease on some of the tenant's messages
    /// after [`TenantMove::lease_wait`]; the tenant stays fenced on its
    /// source, and running the move again continues from there.
    #[error(
        "{messages} outbox messages of the tenant are still leased by a relay; run the move again"
    )]
    LeasesHeld {
        /// How many.
        messages: i64,
    },
    /// A database failed (or a lock wait ran out).
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

/// What a finished move did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The shard the tenant was on.
    pub from: usize,
    /// The shard it is on now.
    pub to: usize,
    /// Key records copied to the target by this run.
    pub keys: u64,
    /// Outbox messages copied to the target by this run.
    pub messages: u64,
    /// The tenant was already on the target with no move left to finish:
    /// nothing was done.
    pub already_there: bool,
}

/// Moves one tenant's key records and unsent outbox messages from its shard
/// to another, with its writes fenced, the route flipped in the directory
/// of [`DirectoryRouter`] (see the [module docs](self) for the steps).
///
/// ```no_run
/// # async fn demo(shards: idem_runtime::shard::Shards<sqlx::Postgres, idem_runtime::shard::DirectoryRouter>)
/// # -> Result<(), idem_runtime::shard::MoveError> {
/// use idem_runtime::shard::TenantMove;
/// let moved = TenantMove::new("acme", 2).run(&shards).await?;
/// println!("acme: shard {} -> {}, {} keys", moved.from, moved.to, moved.keys);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TenantMove {
    tenant: String,
    to: usize,
    lease_wait: Duration,
    lock_wait: Duration,
    fault: Option<FaultPoint>,
}

impl TenantMove {
    /// A move of `tenant` to shard `to`, waiting at most 30 s for relays'
    /// leases and 10 s for locks.
    pub fn new(tenant: impl Into<String>, to: usize) -> Self {
        Self {
            tenant: tenant.into(),
            to,
            lease_wait: Duration::from_secs(30),
            lock_wait: Duration::from_secs(10),
            fault: None,
        }
    }

    /// How long to wait for relays to finish the deliveries they leased of
    /// the tenant's messages ([`MoveError::LeasesHeld`] after that).
    pub fn lease_wait(mut self, wait: Duration) -> Self {
        self.lease_wait = wait;
        self
    }

    /// How long to wait for a lock: the tenant's on the source (held by
    /// claims that are committing), the directory row.
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// A crash point for tests ([`FaultPoint::TenantMoveAfterFence`] and the
    /// others of the move); only a build with the `faults` feature aborts.
    pub fn fault(mut self, fault: Option<FaultPoint>) -> Self {
        self.fault = fault;
        self
    }

    /// Runs the move to its end, or resumes one that was killed.
    pub async fn run(
        &self,
        shards: &Shards<Postgres, DirectoryRouter>,
    ) -> Result<Moved, MoveError> {
        let pools: Vec<PgPool> = shards.engines().iter().map(|e| e.pool().clone()).collect();
        if self.to >= pools.len() {
            return Err(MoveError::ShardOutOfRange {
                shard: self.to,
                shards: pools.len(),
            });
        }
        let directory = shards.router().pool().clone();
        // One move of the tenant at a time: a session lock on the directory,
        // released when this connection closes.
        let mut guard = directory.acquire().await?.detach();
        let running: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(MOVE_LOCK_CLASS)
            .bind(&self.tenant)
            .fetch_one(&mut guard)
            .await?;
        if !running {
            return Err(MoveError::MoveRunning(self.tenant.clone()));
        }
        let result = self.run_locked(&directory, &pools).await;
        let _ = guard.close().await;
        result
    }

    async fn run_locked(&self, directory: &PgPool, pools: &[PgPool]) -> Result<Moved, MoveError> {
        let row = directory_entry(directory, &self.tenant).await?;
        let from = match row {
            Some(DirectoryEntry {
                shard,
                moved_from: Some(moved_from),
                ..
            }) => {
                // A flipped move whose source was not cleaned: finish it.
                self.delete_from_source(directory, &pools[moved_from])
                    .await?;
                if shard == self.to {
                    return Ok(Moved {
                        from: moved_from,
                        to: self.to,
                        keys: 0,
                        messages: 0,
                        already_there: false,
                    });
                }
                shard
            }
            Some(DirectoryEntry {
                moving_to: Some(moving_to),
                ..
            }) if moving_to != self.to => {
                return Err(MoveError::AnotherMove {
                    tenant: self.tenant.clone(),
                    moving_to,
                })
            }
            Some(entry) => entry.shard,
            None => HashRouter::index(&self.tenant, pools.len()),
        };
        if from >= pools.len() {
            return Err(MoveError::ShardOutOfRange {
                shard: from,
                shards: pools.len(),
            });
        }
        if from == self.to {
            return Ok(Moved {
                from,
                to: self.to,
                keys: 0,
                messages: 0,
                already_there: true,
            });
        }
        if row.is_none() && !self.has_rows(&pools[from]).await? {
            return Err(MoveError::UnknownTenant(self.tenant.clone()));
        }
        let (source, target) = (&pools[from], &pools[self.to]);

        // 1. The route: every new request of the tenant is a 503.
        sqlx::query(
            "INSERT INTO idem_tenant_shards (tenant, shard, moving_to) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant) DO UPDATE SET moving_to = EXCLUDED.moving_to",
        )
        .bind(&self.tenant)
        .bind(from as i32)
        .bind(self.to as i32)
        .execute(directory)
        .await?;

        // 2. The source: the fence row, then the tenant's exclusive lock,
        // which waits for claims that wrote before the fence to commit.
        install_fence(source).await?;
        install_fence(target).await?;
        sqlx::query(
            "INSERT INTO idem_tenant_fences (tenant, moved_to) VALUES ($1, $2) \
             ON CONFLICT (tenant) DO UPDATE SET moved_to = EXCLUDED.moved_to, fenced_at = now()",
        )
        .bind(&self.tenant)
        .bind(self.to as i32)
        .execute(source)
        .await?;
        let mut fenced = self.lock_tenant(source).await?;
        abort_at(self.fault, FaultPoint::TenantMoveAfterFence);

        // 3. Messages parked on the source, once no relay delivers them.
        self.park_messages(&mut fenced).await?;

        // 4. The copy, in one transaction on the target.
        let (keys, messages) = self.copy(&mut fenced, target).await?;
        abort_at(self.fault, FaultPoint::TenantMoveAfterCopy);

        // 5. The flip.
        sqlx::query(
            "UPDATE idem_tenant_shards SET shard = $2, moving_to = NULL, moved_from = $3 \
             WHERE tenant = $1",
        )
        .bind(&self.tenant)
        .bind(self.to as i32)
        .bind(from as i32)
        .execute(directory)
        .await?;
        abort_at(self.fault, FaultPoint::TenantMoveAfterFlip);

        // 6 and 7. The source's copies, then the directory's record of the move.
        self.finish(directory, fenced).await?;
        Ok(Moved {
            from,
            to: self.to,
            keys,
            messages,
            already_there: false,
        })
    }

    fn prefix(&self) -> String {
        Scope::tenant(&self.tenant).as_stored().to_owned()
    }

    async fn has_rows(&self, pool: &PgPool) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM idempotency_keys WHERE {OF_TENANT}) \
                 OR EXISTS (SELECT 1 FROM idem_outbox WHERE {OF_TENANT})"
        ))
        .bind(self.prefix())
        .fetch_one(pool)
        .await
    }

    /// A connection of its own on `source` holding the tenant's exclusive
    /// lock, taken within the lock wait.
    async fn lock_tenant(&self, source: &PgPool) -> Result<PgConnection, sqlx::Error> {
        let mut conn = source.acquire().await?.detach();
        sqlx::query("SELECT set_config('lock_timeout', $1, false)")
            .bind(format!("{}ms", self.lock_wait.as_millis().max(1)))
            .execute(&mut conn)
            .await?;
        sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
            .bind(FENCE_LOCK_CLASS)
            .bind(&self.tenant)
            .execute(&mut conn)
            .await?;
        Ok(conn)
    }

    async fn park_messages(&self, source: &mut PgConnection) -> Result<(), MoveError> {
        let deadline = tokio::time::Instant::now() + self.lease_wait;
        loop {
            // A row a relay is leasing right now is locked by its claim:
            // the update waits for that claim, then sees its lease.
            sqlx::query(&format!(
                "UPDATE idem_outbox SET lease_until = 'infinity', lease_owner = $2, \
                   lease_token = lease_token + 1 \
                 WHERE {OF_TENANT} AND state = 'pending' AND lease_owner IS DISTINCT FROM $2 \
                   AND (lease_until IS NULL OR lease_until <= now())"
            ))
            .bind(self.prefix())
            .bind(MOVE_LEASE_OWNER)
            .execute(&mut *source)
            .await?;
            let leased: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM idem_outbox WHERE {OF_TENANT} AND state = 'pending' \
                   AND lease_owner IS DISTINCT FROM $2"
            ))
            .bind(self.prefix())
            .bind(MOVE_LEASE_OWNER)
            .fetch_one(&mut *source)
            .await?;
            if leased == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(MoveError::LeasesHeld { messages: leased });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn copy(
        &self,
        source: &mut PgConnection,
        target: &PgPool,
    ) -> Result<(u64, u64), sqlx::Error> {
        let keys: String = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg(to_jsonb(k)), '[]')::text FROM idempotency_keys k \
             WHERE {OF_TENANT} AND expires_at > now()"
        ))
        .bind(self.prefix())
        .fetch_one(&mut *source)
        .await?;
        let messages: String = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg(to_jsonb(o) - 'lease_until' - 'lease_owner' ORDER BY o.id), \
               '[]')::text \
             FROM idem_outbox o WHERE {OF_TENANT} AND state IN ('pending', 'dead')"
        ))
        .bind(self.prefix())
        .fetch_one(&mut *source)
        .await?;

        let mut tx = target.begin().await?;
        sqlx::query("DELETE FROM idem_tenant_fences WHERE tenant = $1")
            .bind(&self.tenant)
            .execute(&mut *tx)
            .await?;
        let copied_keys = sqlx::query(
            "INSERT INTO idempotency_keys \
             SELECT * FROM jsonb_populate_recordset(NULL::idempotency_keys, $1::jsonb) \
             ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(&keys)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Every column but the identity, in the target's own order.
        let columns: String = sqlx::query_scalar(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute \
             WHERE attrelid = 'idem_outbox'::regclass AND attnum > 0 AND NOT attisdropped \
               AND attname <> 'id'",
        )
        .fetch_one(&mut *tx)
        .await?;
        let copied_messages = sqlx::query(&format!(
            "INSERT INTO idem_outbox ({columns}) \
             SELECT {columns} FROM jsonb_populate_recordset(NULL::idem_outbox, $1::jsonb) \
             ORDER BY id ON CONFLICT (message_id) DO NOTHING"
        ))
        .bind(&messages)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if copied_messages > 0 {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(crate::store::outbox::NOTIFY_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok((copied_keys, copied_messages))
    }

    /// Finishes a flipped move: the source's copies deleted, then the
    /// directory's record of the move cleared.
    async fn delete_from_source(
        &self,
        directory: &PgPool,
        source: &PgPool,
    ) -> Result<(), MoveError> {
        let fenced = self.lock_tenant(source).await?;
        self.finish(directory, fenced).await
    }

    /// Steps 6 and 7 on the connection holding the tenant's lock on the
    /// source: its copies there deleted, then `moved_from` cleared.
    async fn finish(&self, directory: &PgPool, mut fenced: PgConnection) -> Result<(), MoveError> {
        delete_tenant(&mut fenced, &self.tenant).await?;
        let _ = fenced.close().await;
        abort_at(self.fault, FaultPoint::TenantMoveAfterDelete);
        sqlx::query("UPDATE idem_tenant_shards SET moved_from = NULL WHERE tenant = $1")
            .bind(&self.tenant)
            .execute(directory)
            .await?;
        Ok(())
    }
}

/// Installs the fence's table, function and triggers on `pool` if missing.
async fn install_fence(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
        .bind(MOVE_LOCK_CLASS)
        .execute(&mut *tx)
        .await?;
    sqlx::Executor::execute(&mut *tx, FENCE_SCHEMA).await?;
    let installed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger \
         WHERE tgname = 'idem_tenant_fence' AND tgrelid = 'idempotency_keys'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !installed {
        sqlx::Executor::execute(&mut *tx, FENCE_TRIGGERS).await?;
    }
    tx.commit().await
}

/// Deletes `tenant`'s key records and unsent messages on the connection
/// that holds its fence, in one transaction.
async fn delete_tenant(source: &mut PgConnection, tenant: &str) -> Result<(), sqlx::Error> {
    let prefix = Scope::tenant(tenant).as_stored().to_owned();
    let mut tx = source.begin().await?;
    sqlx::query(&format!("DELETE FROM idempotency_keys WHERE {OF_TENANT}"))
        .bind(&prefix)
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!(
        "DELETE FROM idem_outbox WHERE {OF_TENANT} AND state IN ('pending', 'dead')"
    ))
    .bind(&prefix)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}
