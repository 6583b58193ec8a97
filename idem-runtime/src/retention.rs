//! Retention: deleting expired key records, once or on a schedule.
//!
//! Records live for the policy's retention (`expires_at`); an expired record
//! is already treated as absent by every claim, so purging only reclaims
//! space. The table holds about *keyed requests per second × retention* rows
//! (a day of 50 requests/s is 4.3 M rows); [OPERATIONS.md](https://github.com/idem-rs/idem/blob/main/docs/OPERATIONS.md) has the
//! measured bytes per row on each backend.
//!
//! [`Engine::purge_expired`] deletes in short batches, oldest first, pausing
//! between full batches so claims keep most of the database's time.
//! [`Engine::spawn_purger`] runs it on a schedule: the first run after a random
//! part of the period and each later one after the period ± 10 %, so replicas
//! started together do not purge in lockstep. [`Purger::shutdown`] stops it
//! between two batches and waits for that, so a deploy never cuts a delete
//! halfway (a cut one is harmless anyway: each batch is one statement).
//! Each run is recorded in [`crate::metrics::PURGE_ROWS`] and
//! [`crate::metrics::PURGE_DURATION`].

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::Engine;
use crate::metrics;
use crate::store::Backend;

/// How much longer than a full purge batch took the purge pauses before the next.
const PAUSE_FACTOR: u32 = 3;

/// The spread of the scheduled period: each wait is the period ± this fraction.
const JITTER: f64 = 0.1;

impl<DB: Backend> Engine<DB> {
    /// Deletes expired records in batches of `batch` (by primary key, oldest
    /// first, each batch starting where the last one stopped) until none are
    /// left; returns how many went. Short batches keep claims unblocked,
    /// and a pause of three times as long as each full batch took leaves the
    /// database at least three quarters of its time for claims while a large
    /// backlog drains.
    ///
    /// ```no_run
    /// # async fn demo(engine: idem_runtime::Engine<sqlx::Sqlite>) -> Result<(), sqlx::Error> {
    /// let deleted = engine.purge_expired(1000).await?;
    /// println!("{deleted} expired records deleted");
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, sqlx::Error> {
        let (_never, stop) = watch::channel(false);
        self.purge_until(batch, stop).await
    }

    async fn purge_until(
        &self,
        batch: u32,
        mut stop: watch::Receiver<bool>,
    ) -> Result<u64, sqlx::Error> {
        let started = Instant::now();
        let result = async {
            let batch = batch.max(1);
            let mut total = 0;
            let mut from = 0;
            loop {
                let took = Instant::now();
                let (deleted, next) = DB::purge_batch(self.pool(), batch, from).await?;
                total += deleted;
                if deleted < u64::from(batch) || *stop.borrow() {
                    return Ok(total);
                }
                from = next;
                tokio::select! {
                    () = tokio::time::sleep(took.elapsed() * PAUSE_FACTOR) => {}
                    _ = stop.changed() => return Ok(total),
                }
            }
        }
        .await;
        metrics::purged(self.shard_label(), &result, started.elapsed());
        result
    }

    /// Spawns a task that purges expired records about every `every`, in
    /// batches of `batch`: first after a random part of `every`, then after
    /// `every` ± 10 %, so replicas do not purge in lockstep. Keep the handle
    /// and call [`Purger::shutdown`] when the service stops (dropping it stops
    /// the purger too).
    ///
    /// ```no_run
    /// # async fn demo(engine: idem_runtime::Engine<sqlx::Postgres>) {
    /// use std::time::Duration;
    /// let purger = engine.spawn_purger(Duration::from_secs(300), 1000);
    /// // ... serve ...
    /// purger.shutdown().await;
    /// # }
    /// ```
    pub fn spawn_purger(&self, every: Duration, batch: u32) -> Purger {
        let engine = self.clone();
        let (stop_tx, mut stop) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut wait = every.mul_f64(unit_random());
            loop {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => return,
                }
                match engine.purge_until(batch, stop.clone()).await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::debug!(deleted, "purged expired idempotency records"),
                    Err(error) => {
                        tracing::warn!(%error, "purging expired idempotency records failed")
                    }
                }
                if *stop.borrow() {
                    return;
                }
                wait = jittered(every);
            }
        });
        Purger {
            stop: stop_tx,
            task,
        }
    }
}

/// A running purger (see [`Engine::spawn_purger`]). Dropping the handle
/// stops the purger as [`Purger::shutdown`] does, without waiting: keep it
/// for as long as the service runs.
#[derive(Debug)]
#[must_use = "dropping a Purger stops it; keep it and call shutdown() when the service stops"]
pub struct Purger {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Purger {
    /// Stops the purger between two batches and waits until it has stopped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(error) = self.task.await {
            if error.is_panic() {
                tracing::warn!(%error, "the purger had panicked");
            }
        }
    }

    /// Whether the purger's task has ended (after a shutdown or a panic).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// `every` ± [`JITTER`].
fn jittered(every: Duration) -> Duration {
    every.mul_f64(1.0 - JITTER + 2.0 * JITTER * unit_random())
}

/// A number in `[0, 1)`, different on every call and in every process.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let every = Duration::from_secs(100);
        let waits: Vec<Duration> = (0..200).map(|_| jittered(every)).collect();
        assert!(waits
            .iter()
            .all(|w| *w >= Duration::from_secs(90) && *w <= Duration::from_secs(110)));
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(distinct.len() > 100, "waits should differ: {distinct:?}");
    }
}
