//! How [`IdempotentRetry`](crate::IdempotentRetry) retries: how often, for how
//! long, how long it waits, and what it does with a request that has no key.

use std::time::Duration;

/// What happens to a non-idempotent request (`POST`, `PATCH`, ...) that
/// carries no [`IdempotencyKey`](crate::IdempotencyKey).
///
/// Without a key a retry may run the operation twice, so such a request is
/// never retried. Requests whose method is idempotent by definition (`GET`,
/// `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) are retried with or without
/// a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Send it once, as a plain client would, and return what came back.
    #[default]
    SendOnce,
    /// Refuse it before sending, with [`ClientError::MissingKey`](crate::ClientError::MissingKey).
    Refuse,
}

/// The retry rules of one [`IdempotentRetry`](crate::IdempotentRetry).
///
/// A logical call ends at the first answer that is not worth retrying, after
/// [`max_attempts`](Self::max_attempts) attempts, or when the next wait would
/// cross the [`deadline`](Self::deadline), whichever comes first. An attempt
/// still running at the deadline is cut off.
///
/// ```
/// use std::time::Duration;
/// use idem_client::{MissingKey, RetryPolicy};
///
/// let policy = RetryPolicy::default()
///     .max_attempts(4)
///     .deadline(Duration::from_secs(10))
///     .backoff(Duration::from_millis(50), Duration::from_secs(2))
///     .retry_after_cap(Duration::from_secs(5))
///     .missing_key(MissingKey::Refuse);
/// assert_eq!(policy.attempts_allowed(), 4);
/// assert!(policy.backoff_delay(3) <= Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    deadline: Duration,
    attempt_timeout: Option<Duration>,
    base_delay: Duration,
    max_delay: Duration,
    retry_after_cap: Duration,
    missing_key: MissingKey,
    any_conflict_with_retry_after: bool,
}

impl Default for RetryPolicy {
    /// 5 attempts within 30 s; backoff from 100 ms up to 5 s; `Retry-After`
    /// honoured up to 30 s; keyless non-idempotent requests sent once; only
    /// idem's in-progress 409 retried.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            deadline: Duration::from_secs(30),
            attempt_timeout: None,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            retry_after_cap: Duration::from_secs(30),
            missing_key: MissingKey::SendOnce,
            any_conflict_with_retry_after: false,
        }
    }
}

impl RetryPolicy {
    /// At most `attempts` attempts per logical call, the first included
    /// (at least 1: `0` is taken as 1, i.e. no retries).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The whole logical call, waits included, ends within `deadline` of its start.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// A timeout for each attempt that has none of its own (reqwest's
    /// per-request timeout). An attempt that times out is retried.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Exponential backoff with full jitter: before retry `n` (1-based) the
    /// wait is uniform in `[0, min(max, base * 2^(n-1))]`. Used when the
    /// answer has no `Retry-After`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_delay = base;
        self.max_delay = max.max(base);
        self
    }

    /// The longest `Retry-After` honoured; a longer one is cut to this.
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// What to do with a non-idempotent request that has no key.
    pub fn missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// Also retry any 409 that carries `Retry-After`, not only idem's
    /// in-progress problem (for servers that signal "still running" their own way).
    pub fn retry_any_conflict_with_retry_after(mut self, yes: bool) -> Self {
        self.any_conflict_with_retry_after = yes;
        self
    }

    /// The attempt limit, the first attempt included.
    pub fn attempts_allowed(&self) -> u32 {
        self.max_attempts
    }

    /// The overall deadline of a logical call.
    pub fn call_deadline(&self) -> Duration {
        self.deadline
    }

    /// The per-attempt timeout, if set.
    pub fn per_attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The longest `Retry-After` honoured.
    pub fn retry_after_limit(&self) -> Duration {
        self.retry_after_cap
    }

    /// What happens to a keyless non-idempotent request.
    pub fn on_missing_key(&self) -> MissingKey {
        self.missing_key
    }

    /// Whether any 409 with `Retry-After` is retried.
    pub fn retries_any_conflict_with_retry_after(&self) -> bool {
        self.any_conflict_with_retry_after
    }

    /// A full-jitter backoff wait before retry `retry` (1 for the first retry).
    pub fn backoff_delay(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let ceiling = self
            .base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_under_its_doubling_ceiling() {
        let policy =
            RetryPolicy::default().backoff(Duration::from_millis(100), Duration::from_millis(700));
        for _ in 0..200 {
            assert!(policy.backoff_delay(1) <= Duration::from_millis(100));
            assert!(policy.backoff_delay(2) <= Duration::from_millis(200));
            assert!(policy.backoff_delay(3) <= Duration::from_millis(400));
            assert!(policy.backoff_delay(4) <= Duration::from_millis(700));
            assert!(policy.backoff_delay(40) <= Duration::from_millis(700));
        }
        // Full jitter spreads the waits: 200 draws are not all the same.
        let draws: std::collections::BTreeSet<_> =
            (0..200).map(|_| policy.backoff_delay(3)).collect();
        assert!(draws.len() > 100, "{} distinct waits", draws.len());
    }

    #[test]
    fn at_least_one_attempt() {
        assert_eq!(RetryPolicy::default().max_attempts(0).attempts_allowed(), 1);
    }
}
