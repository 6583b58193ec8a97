//! The stores: one small trait, implemented for SQLite and Postgres.
//!
//! The engine's logic lives in [`crate::engine`]; a backend only knows how to
//! take the key's lock, read the record and write it.

use std::future::Future;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use crate::operation::Operation;
use crate::outcome::StoredResponse;
use crate::policy::{KeyLock, Policy};

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The state of a stored key record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStatus {
    /// Claimed by an attempt that has not completed (durable claims only).
    InProgress,
    /// Completed; the response is stored.
    Completed,
}

impl RecordStatus {
    pub(crate) fn parse(text: &str) -> Self {
        if text == "completed" {
            Self::Completed
        } else {
            Self::InProgress
        }
    }
}

/// A key record as read by a claim.
#[derive(Debug, Clone)]
pub struct Record {
    /// In progress or completed.
    pub status: RecordStatus,
    /// The fingerprint of the request that created it.
    pub fingerprint: Vec<u8>,
    /// The stored response, for completed records.
    pub response: Option<StoredResponse>,
    /// Whether `expires_at` has passed.
    pub expired: bool,
    /// Time left on the lock; `None` once `locked_until` has passed.
    pub lock_left: Option<Duration>,
}

/// What a claim's first statements leave: its open transaction holding the
/// key's lock, and the record found under that lock.
#[derive(Debug)]
pub struct Locked<DB: sqlx::Database> {
    /// The claim's transaction.
    pub tx: Transaction<'static, DB>,
    /// The record the key had, if any.
    pub record: Option<Record>,
    /// Whether the claim wrote a row of its own for the key (a row lock), which
    /// the completed record then replaces.
    pub holds_row: bool,
}

/// A database idem can keep key records in. Implemented for [`sqlx::Sqlite`]
/// and [`sqlx::Postgres`]; the methods are the engine's, not an application's.
pub trait Backend: sqlx::Database + Sized {
    /// Whether the write lock is database-wide, so an engine queues its own
    /// claims in process before asking for it (SQLite).
    #[doc(hidden)]
    const SERIALIZE_WRITERS: bool = false;

    /// The embedded migrations.
    #[doc(hidden)]
    fn migrator() -> &'static sqlx::migrate::Migrator;

    /// Opens the claim's transaction on `conn`, takes the key's lock of kind
    /// `key_lock` (waiting at most `policy.wait_timeout`) and reads the record
    /// under it.
    #[doc(hidden)]
    fn lock_and_read<'a>(
        conn: PoolConnection<Self>,
        op: &'a Operation,
        policy: &'a Policy,
        key_lock: KeyLock,
    ) -> impl Future<Output = Result<Locked<Self>, sqlx::Error>> + Send + 'a;

    /// Reads the record outside any transaction: every claim starts with this
    /// read, so replays and conflicts never take a lock or open a transaction.
    #[doc(hidden)]
    fn lookup_unlocked<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a;

    /// Writes the completed record: a plain insert when the claim found no
    /// record, an upsert when it replaces an expired or taken-over one.
    #[doc(hidden)]
    fn write_completed<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        response: &'a StoredResponse,
        policy: &'a Policy,
        replace: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Writes an `in_progress` record owned by `token` (durable claims).
    #[doc(hidden)]
    fn write_in_progress<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        token: i64,
        policy: &'a Policy,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Completes the `in_progress` record owned by `token`; `false` if another
    /// attempt took it over.
    #[doc(hidden)]
    fn complete_claim<'a>(
        conn: &'a mut Self::Connection,
        op: &'a Operation,
        token: i64,
        response: &'a StoredResponse,
        policy: &'a Policy,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Deletes the `in_progress` record owned by `token`, so a retry runs at once.
    #[doc(hidden)]
    fn release_claim<'a>(
        pool: &'a Pool<Self>,
        op: &'a Operation,
        token: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Deletes up to `batch` expired records, oldest first, by primary key,
    /// starting at `from`: `0` for a purge's first batch, then what the
    /// previous batch returned (a backend-specific position in `expires_at`).
    /// Returns how many went and where the next batch starts.
    #[doc(hidden)]
    fn purge_batch(
        pool: &Pool<Self>,
        batch: u32,
        from: i64,
    ) -> impl Future<Output = Result<(u64, i64), sqlx::Error>> + Send + '_;

    /// The distinct steps that still have unexpired records.
    #[doc(hidden)]
    fn live_steps(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + '_;

    /// Whether `error` means "the key's lock is held by another attempt".
    #[doc(hidden)]
    fn is_lock_busy(error: &sqlx::Error) -> bool;
}

pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn response_from_columns(
    status: Option<i64>,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
) -> Option<StoredResponse> {
    Some(StoredResponse {
        status: u16::try_from(status?).ok()?,
        content_type: content_type.unwrap_or_default(),
        body: body.unwrap_or_default(),
    })
}
