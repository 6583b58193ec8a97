//! How long claims wait, lock and live, and what happens when the store is down.

use std::time::Duration;

/// Whether a claim lives inside the business transaction or outlives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// One transaction: the key record is written once, completed, just before
    /// the commit that also carries the business writes. Concurrent duplicates
    /// wait on a lock for the key. The default, and the fastest.
    #[default]
    Transactional,
    /// Two transactions: an `in_progress` row with `locked_until` commits first,
    /// then the work and the completion commit together. Use it when the work
    /// must not hold a database transaction for its whole length (a long call to
    /// another system); a crash leaves the row to be taken over once the lock expires.
    Durable,
}

/// What happens when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Refuse the operation with [`crate::IdemError::Unavailable`]; the work never runs.
    #[default]
    Closed,
    /// Run the work without deduplication, logging a warning and counting it.
    Open,
}

/// The knobs of one step (or of the whole engine, as its default).
///
/// ```
/// use idem_runtime::Policy;
/// use std::time::Duration;
///
/// let policy = Policy::default()
///     .with_retention(Duration::from_secs(7 * 24 * 3600))
///     .with_wait_timeout(Duration::from_millis(500));
/// assert_eq!(policy.lock_ttl, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long a record lives before it is treated as absent and purged. Default 24 h.
    pub retention: Duration,
    /// How long a durable claim's lock lasts before another attempt may take it over.
    /// Set it above the work's p99 latency. Default 30 s.
    pub lock_ttl: Duration,
    /// How long a duplicate waits for the winner's uncommitted claim before it
    /// gets the in-progress error. Default 5 s.
    pub wait_timeout: Duration,
    /// A bound on the work itself; past it the transaction rolls back. Default none.
    pub work_timeout: Option<Duration>,
    /// What to do when the store is down. Default [`FailureMode::Closed`].
    pub failure_mode: FailureMode,
    /// Where the claim lives. Default [`ClaimMode::Transactional`].
    pub claim_mode: ClaimMode,
    /// The `Retry-After` a client is told when the store is unavailable. Default 1 s.
    pub unavailable_retry_after: Duration,
    /// On SQLite, whether concurrent claims share one `COMMIT`, and the
    /// batch's bounds; `None` runs each claim in a transaction of its own.
    /// Default [`GroupCommit::DEFAULT`]. Ignored elsewhere and by durable
    /// claims, which always commit alone.
    pub group_commit: Option<GroupCommit>,
    /// How many times [`crate::Engine::run_repeatable`] runs a claim and its
    /// work again after its transaction lost to a concurrent one (a
    /// serialization failure or a deadlock); past it, a 503 with
    /// `Retry-After`. Ignored by [`crate::Engine::run`], the macros' handlers
    /// and durable claims, whose work is not re-run in process. Default 3.
    pub conflict_retries: u32,
}

/// The bounds of a SQLite group commit: a batch commits when no claim waits
/// for the writer, or when it holds `max_claims` kept claims or has been
/// open `max_open`, whichever comes first.
///
/// ```
/// use idem_runtime::{GroupCommit, Policy};
/// use std::time::Duration;
///
/// let policy = Policy::default().with_group_commit(Some(GroupCommit {
///     max_claims: 16,
///     max_open: Duration::from_millis(5),
/// }));
/// assert_eq!(policy.group_commit.unwrap().max_claims, 16);
/// assert_eq!(Policy::default().with_group_commit(None).group_commit, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    /// The most claims one `COMMIT` answers. Default 64.
    pub max_claims: u32,
    /// The longest a batch stays open to new claims. Default 20 ms.
    pub max_open: Duration,
}

impl GroupCommit {
    /// 64 claims, 20 ms.
    pub const DEFAULT: Self = Self {
        max_claims: 64,
        max_open: Duration::from_millis(20),
    };
}

impl Default for GroupCommit {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(24 * 3600),
            lock_ttl: Duration::from_secs(30),
            wait_timeout: Duration::from_secs(5),
            work_timeout: None,
            failure_mode: FailureMode::Closed,
            claim_mode: ClaimMode::Transactional,
            unavailable_retry_after: Duration::from_secs(1),
            group_commit: Some(GroupCommit::DEFAULT),
            conflict_retries: 3,
        }
    }
}

impl Policy {
    /// Sets [`Policy::group_commit`].
    pub fn with_group_commit(mut self, group_commit: Option<GroupCommit>) -> Self {
        self.group_commit = group_commit;
        self
    }

    /// Sets [`Policy::conflict_retries`].
    ///
    /// ```
    /// let policy = idem_runtime::Policy::default().with_conflict_retries(0);
    /// assert_eq!(policy.conflict_retries, 0);
    /// ```
    pub fn with_conflict_retries(mut self, reruns: u32) -> Self {
        self.conflict_retries = reruns;
        self
    }

    /// Sets [`Policy::retention`].
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// Sets [`Policy::lock_ttl`].
    pub fn with_lock_ttl(mut self, lock_ttl: Duration) -> Self {
        self.lock_ttl = lock_ttl;
        self
    }
    /// Sets [`Policy::wait_timeout`].
    pub fn with_wait_timeout(mut self, wait_timeout: Duration) -> Self {
        self.wait_timeout = wait_timeout;
        self
    }
    /// Sets [`Policy::work_timeout`].
    pub fn with_work_timeout(mut self, work_timeout: Duration) -> Self {
        self.work_timeout = Some(work_timeout);
        self
    }
    /// Sets [`Policy::failure_mode`].
    pub fn with_failure_mode(mut self, failure_mode: FailureMode) -> Self {
        self.failure_mode = failure_mode;
        self
    }
    /// Sets [`Policy::claim_mode`].
    pub fn with_claim_mode(mut self, claim_mode: ClaimMode) -> Self {
        self.claim_mode = claim_mode;
        self
    }
    /// Sets [`Policy::unavailable_retry_after`], the `Retry-After` of a 503
    /// answered while the store is down (rounded up to whole seconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = idem_runtime::Policy::default().with_unavailable_retry_after(Duration::from_secs(5));
    /// assert_eq!(policy.unavailable_retry_after, Duration::from_secs(5));
    /// ```
    pub fn with_unavailable_retry_after(mut self, retry_after: Duration) -> Self {
        self.unavailable_retry_after = retry_after;
        self
    }
}
