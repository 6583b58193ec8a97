//! Group commit, for a backend whose write lock is the whole database's
//! (SQLite): the claims of one engine share one writer transaction and one
//! `COMMIT`, and so one fsync, instead of paying one each.
//!
//! A claim waits its turn for the writer (first come, first served). Its
//! turn runs under a `SAVEPOINT` of the writer's open transaction: the
//! record's read under the lock, the work's writes and the completed record.
//! `RELEASE` keeps them, `ROLLBACK TO` undoes them (an error, a status that
//! is not stored, a panic or a dropped future: the turn's drop marks the
//! savepoint for rollback before the writer's next statement). The turn that
//! opens a batch needs no savepoint: the transaction holds its writes alone,
//! and undoing them is its `ROLLBACK`, so a claim alone sends the statements
//! of a transaction of its own. The writer
//! commits when no claim is waiting, or when the batch reaches
//! [`GroupCommit`]'s bounds; only then does any claim of the batch get its
//! answer, so nothing is answered that is not durable. A failed `COMMIT`
//! answers every claim of the batch as a store error: none of them
//! committed.
//!
//! What a turn sees: the writes of the earlier turns of its batch, as if
//! they had committed before it (a duplicate of a key completed earlier in
//! the batch finds the record and replays it, once the batch commits); never
//! a write that was rolled back. A turn that awaits slow I/O holds the
//! batch, as it would hold the write lock in a transaction of its own.
//!
//! A claim that opts out (`Policy::group_commit = None`), or a durable
//! claim, takes the writer alone: the open batch is committed first, and the
//! claim runs in a transaction of its own while it holds the writer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Pool, Transaction};
use tokio::sync::{oneshot, Mutex, OwnedMutexGuard};

use crate::faults::{abort_at, FaultPoint};
use crate::operation::Operation;
use crate::policy::{GroupCommit, Policy};
use crate::store::{Backend, Record};

/// The savepoint each turn runs under.
const SAVEPOINT: &str = "SAVEPOINT idem_turn";
const RELEASE: &str = "RELEASE idem_turn";
const ROLLBACK: &str = "ROLLBACK TO idem_turn";

/// An engine's writer: its queue, and the batch it has open.
pub(crate) struct Batcher<DB: Backend> {
    writer: Arc<Mutex<Writer<DB>>>,
    shared: Arc<Shared>,
}

/// What the writer's holder and the queue share.
struct Shared {
    /// Claims waiting for the writer.
    queued: AtomicUsize,
    /// The key of the claim holding the writer: a claim that times out in
    /// the queue is "in progress" when it is its own key, "store busy" otherwise.
    holder: std::sync::Mutex<Option<(String, String)>>,
    /// Where a test wants the process to die.
    fault: Option<FaultPoint>,
}

struct Writer<DB: Backend> {
    batch: Option<Batch<DB>>,
    /// A turn ended without ending its savepoint (dropped): roll it back
    /// before the writer's next statement.
    rollback_pending: bool,
}

/// The open batch: the writer's transaction and the claims waiting for its
/// `COMMIT`.
struct Batch<DB: Backend> {
    tx: Transaction<'static, DB>,
    /// Whether the turn holding the writer is under a savepoint. The turn
    /// that opens a batch is not: its transaction holds its writes alone,
    /// so rolling them back is rolling the transaction back.
    savepoint: bool,
    opened: Instant,
    kept: u32,
    waiting: Vec<oneshot::Sender<Result<(), Arc<str>>>>,
}

/// Why a claim got no turn.
pub(crate) enum NoTurn {
    /// It waited its bound while a claim for its own key held the writer.
    InProgress,
    /// It waited its bound behind other keys, or another process holds
    /// the database's write lock.
    Busy,
    /// The store failed.
    Store(sqlx::Error),
}

impl<DB: Backend> Batcher<DB> {
    pub(crate) fn new(fault: Option<FaultPoint>) -> Self {
        Self {
            writer: Arc::new(Mutex::new(Writer {
                batch: None,
                rollback_pending: false,
            })),
            shared: Arc::new(Shared {
                queued: AtomicUsize::new(0),
                holder: std::sync::Mutex::new(None),
                fault,
            }),
        }
    }

    /// The writer, for `op`, within `wait`.
    async fn enter(&self, op: &Operation, wait: Duration) -> Result<Held<DB>, NoTurn> {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        let entered = tokio::time::timeout(wait, self.writer.clone().lock_owned()).await;
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        let key = key_of(op);
        match entered {
            Ok(writer) => Ok(self.hold(writer, key)),
            Err(_elapsed) if lock(&self.shared.holder).as_ref() == Some(&key) => {
                Err(NoTurn::InProgress)
            }
            Err(_elapsed) => Err(NoTurn::Busy),
        }
    }

    /// The writer, held for the claim of `key`.
    fn hold(&self, writer: OwnedMutexGuard<Writer<DB>>, key: (String, String)) -> Held<DB> {
        *lock(&self.shared.holder) = Some(key);
        Held {
            writer: Some(writer),
            shared: self.shared.clone(),
        }
    }

    /// A turn for `op` in the open batch (opening one if none is), with the
    /// key's record read under the write lock.
    pub(crate) async fn turn(
        &self,
        pool: &Pool<DB>,
        op: &Operation,
        policy: &Policy,
        settings: DB::Settings,
    ) -> Result<(Turn<DB>, Option<Record>), NoTurn> {
        let held = self.enter(op, policy.wait_timeout).await?;
        Self::turn_held(held, pool, op, policy, settings).await
    }

    /// [`Batcher::turn`] at once, if the writer is idle: no batch open, no
    /// claim of this engine waiting for it or holding it. The read under
    /// the write lock then answers a repeat as well as the read before it
    /// would, so the claim skips that read: one round trip, the one a claim
    /// alone would pay beyond the guide's SQL. `None` when the writer is in
    /// use, so the caller reads first and a repeat does not wait behind the
    /// engine's own claims; and when another process held the database's
    /// write lock for the whole wait, so a repeat is still answered from
    /// the read rather than refused as busy.
    pub(crate) async fn turn_if_idle(
        &self,
        pool: &Pool<DB>,
        op: &Operation,
        policy: &Policy,
        settings: DB::Settings,
    ) -> Option<Result<(Turn<DB>, Option<Record>), NoTurn>> {
        if self.shared.queued.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let writer = self.writer.clone().try_lock_owned().ok()?;
        if writer.batch.is_some() {
            return None;
        }
        let held = self.hold(writer, key_of(op));
        match Self::turn_held(held, pool, op, policy, settings).await {
            Err(NoTurn::Busy) => None,
            turn => Some(turn),
        }
    }

    /// A turn for `op` on the writer it holds.
    async fn turn_held(
        mut held: Held<DB>,
        pool: &Pool<DB>,
        op: &Operation,
        policy: &Policy,
        settings: DB::Settings,
    ) -> Result<(Turn<DB>, Option<Record>), NoTurn> {
        let writer = held.writer();
        writer.roll_back_pending().await;
        let record = match &mut writer.batch {
            Some(batch) => {
                batch.savepoint = true;
                match DB::savepoint_and_lookup(&mut batch.tx, op, SAVEPOINT).await {
                    Ok(record) => record,
                    Err(error) => {
                        writer.abandon(&error);
                        return Err(NoTurn::Store(error));
                    }
                }
            }
            None => {
                let conn = pool.acquire().await.map_err(NoTurn::Store)?;
                let locked = match DB::lock_and_read(conn, op, policy, settings).await {
                    Ok(locked) => locked,
                    Err(error) if DB::is_lock_busy(&error) => return Err(NoTurn::Busy),
                    Err(error) => return Err(NoTurn::Store(error)),
                };
                writer.batch = Some(Batch {
                    tx: locked.tx,
                    savepoint: false,
                    opened: Instant::now(),
                    kept: 0,
                    waiting: Vec::new(),
                });
                locked.record
            }
        };
        Ok((
            Turn {
                held,
                limits: policy.group_commit.unwrap_or_default(),
            },
            record,
        ))
    }

    /// The writer alone, for a claim in a transaction of its own: the open
    /// batch commits first. Held until the claim ends.
    pub(crate) async fn alone(&self, op: &Operation, wait: Duration) -> Result<Solo<DB>, NoTurn> {
        let mut held = self.enter(op, wait).await?;
        let writer = held.writer();
        writer.roll_back_pending().await;
        writer.commit(&self.shared).await;
        Ok(Solo(held))
    }
}

/// The writer, held: leaving clears the holder's key.
struct Held<DB: Backend> {
    writer: Option<OwnedMutexGuard<Writer<DB>>>,
    shared: Arc<Shared>,
}

impl<DB: Backend> Held<DB> {
    fn writer(&mut self) -> &mut Writer<DB> {
        self.writer.as_mut().expect("held until dropped")
    }
}

impl<DB: Backend> Held<DB> {
    /// Gives the writer up: the holder's key is cleared first, so it is
    /// never the next holder's that is cleared.
    fn release(&mut self) {
        if let Some(writer) = self.writer.take() {
            *lock(&self.shared.holder) = None;
            drop(writer);
        }
    }
}

impl<DB: Backend> Drop for Held<DB> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The writer held by a claim running alone, until the claim ends.
pub(crate) struct Solo<DB: Backend>(#[allow(dead_code)] Held<DB>);

/// A claim's turn in the batch: the writer's connection, inside the
/// turn's savepoint.
pub(crate) struct Turn<DB: Backend> {
    held: Held<DB>,
    limits: GroupCommit,
}

impl<DB: Backend> Turn<DB> {
    /// The writer's connection.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self
            .held
            .writer()
            .batch
            .as_mut()
            .expect("a turn has its batch")
            .tx
    }

    /// The writer's connection, to read.
    pub(crate) fn conn_ref(&self) -> &DB::Connection {
        &self
            .held
            .writer
            .as_ref()
            .and_then(|writer| writer.batch.as_ref())
            .expect("a turn has its batch")
            .tx
    }

    /// Ends the turn: keeps its writes (`keep`) or rolls them back, leaves
    /// the writer to the next claim, commits the batch if no claim is
    /// waiting or it is full. A kept turn returns once the batch committed.
    pub(crate) async fn end(mut self, keep: bool) -> Result<(), sqlx::Error> {
        let shared = self.held.shared.clone();
        let limits = self.limits;
        let writer = self.held.writer();
        if let Err(error) = writer.end_turn(keep).await {
            writer.abandon(&error);
            return Err(error);
        }
        let Some(batch) = writer.batch.as_mut() else {
            // The batch's opening turn rolled back, and the batch with it.
            self.held.release();
            return Ok(());
        };
        let committed = keep.then(|| {
            let (sender, receiver) = oneshot::channel();
            batch.waiting.push(sender);
            batch.kept += 1;
            receiver
        });
        let full = batch.kept >= limits.max_claims || batch.opened.elapsed() >= limits.max_open;
        if full || shared.queued.load(Ordering::SeqCst) == 0 {
            writer.commit(&shared).await;
        }
        let mutex = OwnedMutexGuard::mutex(self.held.writer.as_ref().expect("held")).clone();
        // The next claim's turn; this turn's drop has nothing left to do.
        self.held.release();
        let Some(mut committed) = committed else {
            return Ok(());
        };
        loop {
            tokio::select! {
                answer = &mut committed => return match answer {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(failure)) => Err(batch_failed(&failure)),
                    Err(_) => Err(batch_failed("the batch was abandoned before its commit")),
                },
                // No turn has committed the batch in its time (the claim that
                // was waiting gave up before its turn): commit it, unless a
                // turn holds the writer, which then will.
                () = tokio::time::sleep(limits.max_open) => {
                    if let Ok(mut writer) = mutex.clone().try_lock_owned() {
                        writer.roll_back_pending().await;
                        writer.commit(&shared).await;
                    }
                }
            }
        }
    }
}

impl<DB: Backend> Drop for Turn<DB> {
    fn drop(&mut self) {
        // Ended turns have given their writer up; this one was dropped
        // mid-turn (a panic, a cancelled future).
        let Some(mut writer) = self.held.writer.take() else {
            return;
        };
        writer.rollback_pending = true;
        // Cleared before the writer goes, as `Held::release` does.
        *lock(&self.held.shared.holder) = None;
        if self.held.shared.queued.load(Ordering::SeqCst) > 0 {
            return; // the next turn rolls it back and carries the batch on
        }
        let shared = self.held.shared.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                writer.roll_back_pending().await;
                writer.commit(&shared).await;
            });
        }
    }
}

impl<DB: Backend> Writer<DB> {
    async fn roll_back_pending(&mut self) {
        if !std::mem::take(&mut self.rollback_pending) {
            return;
        }
        if let Err(error) = self.end_turn(false).await {
            self.abandon(&error);
        }
    }

    /// Ends the current turn: keeps its writes or rolls them back, to its
    /// savepoint, or with the whole transaction when the turn opened the
    /// batch (nothing else is in it).
    async fn end_turn(&mut self, keep: bool) -> Result<(), sqlx::Error> {
        let Some(batch) = &mut self.batch else {
            return Ok(());
        };
        match (batch.savepoint, keep) {
            (true, false) => {
                DB::run_raw(&mut batch.tx, ROLLBACK).await?;
                DB::run_raw(&mut batch.tx, RELEASE).await
            }
            (true, true) => DB::run_raw(&mut batch.tx, RELEASE).await,
            (false, true) => Ok(()),
            (false, false) => {
                let batch = self.batch.take().expect("matched above");
                batch.tx.rollback().await
            }
        }
    }

    /// Commits the open batch, if any, and answers its claims.
    async fn commit(&mut self, shared: &Shared) {
        let Some(batch) = self.batch.take() else {
            return;
        };
        abort_at(shared.fault, FaultPoint::BatchBeforeCommit);
        let result = batch.tx.commit().await;
        if result.is_ok() {
            abort_at(shared.fault, FaultPoint::BatchAfterCommit);
        }
        crate::metrics::batch_committed(batch.waiting.len());
        let answer = result.map_err(|error| {
            tracing::error!(%error, claims = batch.waiting.len(), "a batch's COMMIT failed; none of its claims committed");
            Arc::<str>::from(error.to_string())
        });
        for waiting in batch.waiting {
            let _ = waiting.send(answer.clone());
        }
    }

    /// Drops the open batch after a failed statement: its transaction rolls
    /// back, and its claims are told.
    fn abandon(&mut self, error: &sqlx::Error) {
        if let Some(batch) = self.batch.take() {
            let failure = Arc::<str>::from(format!("the batch was rolled back: {error}"));
            for waiting in batch.waiting {
                let _ = waiting.send(Err(failure.clone()));
            }
        }
    }
}

fn batch_failed(why: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!(
        "the group commit did not commit: {why}"
    )))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn key_of(op: &Operation) -> (String, String) {
    (op.scope.as_stored().to_owned(), op.key.as_str().to_owned())
}
