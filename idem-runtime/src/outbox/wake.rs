//! Waking relays: in this process after an enqueue commits, in others
//! through Postgres `NOTIFY` when asked.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Wakes relays in this process after an enqueue.
pub(crate) static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// Counts enqueues in this process, so a relay can tell it missed a wake-up.
pub(crate) static ENQUEUES: AtomicU64 = AtomicU64::new(0);

pub(crate) fn wake_relays() {
    ENQUEUES.fetch_add(1, Ordering::Release);
    WAKE.notify_waiters();
}

/// The enqueues made in this process so far: a claim notes it when it is
/// granted and hands it to [`wake_after_commit`] once it has committed.
pub(crate) fn enqueues_so_far() -> u64 {
    ENQUEUES.load(Ordering::Acquire)
}

/// After a commit: if any enqueue happened in this process since `seen`
/// (the claim's own, possibly), wakes the relays, which find the message at
/// once now that it is committed instead of at their next look.
pub(crate) fn wake_after_commit(seen: u64) {
    if ENQUEUES.load(Ordering::Acquire) != seen {
        WAKE.notify_waiters();
    }
}

static NOTIFY_POSTGRES: AtomicBool = AtomicBool::new(false);
static LAST_NOTIFY_MS: AtomicU64 = AtomicU64::new(0);
/// Enqueues from one process send at most one notification per this period.
const NOTIFY_EVERY_MS: u64 = 100;

/// Makes [`enqueue`](super::enqueue) on Postgres also send `NOTIFY idem_outbox` in the
/// enqueuing transaction, so relays in other processes started with
/// [`Relay::listen`](super::Relay::listen) wake as soon as it commits (Postgres delivers a
/// notification at commit, and drops it on rollback). Coalesced: at most one
/// notification per 100 ms from this process; a relay woken by one looks
/// again over the next half second, and polls as ever after that. Off by
/// default, since every notifying commit briefly takes Postgres' global
/// notification lock. No effect on SQLite, whose relays poll.
pub fn notify_other_processes(on: bool) {
    NOTIFY_POSTGRES.store(on, Ordering::Relaxed);
}

/// Whether this enqueue should notify: enabled, and the period since the
/// last notification has passed.
pub(crate) fn should_notify() -> bool {
    if !NOTIFY_POSTGRES.load(Ordering::Relaxed) {
        return false;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0);
    let last = LAST_NOTIFY_MS.load(Ordering::Relaxed);
    now.saturating_sub(last) >= NOTIFY_EVERY_MS
        && LAST_NOTIFY_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
