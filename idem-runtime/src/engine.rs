//! The engine: claim `(scope, key)`, run the work in the claim's transaction,
//! store the outcome in that same transaction, commit; or replay, or refuse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Pool, Transaction};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::__private::{timed_out, within};
use crate::error::{whole_seconds, IdemError};
use crate::metrics;
use crate::operation::Operation;
use crate::outcome::{Disposition, Outcome, StoredResponse};
use crate::policy::{ClaimMode, FailureMode, KeyLock, Policy};
use crate::store::{Backend, Locked, Record, RecordStatus};

/// How an operation's answer came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The work ran for the first time under this key.
    Executed,
    /// The work ran after taking over a crashed attempt's expired lock.
    TookOver,
    /// The stored outcome of an earlier attempt was returned; nothing ran.
    Replayed,
    /// The store was down and the policy fails open: the work ran without deduplication.
    FailedOpen,
}

impl Via {
    /// A lowercase label for logs and metrics: `executed`, `takeover`, `replayed`, `failed_open`.
    pub fn label(self) -> &'static str {
        match self {
            Via::Executed => "executed",
            Via::TookOver => "takeover",
            Via::Replayed => "replayed",
            Via::FailedOpen => "failed_open",
        }
    }
}

/// An operation's answer and how it came about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed<O> {
    /// The outcome: fresh, or decoded from the store.
    pub value: O,
    /// Executed, taken over, replayed or failed open.
    pub via: Via,
}

impl<O: Outcome> Completed<O> {
    /// A stored response decoded into the operation's outcome type, as a replay.
    pub fn replayed(stored: StoredResponse) -> Result<Self, IdemError> {
        Ok(Completed {
            value: O::from_stored(stored)?,
            via: Via::Replayed,
        })
    }
}

/// Counters an operator watches.
#[derive(Debug, Default)]
struct Counters {
    failed_open: AtomicU64,
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Operations that ran without deduplication because the store was down.
    pub failed_open: u64,
}

/// Runs units of work under idempotency keys, on one database.
///
/// ```no_run
/// use idem_runtime::{Engine, IdempotencyKey, Operation, Scope};
/// use sqlx::Sqlite;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Engine::<Sqlite>::open_sqlite("app.db").await?;
/// engine.migrate().await?;
///
/// let op = Operation::new(Scope::tenant("acme"), IdempotencyKey::new("k-1")?, "charge-card.v1", &2500i64);
/// let done = engine
///     .run(&op, async |tx| {
///         sqlx::query("INSERT INTO payments (amount) VALUES (2500)").execute(&mut *tx).await?;
///         Ok::<_, idem_runtime::Problem>("pay_1".to_string())
///     })
///     .await?;
/// println!("{:?} via {}", done.value, done.via.label());
/// # Ok(()) }
/// ```
pub struct Engine<DB: Backend> {
    pool: Pool<DB>,
    policy: Policy,
    key_lock: KeyLock,
    counters: Arc<Counters>,
    /// Where the backend's write lock is database-wide (SQLite), claims from
    /// this engine (and its clones) queue here, first come first served,
    /// instead of polling the lock through the busy handler's sleeps.
    write_gate: Option<Arc<Semaphore>>,
}

impl<DB: Backend> Clone for Engine<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            policy: self.policy,
            key_lock: self.key_lock,
            counters: self.counters.clone(),
            write_gate: self.write_gate.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Engine<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("policy", &self.policy)
            .field("key_lock", &self.key_lock)
            .finish()
    }
}

/// The outcome of a claim: run the work, or answer from the store.
// Returned once and matched at once; boxing the guard would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Claim<DB: Backend> {
    /// This attempt owns the key: do the work through the guard, then finish it.
    Execute(ClaimGuard<DB>),
    /// A completed record with the same fingerprint exists: return it unchanged.
    Replay(StoredResponse),
}

impl<DB: Backend> Claim<DB> {
    /// Decodes a replayed response into the operation's outcome type.
    pub fn replayed<O: Outcome>(stored: StoredResponse) -> Result<Completed<O>, IdemError> {
        Completed::replayed(stored)
    }
}

impl<DB: Backend> Engine<DB> {
    /// An engine over `pool` with the default [`Policy`].
    pub fn new(pool: Pool<DB>) -> Self {
        Self {
            pool,
            policy: Policy::default(),
            key_lock: KeyLock::default(),
            counters: Arc::default(),
            write_gate: DB::SERIALIZE_WRITERS.then(|| Arc::new(Semaphore::new(1))),
        }
    }

    /// Replaces the default policy (each [`Operation`] may still override it).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets how claims hold their key ([`KeyLock::Advisory`] by default; see
    /// [`KeyLock`] for when to choose [`KeyLock::Row`]).
    pub fn with_key_lock(mut self, key_lock: KeyLock) -> Self {
        self.key_lock = key_lock;
        self
    }

    /// How claims hold their key.
    pub fn key_lock(&self) -> KeyLock {
        self.key_lock
    }

    /// The pool, for the application's own queries.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The default policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Applies idem's migrations. Safe to call on every start: applied
    /// migrations are skipped, and migrations the application applies to the
    /// same database with its own migrator are ignored.
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError>
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Connection: sqlx::migrate::Migrate,
    {
        DB::migrator().run(&self.pool).await
    }

    /// The engine's counters.
    pub fn stats(&self) -> Stats {
        Stats {
            failed_open: self.counters.failed_open.load(Ordering::Relaxed),
        }
    }

    /// Runs `work` under `op`'s key. `work` is an async closure that receives
    /// the claim's connection, inside the claim's transaction.
    ///
    /// - No record (or an expired one): `work` runs with the claim's open
    ///   transaction; its outcome is stored in that transaction if
    ///   [`Outcome::disposition`] says so, and the transaction commits. A
    ///   discarded outcome (server error) rolls everything back.
    /// - A completed record with the same fingerprint: the stored outcome is
    ///   returned, nothing runs ([`Via::Replayed`]).
    /// - A different fingerprint: [`IdemError::Mismatch`].
    /// - A live claim: [`IdemError::InProgress`] after waiting at most the
    ///   policy's `wait_timeout`.
    ///
    /// A panic in `work`, or dropping the returned future, rolls back: nothing
    /// is stored and the retry runs.
    pub async fn run<O, F>(&self, op: &Operation, work: F) -> Result<Completed<O>, IdemError>
    where
        O: Outcome + Send,
        F: AsyncFnOnce(&mut DB::Connection) -> O,
    {
        match self.claim(op).await? {
            Claim::Replay(stored) => Claim::<DB>::replayed(stored),
            Claim::Execute(mut guard) => {
                let limit = guard.work_timeout();
                match within(limit, work(guard.connection())).await {
                    Some(value) => guard.complete(value).await,
                    None => timed_out(guard).await,
                }
            }
        }
    }

    /// Claims `op`'s key. The lower-level form of [`Engine::run`], for callers
    /// that do their work in straight-line code rather than a closure.
    pub async fn claim(&self, op: &Operation) -> Result<Claim<DB>, IdemError> {
        let asked = Instant::now();
        let answer = self.claim_unrecorded(op).await;
        metrics::claim(op.step, &answer, asked.elapsed());
        answer
    }

    async fn claim_unrecorded(&self, op: &Operation) -> Result<Claim<DB>, IdemError> {
        let policy = op.policy.unwrap_or(self.policy);
        let mut conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(error) => return self.store_down(op, &policy, error).await,
        };
        // A repeat is a read: answered without a lock or a transaction.
        match DB::lookup_unlocked(&mut conn, op).await {
            Ok(record) => match decide(record, op) {
                Decision::Execute(_) => {}
                Decision::Replay(stored) => return Ok(Claim::Replay(stored)),
                Decision::Refuse(error) => return Err(error),
            },
            Err(error) => return self.store_down(op, &policy, error).await,
        }
        let permit = match &self.write_gate {
            Some(gate) => {
                // Queue without holding a connection: a storm of duplicates
                // must not drain the pool while it waits.
                drop(conn);
                let permit =
                    match tokio::time::timeout(policy.wait_timeout, gate.clone().acquire_owned())
                        .await
                    {
                        Ok(Ok(permit)) => Some(permit),
                        Ok(Err(_closed)) => None,
                        Err(_elapsed) => return Err(in_progress_unknown()),
                    };
                conn = match self.pool.acquire().await {
                    Ok(conn) => conn,
                    Err(error) => return self.store_down(op, &policy, error).await,
                };
                permit
            }
            None => None,
        };
        let Locked {
            mut tx,
            record,
            holds_row,
        } = match DB::lock_and_read(conn, op, &policy, self.key_lock).await {
            Ok(locked) => locked,
            Err(error) if DB::is_lock_busy(&error) => return Err(in_progress_unknown()),
            Err(error) => return self.store_down(op, &policy, error).await,
        };
        // A key with no row at all gets a plain insert of its completed record.
        let replaces = record.is_some() || holds_row;
        let via = match decide(record, op) {
            Decision::Execute(via) => via,
            Decision::Replay(stored) => return Ok(Claim::Replay(stored)),
            Decision::Refuse(error) => return Err(error),
        };
        let mut token = None;
        if policy.claim_mode == ClaimMode::Durable {
            // Commit the in_progress row before opening the work's transaction:
            // never hold two connections at once, so a full pool cannot deadlock.
            let claimed = claim_token();
            let committed = async {
                DB::write_in_progress(&mut tx, op, claimed, &policy).await?;
                tx.commit().await
            };
            if let Err(error) = committed.await {
                return Err(unavailable(&policy, error));
            }
            tx = match self.pool.begin().await {
                Ok(tx) => tx,
                Err(error) => {
                    let _ = DB::release_claim(&self.pool, op, claimed).await;
                    return Err(unavailable(&policy, error));
                }
            };
            token = Some(claimed);
        }
        let guard = ClaimGuard {
            tx,
            op: op.clone(),
            policy,
            via,
            replaces,
            token,
            pool: self.pool.clone(),
            // A durable claim has committed its record and no longer holds the
            // write lock while the work runs; a transactional one holds both.
            permit: if token.is_none() { permit } else { None },
            claimed_at: Instant::now(),
        };
        Ok(Claim::Execute(guard))
    }

    async fn store_down(
        &self,
        op: &Operation,
        policy: &Policy,
        error: sqlx::Error,
    ) -> Result<Claim<DB>, IdemError> {
        if policy.failure_mode == FailureMode::Closed {
            return Err(unavailable(policy, error));
        }
        self.counters.failed_open.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            backend = <DB as sqlx::Database>::NAME,
            step = op.step,
            key = %op.key.log_tag(),
            %error,
            "idempotency store unavailable; running without deduplication (fail open)"
        );
        match self.pool.begin().await {
            Ok(tx) => Ok(Claim::Execute(ClaimGuard {
                tx,
                op: op.clone(),
                policy: *policy,
                via: Via::FailedOpen,
                replaces: true,
                token: None,
                pool: self.pool.clone(),
                permit: None,
                claimed_at: Instant::now(),
            })),
            Err(error) => Err(unavailable(policy, error)),
        }
    }

    /// The steps that still have unexpired records in the store, sorted.
    pub async fn live_steps(&self) -> Result<Vec<String>, sqlx::Error> {
        DB::live_steps(&self.pool).await
    }
}

/// An owned claim: the open transaction holding the key's lock.
///
/// Dropping it without [`ClaimGuard::finish`] rolls the transaction back.
pub struct ClaimGuard<DB: Backend> {
    tx: Transaction<'static, DB>,
    op: Operation,
    policy: Policy,
    via: Via,
    /// Whether the completed record replaces one the claim found (expired or taken over).
    replaces: bool,
    token: Option<i64>,
    pool: Pool<DB>,
    /// This engine's write gate, held until commit or rollback.
    permit: Option<OwnedSemaphorePermit>,
    /// When the claim was granted: the work's duration is measured from here.
    claimed_at: Instant,
}

impl<DB: Backend> ClaimGuard<DB> {
    /// The claim's connection, inside its transaction: do the business writes here.
    pub fn connection(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }

    /// Whether this attempt executes fresh, takes over, or fails open.
    pub fn via(&self) -> Via {
        self.via
    }

    /// The operation this claim is for.
    pub fn operation(&self) -> &Operation {
        &self.op
    }

    /// The policy's bound on the work, if any.
    pub fn work_timeout(&self) -> Option<Duration> {
        self.policy.work_timeout
    }

    /// Finishes with the work's value: stores it and commits if its
    /// [`Outcome::disposition`] says so, rolls back otherwise, and hands it back.
    pub async fn complete<O: Outcome>(self, value: O) -> Result<Completed<O>, IdemError> {
        let via = self.via;
        self.finish(value.disposition()).await?;
        Ok(Completed { value, via })
    }

    /// Stores the response and commits, or rolls back on [`Disposition::Discard`].
    pub async fn finish(self, disposition: Disposition) -> Result<(), IdemError> {
        let (step, worked) = (self.op.step, self.claimed_at.elapsed());
        let result = self.settle(disposition).await;
        metrics::finished(step, worked, &result);
        result
    }

    async fn settle(self, disposition: Disposition) -> Result<(), IdemError> {
        let Self {
            mut tx,
            op,
            policy,
            via,
            replaces,
            token,
            pool,
            permit: _permit,
            claimed_at: _,
        } = self;
        let response = match disposition {
            Disposition::Store(response) => response,
            Disposition::Discard => {
                let _ = tx.rollback().await;
                if let Some(token) = token {
                    if let Err(error) = DB::release_claim(&pool, &op, token).await {
                        tracing::warn!(%error, "releasing a durable claim failed; it frees itself when its lock expires");
                    }
                }
                return Ok(());
            }
        };
        let written = match (via, token) {
            (Via::FailedOpen, _) => Ok(true),
            (_, Some(token)) => DB::complete_claim(&mut tx, &op, token, &response, &policy).await,
            (_, None) => DB::write_completed(&mut tx, &op, &response, &policy, replaces)
                .await
                .map(|()| true),
        };
        match written {
            Ok(true) => tx
                .commit()
                .await
                .map_err(|error| unavailable(&policy, error)),
            Ok(false) => Err(IdemError::LockLost),
            Err(error) => Err(unavailable(&policy, error)),
        }
    }
}

enum Decision {
    Execute(Via),
    Replay(StoredResponse),
    Refuse(IdemError),
}

/// The state table, in one place.
fn decide(record: Option<Record>, op: &Operation) -> Decision {
    let Some(record) = record else {
        return Decision::Execute(Via::Executed);
    };
    if record.expired {
        return Decision::Execute(Via::Executed);
    }
    if record.fingerprint != op.fingerprint.0 {
        return Decision::Refuse(IdemError::Mismatch);
    }
    match (record.status, record.response, record.lock_left) {
        (RecordStatus::Completed, Some(stored), _) => Decision::Replay(stored),
        (RecordStatus::Completed, None, _) => Decision::Execute(Via::Executed),
        (RecordStatus::InProgress, _, Some(left)) => Decision::Refuse(IdemError::InProgress {
            retry_after: whole_seconds(left),
        }),
        (RecordStatus::InProgress, _, None) => Decision::Execute(Via::TookOver),
    }
}

/// A duplicate waited its bound for an uncommitted claim whose lock time is unknown.
fn in_progress_unknown() -> IdemError {
    IdemError::InProgress {
        retry_after: Duration::from_secs(1),
    }
}

fn unavailable(policy: &Policy, source: sqlx::Error) -> IdemError {
    IdemError::Unavailable {
        retry_after: whole_seconds(policy.unavailable_retry_after),
        source,
    }
}

/// A random token that marks which attempt owns a durable claim.
fn claim_token() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    use std::time::{SystemTime, UNIX_EPOCH};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.finish() as i64
}
