//! The engine: claim `(scope, key)`, run the work in the claim's transaction,
//! store the outcome in that same transaction, commit; or replay, or refuse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Pool, Transaction};

use crate::batch::{Batcher, NoTurn, Solo, Turn};
use crate::error::{whole_seconds, IdemError};
use crate::faults::FaultPoint;
use crate::metrics::{self, ClaimOutcome, ShardLabel};
use crate::operation::Operation;
use crate::outcome::{Outcome, ReplayError, StoredResponse};
use crate::policy::{ClaimMode, FailureMode, Policy};
use crate::replay_cache::ReplayCache;
use crate::store::{Backend, Fresh, Locked, Record, RecordStatus};

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
    /// The variant's name in snake case, for logs and metrics: `executed`,
    /// `took_over`, `replayed`, `failed_open`.
    ///
    /// ```
    /// use idem_runtime::Via;
    /// assert_eq!(Via::TookOver.as_str(), "took_over");
    /// assert_eq!(Via::FailedOpen.to_string(), "failed_open");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Executed => "executed",
            Via::TookOver => "took_over",
            Via::Replayed => "replayed",
            Via::FailedOpen => "failed_open",
        }
    }
}

impl From<Via> for ClaimOutcome {
    fn from(via: Via) -> Self {
        match via {
            Via::Executed => ClaimOutcome::Executed,
            Via::TookOver => ClaimOutcome::TookOver,
            Via::Replayed => ClaimOutcome::Replayed,
            Via::FailedOpen => ClaimOutcome::FailedOpen,
        }
    }
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation's answer and how it came about: fresh, taken over, replayed
/// or failed open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<O> {
    /// The outcome: fresh, or decoded from the store.
    pub value: O,
    /// Executed, taken over, replayed or failed open.
    pub via: Via,
}

/// A stored outcome found by a claim, to be answered unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    stored: StoredResponse,
}

impl Replay {
    /// The stored outcome decoded into the operation's outcome type.
    ///
    /// ```
    /// # async fn demo(engine: idem_runtime::Engine<sqlx::Sqlite>, op: idem_runtime::Operation) -> Result<(), idem_runtime::IdemError> {
    /// use idem_runtime::{Claim, Problem};
    /// if let Claim::Replay(replay) = engine.claim(&op).await? {
    ///     let answer = replay.decode::<Result<i64, Problem>>()?;
    ///     println!("{:?} ({})", answer.value, answer.via);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn decode<O: Outcome>(self) -> Result<Answer<O>, IdemError> {
        Ok(Answer {
            value: O::from_stored(self.stored)?,
            via: Via::Replayed,
        })
    }

    /// The stored outcome as it is in the store.
    pub fn stored(&self) -> &StoredResponse {
        &self.stored
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
/// println!("{:?} via {}", done.value, done.via);
/// # Ok(()) }
/// ```
pub struct Engine<DB: Backend> {
    pool: Pool<DB>,
    policy: Policy,
    /// The backend's own settings (Postgres: its key lock).
    pub(crate) settings: DB::Settings,
    counters: Arc<Counters>,
    /// Where the backend's write lock is database-wide (SQLite), claims from
    /// this engine (and its clones) queue here for its one writer, first
    /// come first served, and share its commits ([`crate::batch`]).
    batcher: Option<Arc<Batcher<DB>>>,
    /// The records this process completed, if the engine keeps them.
    replay_cache: Option<Arc<ReplayCache>>,
    /// The `shard` label of its series, when it is one of a `Shards`.
    shard: ShardLabel,
}

impl<DB: Backend> Clone for Engine<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            policy: self.policy,
            settings: self.settings,
            counters: self.counters.clone(),
            batcher: self.batcher.clone(),
            replay_cache: self.replay_cache.clone(),
            shard: self.shard.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Engine<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("policy", &self.policy)
            .field("settings", &self.settings)
            .finish()
    }
}

/// The outcome of a claim: run the work, or answer from the store.
// Returned once and matched at once; boxing the guard would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Claim<DB: Backend> {
    /// This attempt owns the key: do the work through the guard, then finish it.
    Execute(ClaimGuard<DB>),
    /// A completed record with the same fingerprint exists: answer it unchanged.
    Replay(Replay),
}

impl<DB: Backend> Engine<DB> {
    /// An engine over `pool` with the default [`Policy`].
    pub fn new(pool: Pool<DB>) -> Self {
        Self {
            pool,
            policy: Policy::default(),
            settings: DB::Settings::default(),
            counters: Arc::default(),
            batcher: DB::SERIALIZE_WRITERS.then(|| Arc::new(Batcher::new(None))),
            replay_cache: None,
            shard: ShardLabel::NONE,
        }
    }

    /// Keeps the records this engine (and its clones) completes in `cache`,
    /// and answers a repeat of one from it without a round trip to the
    /// store: same scope, key and fingerprint, before the record's expiry.
    /// Per process: see [`ReplayCache`] for what that means when an operator
    /// deletes a key.
    ///
    /// ```no_run
    /// use idem_runtime::{Engine, ReplayCache};
    /// # async fn demo() -> Result<(), sqlx::Error> {
    /// let engine = Engine::<sqlx::Sqlite>::open_sqlite("app.db")
    ///     .await?
    ///     .with_replay_cache(ReplayCache::new(10_000, 16 * 1024 * 1024));
    /// assert!(engine.replay_cache().is_some());
    /// # Ok(()) }
    /// ```
    pub fn with_replay_cache(mut self, cache: ReplayCache) -> Self {
        self.replay_cache = Some(Arc::new(cache));
        self
    }

    /// Makes the process abort at `point` (the group commit's
    /// [`FaultPoint::BatchBeforeCommit`] and [`FaultPoint::BatchAfterCommit`]),
    /// with the `faults` feature on; for crash tests. Without the feature,
    /// no effect.
    pub fn with_fault(mut self, point: FaultPoint) -> Self {
        if self.batcher.is_some() {
            self.batcher = Some(Arc::new(Batcher::new(Some(point))));
        }
        self
    }

    /// The engine's replay cache, if it keeps one.
    pub fn replay_cache(&self) -> Option<&ReplayCache> {
        self.replay_cache.as_deref()
    }

    /// Forgets every record the replay cache holds (after an operator
    /// deleted keys from the store, say); no effect without a cache.
    pub fn clear_replay_cache(&self) {
        if let Some(cache) = &self.replay_cache {
            cache.clear();
        }
    }

    /// Replaces the default policy (each [`Operation`] may still override it).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// This engine's policy and backend settings over another pool of the
    /// same database (one sized differently, say).
    pub fn with_pool(self, pool: Pool<DB>) -> Self {
        Self { pool, ..self }
    }

    /// Marks this engine as shard `index` of a
    /// [`Shards`](crate::shard::Shards) (which calls this for each of its
    /// engines): the series it, its relay and its purger record carry the
    /// label `shard="<index>"` (see [`crate::metrics`]).
    ///
    /// ```no_run
    /// # async fn demo(url: &str) -> Result<(), sqlx::Error> {
    /// use idem_runtime::Engine;
    /// let engine = Engine::<sqlx::Postgres>::connect_postgres(url).await?.with_shard(2);
    /// assert_eq!(engine.shard(), Some(2));
    /// # Ok(()) }
    /// ```
    pub fn with_shard(mut self, index: usize) -> Self {
        self.shard = ShardLabel::of(index);
        self
    }

    /// The shard index set by [`Engine::with_shard`]; `None` for an
    /// unsharded engine.
    pub fn shard(&self) -> Option<usize> {
        self.shard.index()
    }

    pub(crate) fn shard_label(&self) -> &ShardLabel {
        &self.shard
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
    /// migrations are skipped. idem keeps its own bookkeeping table
    /// (`_idem_migrations`), so the application's own `sqlx::migrate!()`
    /// migrations run beside them, before or after, untouched; see
    /// [`crate::migrations`].
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        DB::run_migrations(&self.pool).await
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
    ///   [`Outcome::to_stored`] keeps it, and the transaction commits. A
    ///   discarded outcome (server error) rolls everything back.
    /// - A completed record with the same fingerprint: the stored outcome is
    ///   returned, nothing runs ([`Via::Replayed`]).
    /// - A different fingerprint: [`IdemError::Mismatch`].
    /// - A live claim: [`IdemError::InProgress`] after waiting at most the
    ///   policy's `wait_timeout`.
    ///
    /// A panic in `work`, or dropping the returned future, rolls back: nothing
    /// is stored and the retry runs.
    pub async fn run<O, F>(&self, op: &Operation, work: F) -> Result<Answer<O>, IdemError>
    where
        O: Outcome + Send,
        F: AsyncFnOnce(&mut DB::Connection) -> O,
    {
        self.run_as(op, O::to_stored, O::from_stored, work).await
    }

    /// [`Engine::run`] for work that is safe to run again in this process:
    /// when the claim's transaction loses to a concurrent one (a
    /// serialization failure under `SERIALIZABLE` or `REPEATABLE READ`, or a
    /// deadlock, raised by the claim, the work or the `COMMIT`), nothing
    /// was committed, and the whole claim and work run again, at most
    /// [`Policy::conflict_retries`] more times. The work sees the conflict
    /// as an error of its statements; returning it as a [`Problem`](crate::Problem)
    /// (`?` on a `sqlx::Error` does) or any error whose
    /// [`ErrorStatus::is_conflict`](crate::ErrorStatus::is_conflict) says so
    /// asks for the re-run. A re-run that finds the key completed meanwhile
    /// replays it. Past the bound, or for a durable claim (whose work calls
    /// other systems), the answer is [`IdemError::Conflict`] (or the work's
    /// own conflict error): a 503 with `Retry-After`, so the client retries.
    ///
    /// ```no_run
    /// # async fn demo(engine: idem_runtime::Engine<sqlx::Postgres>, op: idem_runtime::Operation) -> Result<(), idem_runtime::IdemError> {
    /// let done = engine
    ///     .run_repeatable(&op, async |tx| {
    ///         sqlx::query("UPDATE accounts SET balance = balance - 25 WHERE id = 1")
    ///             .execute(&mut *tx)
    ///             .await?;
    ///         Ok::<_, idem_runtime::Problem>("debited".to_string())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_repeatable<O, F>(
        &self,
        op: &Operation,
        mut work: F,
    ) -> Result<Answer<O>, IdemError>
    where
        O: Outcome + Send,
        F: AsyncFnMut(&mut DB::Connection) -> O,
    {
        let policy = op.policy.unwrap_or(self.policy);
        let reruns = match policy.claim_mode {
            ClaimMode::Durable => 0,
            ClaimMode::Transactional => policy.conflict_retries,
        };
        let mut rerun = 0;
        loop {
            let answer = self
                .run_as(op, O::to_stored, O::from_stored, async |conn| {
                    work(conn).await
                })
                .await;
            let conflicted = match &answer {
                Err(IdemError::Conflict { .. }) => true,
                Ok(answer) => answer.value.is_conflict(),
                Err(_) => false,
            };
            if !conflicted || rerun >= reruns {
                return answer;
            }
            rerun += 1;
            // Apart from the transaction it lost to, which is likely
            // still finishing: a few milliseconds, growing.
            tokio::time::sleep(Duration::from_millis(u64::from(rerun) * 5)).await;
        }
    }

    /// [`Engine::run`] for an outcome type whose storage is given as its two
    /// functions: what to keep of a value, and how to rebuild one from a
    /// replay. The code `#[idempotent]` generates reaches this, with
    /// functions named on the user's types so a type that cannot be stored
    /// is reported there.
    pub(crate) async fn run_as<O, F>(
        &self,
        op: &Operation,
        to_stored: fn(&O) -> Option<StoredResponse>,
        from_stored: fn(StoredResponse) -> Result<O, ReplayError>,
        work: F,
    ) -> Result<Answer<O>, IdemError>
    where
        F: AsyncFnOnce(&mut DB::Connection) -> O,
    {
        let mut guard = match self.claim(op).await? {
            Claim::Replay(Replay { stored }) => {
                return Ok(Answer {
                    value: from_stored(stored)?,
                    via: Via::Replayed,
                })
            }
            Claim::Execute(guard) => guard,
        };
        let limit = guard.work_timeout();
        let work = work(&mut guard);
        let value = match limit {
            None => work.await,
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(value) => value,
                Err(_elapsed) => {
                    guard.settle(None).await?;
                    return Err(IdemError::TimedOut { limit });
                }
            },
        };
        let via = guard.via;
        guard.settle(to_stored(&value)).await?;
        Ok(Answer { value, via })
    }

    /// Claims `op`'s key. The lower-level form of [`Engine::run`], for callers
    /// that do their work in straight-line code rather than a closure.
    pub async fn claim(&self, op: &Operation) -> Result<Claim<DB>, IdemError> {
        let asked = Instant::now();
        let answer = self.claim_unrecorded(op).await;
        let outcome = match &answer {
            Ok(Claim::Replay(_)) => ClaimOutcome::Replayed,
            Ok(Claim::Execute(guard)) => guard.via.into(),
            Err(error) => ClaimOutcome::of_error(error),
        };
        metrics::claim(&self.shard, op.step, outcome, asked.elapsed());
        answer
    }

    async fn claim_unrecorded(&self, op: &Operation) -> Result<Claim<DB>, IdemError> {
        // Before anything reaches the store: a record completed later expires later.
        let asked = Instant::now();
        if let Some(stored) = self.replay_cache.as_ref().and_then(|cache| cache.get(op)) {
            return Ok(Claim::Replay(Replay { stored }));
        }
        let policy = op.policy.unwrap_or(self.policy);
        let batched =
            policy.group_commit.is_some() && policy.claim_mode == ClaimMode::Transactional;
        if let Some(batcher) = self.batcher.as_ref().filter(|_| batched) {
            if let Some(turn) = batcher
                .turn_if_idle(&self.pool, op, &policy, self.settings)
                .await
            {
                return self.claim_from_turn(op, policy, turn).await;
            }
        }
        let mut conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(error) => return self.store_down(op, &policy, error).await,
        };
        // A fresh key (the common case, on a backend that can) is locked and
        // its transaction opened in one round trip; a key with any record
        // comes back and is claimed the usual way below.
        let mut read_already = false;
        if DB::fresh_first(self.settings) {
            match DB::lock_if_fresh(conn, op, &policy).await {
                Ok(Fresh::Locked(tx)) => {
                    let locked = Locked {
                        tx,
                        record: None,
                        holds_row: false,
                    };
                    return self
                        .claim_locked(op, policy, locked, None, asked, true)
                        .await;
                }
                // Read under the lock: a replay or a refusal is final; an
                // expired record or a crashed claim is claimed below.
                Ok(Fresh::Found(Some(record))) => match decide(Some(record), op) {
                    Decision::Execute(_) => read_already = true,
                    Decision::Replay(stored) => return Ok(Claim::Replay(Replay { stored })),
                    Decision::Refuse(error) => return Err(error),
                },
                Ok(Fresh::Found(None)) => {}
                Err(error) if DB::is_lock_busy(&error) => return Err(in_progress_unknown()),
                Err(error) => return self.store_down(op, &policy, error).await,
            }
            conn = match self.pool.acquire().await {
                Ok(conn) => conn,
                Err(error) => return self.store_down(op, &policy, error).await,
            };
        }
        // A repeat is a read: answered without a lock or a transaction.
        if !read_already && DB::reads_before_lock(self.settings) {
            match DB::lookup_unlocked(&mut conn, op).await {
                Ok(record) => match decide(record, op) {
                    Decision::Execute(_) => {}
                    Decision::Replay(stored) => return Ok(Claim::Replay(Replay { stored })),
                    Decision::Refuse(error) => return Err(error),
                },
                Err(error) => return self.store_down(op, &policy, error).await,
            }
        }
        let permit = match &self.batcher {
            None => None,
            Some(batcher) => {
                // The writer's turn is waited for without a connection: a
                // storm of duplicates must not drain the pool while it waits.
                drop(conn);
                if batched {
                    let turn = batcher.turn(&self.pool, op, &policy, self.settings).await;
                    return self.claim_from_turn(op, policy, turn).await;
                }
                let solo = match batcher.alone(op, policy.wait_timeout).await {
                    Ok(solo) => solo,
                    Err(no_turn) => return self.no_turn(op, &policy, no_turn).await,
                };
                conn = match self.pool.acquire().await {
                    Ok(conn) => conn,
                    Err(error) => return self.store_down(op, &policy, error).await,
                };
                Some(solo)
            }
        };
        let locked = match DB::lock_and_read(conn, op, &policy, self.settings).await {
            Ok(locked) => locked,
            // Postgres locks the key: busy means a duplicate holds it. SQLite's
            // lock is the whole database's: another writer (another process)
            // holds it, whatever its key.
            Err(error) if DB::is_lock_busy(&error) => {
                return Err(if DB::SERIALIZE_WRITERS {
                    store_busy()
                } else {
                    in_progress_unknown()
                })
            }
            Err(error) => return self.store_down(op, &policy, error).await,
        };
        self.claim_locked(op, policy, locked, permit, asked, false)
            .await
    }

    /// The claim once the key's lock is held: decide from the record read
    /// under it, commit a durable claim's record, hand out the guard.
    /// `fresh_first`: the lock came with the fresh-first message.
    async fn claim_locked(
        &self,
        op: &Operation,
        policy: Policy,
        locked: Locked<DB>,
        permit: Option<Solo<DB>>,
        asked: Instant,
        fresh_first: bool,
    ) -> Result<Claim<DB>, IdemError> {
        let Locked {
            mut tx,
            record,
            holds_row,
        } = locked;
        // A key with no row at all gets a plain insert of its completed record.
        let replaces = record.is_some() || holds_row;
        let via = match decide(record, op) {
            Decision::Execute(via) => via,
            Decision::Replay(stored) => return Ok(Claim::Replay(Replay { stored })),
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
            tx: ClaimTx::Own(tx),
            op: op.clone(),
            policy,
            via,
            replaces,
            fresh_first,
            token,
            pool: self.pool.clone(),
            // A durable claim has committed its record and no longer holds the
            // write lock while the work runs; a transactional one holds both.
            permit: if token.is_none() { permit } else { None },
            claimed_at: Instant::now(),
            shard: self.shard.clone(),
            enqueues_seen: crate::outbox::wake::enqueues_so_far(),
            cache: self.replay_cache.clone().map(|cache| (cache, asked)),
        };
        Ok(Claim::Execute(guard))
    }

    /// The claim in its turn of the writer's batch, with the record read
    /// under the write lock. An answer from the record (a replay, a
    /// refusal) may come from a record an earlier turn of the batch wrote:
    /// it is given once the batch has committed.
    async fn claim_in_turn(
        &self,
        op: &Operation,
        policy: Policy,
        turn: Turn<DB>,
        record: Option<Record>,
    ) -> Result<Claim<DB>, IdemError> {
        let replaces = record.is_some();
        let answer = match decide(record, op) {
            Decision::Execute(via) => {
                return Ok(Claim::Execute(ClaimGuard {
                    tx: ClaimTx::Turn(turn),
                    op: op.clone(),
                    policy,
                    via,
                    replaces,
                    fresh_first: false,
                    token: None,
                    pool: self.pool.clone(),
                    permit: None,
                    claimed_at: Instant::now(),
                    shard: self.shard.clone(),
                    enqueues_seen: crate::outbox::wake::enqueues_so_far(),
                    cache: self
                        .replay_cache
                        .clone()
                        .map(|cache| (cache, Instant::now())),
                }))
            }
            Decision::Replay(stored) => Ok(Claim::Replay(Replay { stored })),
            Decision::Refuse(error) => Err(error),
        };
        match turn.end(true).await {
            Ok(()) => answer,
            Err(error) => Err(unavailable(&policy, error)),
        }
    }

    /// The claim in the writer's turn it was given, or the answer to the
    /// claim that got none.
    async fn claim_from_turn(
        &self,
        op: &Operation,
        policy: Policy,
        turn: Result<(Turn<DB>, Option<Record>), NoTurn>,
    ) -> Result<Claim<DB>, IdemError> {
        match turn {
            Ok((turn, record)) => self.claim_in_turn(op, policy, turn, record).await,
            Err(no_turn) => self.no_turn(op, &policy, no_turn).await,
        }
    }

    /// A claim that got no turn of the writer.
    async fn no_turn(
        &self,
        op: &Operation,
        policy: &Policy,
        no_turn: NoTurn,
    ) -> Result<Claim<DB>, IdemError> {
        match no_turn {
            NoTurn::InProgress => Err(in_progress_unknown()),
            NoTurn::Busy => Err(store_busy()),
            NoTurn::Store(error) => self.store_down(op, policy, error).await,
        }
    }

    async fn store_down(
        &self,
        op: &Operation,
        policy: &Policy,
        error: sqlx::Error,
    ) -> Result<Claim<DB>, IdemError> {
        // A conflict is the database answering, not the store being down:
        // never a reason to run without deduplication.
        if policy.failure_mode == FailureMode::Closed || crate::error::is_conflict(&error) {
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
                tx: ClaimTx::Own(tx),
                op: op.clone(),
                policy: *policy,
                via: Via::FailedOpen,
                replaces: true,
                fresh_first: false,
                token: None,
                pool: self.pool.clone(),
                permit: None,
                claimed_at: Instant::now(),
                shard: self.shard.clone(),
                enqueues_seen: crate::outbox::wake::enqueues_so_far(),
                cache: None,
            })),
            Err(error) => Err(unavailable(policy, error)),
        }
    }

    /// The steps that still have unexpired records in the store, sorted.
    pub async fn live_steps(&self) -> Result<Vec<String>, sqlx::Error> {
        DB::live_steps(&self.pool).await
    }
}

/// Where a claim's writes go.
enum ClaimTx<DB: Backend> {
    /// A transaction of its own.
    Own(Transaction<'static, DB>),
    /// A turn of the writer's batch (SQLite group commit).
    Turn(Turn<DB>),
}

/// An owned claim: the open transaction holding the key's lock. Derefs to
/// its connection (as [`sqlx::Transaction`] does): do the business writes
/// there, then [`ClaimGuard::commit`].
///
/// Dropping it without [`ClaimGuard::commit`] rolls the transaction back.
pub struct ClaimGuard<DB: Backend> {
    tx: ClaimTx<DB>,
    op: Operation,
    policy: Policy,
    via: Via,
    /// Whether the completed record replaces one the claim found (expired or taken over).
    replaces: bool,
    /// Whether the claim was locked by the fresh-first message.
    fresh_first: bool,
    token: Option<i64>,
    pool: Pool<DB>,
    /// This engine's writer, held alone until commit or rollback.
    permit: Option<Solo<DB>>,
    /// When the claim was granted: the work's duration is measured from here.
    claimed_at: Instant,
    /// The engine's `shard` label, on the finish's series.
    shard: ShardLabel,
    /// The process's enqueue count when the claim was granted: a commit after
    /// the work enqueued wakes the relays.
    enqueues_seen: u64,
    /// The engine's replay cache, and when the claim was asked for: the
    /// record's expiry in the store is no earlier than that plus the retention.
    cache: Option<(Arc<ReplayCache>, Instant)>,
}

impl<DB: Backend> std::ops::Deref for ClaimGuard<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match &self.tx {
            ClaimTx::Own(tx) => tx,
            ClaimTx::Turn(turn) => turn.conn_ref(),
        }
    }
}

impl<DB: Backend> std::ops::DerefMut for ClaimGuard<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        match &mut self.tx {
            ClaimTx::Own(tx) => tx,
            ClaimTx::Turn(turn) => turn.conn(),
        }
    }
}

impl<DB: Backend> ClaimGuard<DB> {
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

    /// Ends the claim with the work's value: stores it with the business
    /// writes and commits if [`Outcome::to_stored`] keeps it, rolls back
    /// otherwise; hands the value back.
    pub async fn commit<O: Outcome>(self, value: O) -> Result<Answer<O>, IdemError> {
        let via = self.via;
        self.settle(value.to_stored()).await?;
        Ok(Answer { value, via })
    }

    /// Stores the response and commits, or rolls back on `None`; records
    /// the work's duration and how the claim ended.
    async fn settle(self, response: Option<StoredResponse>) -> Result<(), IdemError> {
        let (step, worked, shard) = (self.op.step, self.claimed_at.elapsed(), self.shard.clone());
        let result = self.settle_unrecorded(response).await;
        metrics::finished(&shard, step, worked, &result);
        result
    }

    async fn settle_unrecorded(self, response: Option<StoredResponse>) -> Result<(), IdemError> {
        let Self {
            tx,
            op,
            policy,
            via,
            replaces,
            fresh_first,
            token,
            pool,
            permit: _permit,
            claimed_at: _,
            shard: _,
            enqueues_seen,
            cache,
        } = self;
        let response = match response {
            Some(response) => response,
            None => {
                match tx {
                    ClaimTx::Own(tx) => {
                        let _ = tx.rollback().await;
                    }
                    ClaimTx::Turn(turn) => {
                        let _ = turn.end(false).await;
                    }
                }
                if let Some(token) = token {
                    if let Err(error) = DB::release_claim(&pool, &op, token).await {
                        tracing::warn!(%error, "releasing a durable claim failed; it frees itself when its lock expires");
                    }
                }
                return Ok(());
            }
        };
        let committed = match (tx, via, token) {
            (ClaimTx::Turn(mut turn), _, _) => {
                match DB::write_completed(turn.conn(), &op, &response, &policy, replaces).await {
                    Ok(()) => turn.end(true).await.map(|()| true),
                    Err(error) => {
                        let _ = turn.end(false).await;
                        Err(error)
                    }
                }
            }
            (ClaimTx::Own(tx), Via::FailedOpen, _) => tx.commit().await.map(|()| true),
            (ClaimTx::Own(mut tx), _, Some(token)) => {
                let done = match DB::write_claimed(&mut tx, &op, token, &response, &policy).await {
                    Ok(true) => tx.commit().await.map(|()| true),
                    other => other,
                };
                // Nothing of the work committed (a conflict, a lost
                // connection): free the key now rather than at its lock's
                // expiry. Only this attempt's in-progress row can go.
                if done.is_err() {
                    let _ = DB::release_claim(&pool, &op, token).await;
                }
                done
            }
            (ClaimTx::Own(tx), _, None) => {
                match DB::commit_completed(tx, &op, &response, &policy, replaces, fresh_first).await
                {
                    Ok(()) => Ok(true),
                    // The record's insert met a record committed meanwhile
                    // by a duplicate whose commit this transaction's snapshot
                    // predates (REPEATABLE READ, SERIALIZABLE): the duplicate
                    // won; nothing of this attempt committed.
                    Err(error) if DB::is_duplicate_record(&error) => {
                        return Err(conflict(&policy, error))
                    }
                    Err(error) => Err(error),
                }
            }
        };
        match committed {
            Ok(true) => {
                crate::outbox::wake::wake_after_commit(enqueues_seen);
                if let Some((cache, asked)) = cache.filter(|_| via != Via::FailedOpen) {
                    if let Some(expires) = asked.checked_add(policy.retention) {
                        cache.put(&op, response, expires);
                    }
                }
                Ok(())
            }
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

/// A claim waited its bound for a database-wide write lock held for another key.
fn store_busy() -> IdemError {
    IdemError::StoreBusy {
        retry_after: Duration::from_secs(1),
    }
}

/// The claim's transaction lost to a concurrent one: a 503 with the
/// policy's `Retry-After`, as for a store that is unavailable.
fn conflict(policy: &Policy, source: sqlx::Error) -> IdemError {
    IdemError::Conflict {
        retry_after: whole_seconds(policy.unavailable_retry_after),
        source,
    }
}

/// A store error as the engine answers it: a conflict with a concurrent
/// transaction ([`crate::is_conflict`]) is [`IdemError::Conflict`], anything
/// else the store being unavailable. Both are a 503 with `Retry-After`.
pub(crate) fn unavailable(policy: &Policy, source: sqlx::Error) -> IdemError {
    if crate::error::is_conflict(&source) {
        return conflict(policy, source);
    }
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
