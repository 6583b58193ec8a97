//! The errors the engine answers with instead of running the work.

use std::time::Duration;

use crate::outcome::ReplayError;

/// Why an operation did not run (or could not be answered).
///
/// Each variant maps to one row of the protocol: `Mismatch` is a 422,
/// `InProgress` a 409 with `Retry-After`, `Unavailable`, `StoreBusy` and
/// `Conflict` a 503 with `Retry-After`.
#[derive(Debug, thiserror::Error)]
pub enum IdemError {
    /// The key was used before with a different request; nothing ran.
    #[error("this idempotency key was already used with a different request; send a new key for a new operation")]
    Mismatch,
    /// Another attempt with this key is running; nothing ran.
    #[error("a request with this idempotency key is still in progress; retry in {}s", retry_after.as_secs())]
    InProgress {
        /// How long until the running attempt's lock expires (at least one second).
        retry_after: Duration,
    },
    /// The store's write lock is held for other keys' writes (SQLite has one
    /// writer at a time) and did not come free within the wait bound; nothing
    /// ran. Says nothing about this request's key.
    #[error("the idempotency store is busy with other writes; retry in {}s", retry_after.as_secs())]
    StoreBusy {
        /// When to retry.
        retry_after: Duration,
    },
    /// The store could not be reached and the policy fails closed; nothing ran.
    #[error("the idempotency store is unavailable; retry in {}s", retry_after.as_secs())]
    Unavailable {
        /// When to retry.
        retry_after: Duration,
        /// The store's error.
        #[source]
        source: sqlx::Error,
    },
    /// The claim's transaction lost to a concurrent one: the database raised
    /// a serialization failure (SQLSTATE `40001`, from `SERIALIZABLE` or
    /// `REPEATABLE READ`) or a deadlock (`40P01`) in the claim, the work or
    /// the `COMMIT`. Nothing was committed and the key is free: a retry of
    /// the same request runs it again or replays the attempt that won.
    #[error("the operation conflicted with a concurrent transaction and was rolled back; retry in {}s", retry_after.as_secs())]
    Conflict {
        /// When to retry.
        retry_after: Duration,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// The work did not finish within the policy's work timeout; it was rolled back.
    #[error("the operation did not finish within {}ms and was rolled back; retry with the same key", limit.as_millis())]
    TimedOut {
        /// The work timeout.
        limit: Duration,
    },
    /// A durable claim's lock expired while the work ran and another attempt took
    /// it over; this attempt's writes were rolled back.
    #[error("the claim's lock expired while the operation ran and another attempt took it over; this attempt was rolled back")]
    LockLost,
    /// A stored response could not be decoded into the operation's return type
    /// (the type changed incompatibly within the retention window).
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

impl IdemError {
    /// The HTTP status this error answers with.
    ///
    /// ```
    /// use idem_runtime::IdemError;
    /// assert_eq!(IdemError::Mismatch.http_status(), 422);
    /// ```
    pub fn http_status(&self) -> u16 {
        match self {
            IdemError::Mismatch => 422,
            IdemError::InProgress { .. } | IdemError::LockLost => 409,
            IdemError::Unavailable { .. }
            | IdemError::StoreBusy { .. }
            | IdemError::Conflict { .. } => 503,
            IdemError::TimedOut { .. } => 504,
            IdemError::Replay(_) => 500,
        }
    }

    /// Seconds for a `Retry-After` header, where the error has one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            IdemError::InProgress { retry_after }
            | IdemError::StoreBusy { retry_after }
            | IdemError::Unavailable { retry_after, .. }
            | IdemError::Conflict { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Rounds up to whole seconds, at least one: what `Retry-After` can carry.
pub(crate) fn whole_seconds(duration: Duration) -> Duration {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// Whether `error` is the database refusing a transaction because it
/// conflicted with a concurrent one, after which the whole transaction can
/// be run again: a serialization failure (SQLSTATE `40001`) or a deadlock
/// (`40P01`). Nothing of the transaction was committed.
///
/// ```
/// assert!(!idem_runtime::is_conflict(&sqlx::Error::PoolTimedOut));
/// ```
pub fn is_conflict(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("40001") | Some("40P01")))
}
