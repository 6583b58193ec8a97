//! The relay: a tokio task that publishes committed outbox messages.
//!
//! Each round it leases a batch of due messages (see the store module for
//! how several relays share one database), publishes each through its sink
//! outside any transaction, bounded by a timeout shorter than the lease, and
//! then settles the batch under the lease tokens it claimed with (every
//! delivered row by one statement, each failure by its own):
//!
//! | sink says | row becomes |
//! |---|---|
//! | [`Delivered::Published`] / [`Delivered::Duplicate`] | `sent` |
//! | [`SinkError::Transient`], a timeout, attempts left | `pending`, due after a backoff (full jitter, capped; `Retry-After` honoured up to the cap) |
//! | [`SinkError::Transient`], a timeout, no attempts left | `dead` |
//! | [`SinkError::Permanent`] | `dead` |
//!
//! A settle that finds another token on the row changes nothing and counts
//! as fenced: this relay's lease expired and another relay owns the message.
//!
//! Wake-up: an [`enqueue`](super::enqueue) in this process wakes every relay
//! in it, and so does the commit of an engine claim that enqueued; a relay
//! woken before the enqueuing transaction committed looks again a few times
//! over the next half second (waking at once on the next wake-up), so it
//! finds the message as soon as that transaction commits.
//! Messages enqueued by other processes are found by polling
//! ([`Relay::poll_interval`], 1 s by default) or, on Postgres, woken by
//! `NOTIFY` ([`Relay::listen`], [`notify_other_processes`](super::notify_other_processes)).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Pool;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use super::sink::{Delivered, Sink, SinkError};
use super::wake::{wake_relays, ENQUEUES, WAKE};
use super::DEFAULT_MAX_ATTEMPTS;
use crate::engine::Engine;
use crate::faults::{abort_at, FaultPoint, ENABLED};
use crate::metrics::{self, PublishResult, ShardLabel};
use crate::store::outbox::{Claimed, Settlement};
use crate::store::Backend;
use crate::IdempotencyKey;

/// How long a relay waits before retrying a transient failure: attempt `n`
/// (from 1) waits a uniformly random time in `0..=min(cap, base · 2^(n-1))`
/// ("full jitter"), so retries of many messages spread out instead of
/// arriving together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry's upper bound.
    pub base: Duration,
    /// The largest wait, also the most a `Retry-After` is honoured for.
    pub cap: Duration,
}

impl Default for Backoff {
    /// 1 s doubling up to 5 minutes.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The upper bound of the wait after attempt `attempt` (from 1).
    ///
    /// ```
    /// use idem_runtime::outbox::Backoff;
    /// use std::time::Duration;
    /// let backoff = Backoff::default();
    /// assert_eq!(backoff.ceiling(1), Duration::from_secs(1));
    /// assert_eq!(backoff.ceiling(4), Duration::from_secs(8));
    /// assert_eq!(backoff.ceiling(30), Duration::from_secs(300));
    /// ```
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.base
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.cap)
    }

    /// A random wait after attempt `attempt`, in `0..=ceiling(attempt)`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(fastrand::u64(0..=millis))
    }

    /// The longest a message can stay undelivered while being retried:
    /// every wait at its ceiling plus one lease per attempt. Sinks that
    /// deduplicate for a limited window must cover at least this.
    pub fn horizon(&self, max_attempts: u32, lease: Duration) -> Duration {
        (1..max_attempts.max(1))
            .map(|attempt| self.ceiling(attempt))
            .fold(
                lease.saturating_mul(max_attempts.max(1)),
                Duration::saturating_add,
            )
    }
}

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The builder's settings contradict each other.
    #[error("relay misconfigured: {0}")]
    Config(String),
    /// A sink's startup check failed.
    #[error("sink `{sink}` refused to start: {reason}")]
    SinkRefused {
        /// The sink's name.
        sink: String,
        /// Its explanation.
        reason: String,
    },
    /// The database refused.
    #[error("outbox store error: {0}")]
    Store(#[from] sqlx::Error),
}

#[derive(Debug, Default)]
struct Counters {
    claimed: AtomicU64,
    published: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    fenced: AtomicU64,
    purged: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> RelayStats {
        RelayStats {
            claimed: self.claimed.load(Ordering::Relaxed),
            published: self.published.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            purged: self.purged.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of a relay's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Messages leased.
    pub claimed: u64,
    /// Delivered for the first time (and marked sent).
    pub published: u64,
    /// The receiver already had them (marked sent).
    pub duplicates: u64,
    /// Transient failures put back with a backoff.
    pub retried: u64,
    /// Moved to `dead`.
    pub dead: u64,
    /// Settles refused because the lease had passed to another relay.
    pub fenced: u64,
    /// Sent messages purged after the retention window.
    pub purged: u64,
}

/// Builds and starts a relay over an engine's database.
///
/// ```no_run
/// use idem_runtime::outbox::{Relay, WebhookSink};
/// use idem_runtime::signature::SigningSecret;
/// use idem_runtime::Engine;
/// use std::time::Duration;
///
/// # async fn demo(engine: Engine<sqlx::Sqlite>) -> Result<(), Box<dyn std::error::Error>> {
/// let secret = SigningSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let relay = Relay::new(&engine)
///     .sink(WebhookSink::new(secret))
///     .lease(Duration::from_secs(30))
///     .batch(64)
///     .spawn()
///     .await?;
/// // ... serve ...
/// println!("{:?}", relay.stats());
/// let last = relay.shutdown().await;
/// println!("published {} in all", last.published);
/// # Ok(()) }
/// ```
pub struct Relay<DB: Backend> {
    pool: Pool<DB>,
    sinks: HashMap<String, Arc<dyn Sink>>,
    lease: Duration,
    publish_timeout: Option<Duration>,
    batch: u32,
    poll_interval: Duration,
    backoff: Backoff,
    max_attempts: u32,
    retention: Duration,
    purge_every: Duration,
    purge_batch: u32,
    owner: String,
    fault: Option<FaultPoint>,
    listen: bool,
    counters: Arc<Counters>,
    /// The engine's `shard` label, on the relay's series.
    shard: ShardLabel,
}

impl<DB: Backend> fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sinks: Vec<&String> = self.sinks.keys().collect();
        sinks.sort();
        f.debug_struct("Relay")
            .field("owner", &self.owner)
            .field("sinks", &sinks)
            .field("lease", &self.lease)
            .field("publish_timeout", &self.effective_timeout())
            .field("batch", &self.batch)
            .field("poll_interval", &self.poll_interval)
            .field("backoff", &self.backoff)
            .field("retention", &self.retention)
            .finish()
    }
}

impl<DB: Backend> Relay<DB> {
    /// A relay over `engine`'s pool with no sinks yet; defaults: a 30 s
    /// lease, publishes bounded at two thirds of it, batches of 32, polling
    /// every second, [`Backoff::default`], sent rows kept 24 h.
    pub fn new(engine: &Engine<DB>) -> Self {
        Self {
            pool: engine.pool().clone(),
            sinks: HashMap::new(),
            lease: Duration::from_secs(30),
            publish_timeout: None,
            batch: 32,
            poll_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retention: Duration::from_secs(24 * 3600),
            purge_every: Duration::from_secs(60),
            purge_batch: 1000,
            owner: format!("{}-{:08x}", std::process::id(), fastrand::u32(..)),
            fault: None,
            listen: false,
            counters: Arc::default(),
            shard: engine.shard_label().clone(),
        }
    }

    /// Adds a sink; messages name it by [`Sink::name`]. A relay claims only
    /// messages for its sinks.
    pub fn sink(self, sink: impl Sink) -> Self {
        self.shared_sink(Arc::new(sink))
    }

    /// Adds a shared sink.
    pub fn shared_sink(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sinks.insert(sink.name().to_owned(), sink);
        self
    }

    /// How long a claimed message is this relay's: past it, another relay
    /// may claim the message again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The bound on one publish; must be shorter than the lease (two thirds
    /// of it by default).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = Some(timeout);
        self
    }

    /// How many messages one round claims.
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch;
        self
    }

    /// How often an idle relay looks for messages enqueued by other processes.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// The backoff for transient failures.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The attempts the retry horizon is computed for (the sinks' startup
    /// check): the largest `max_attempts` the application's messages use
    /// ([`DEFAULT_MAX_ATTEMPTS`] by default).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// How long sent messages are kept (for inspection) before the relay
    /// purges them; dead messages are never purged.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How often the relay purges, and how many rows per delete.
    pub fn purge(mut self, every: Duration, batch: u32) -> Self {
        self.purge_every = every;
        self.purge_batch = batch;
        self
    }

    /// The name this relay's leases carry (the process id and a random
    /// suffix by default).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// On Postgres, also wakes on `NOTIFY idem_outbox`, which enqueues in
    /// other processes send when they call
    /// [`notify_other_processes`](super::notify_other_processes)`(true)`
    /// (one listening connection per relay, reconnected on loss). Polling
    /// stays the fallback. No effect on SQLite.
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = on;
        self
    }

    /// Arms one of the relay's fault points (`relay-…`; only in a build
    /// with the `faults` feature).
    pub fn fault(mut self, fault: Option<FaultPoint>) -> Self {
        self.fault = fault;
        self
    }

    /// The longest a message can stay undelivered while this relay retries
    /// it: what sinks are checked against at start.
    pub fn retry_horizon(&self) -> Duration {
        self.backoff.horizon(self.max_attempts, self.lease)
    }

    fn effective_timeout(&self) -> Duration {
        self.publish_timeout
            .unwrap_or(self.lease.saturating_mul(2) / 3)
    }

    /// Checks the settings and every sink ([`Sink::check`] against
    /// [`Relay::retry_horizon`]), then starts the relay on the current tokio
    /// runtime.
    pub async fn spawn(self) -> Result<RelayHandle, RelayError> {
        if self.sinks.is_empty() {
            return Err(RelayError::Config("a relay needs at least one sink".into()));
        }
        if self.batch == 0 {
            return Err(RelayError::Config(
                "the batch size must be at least 1".into(),
            ));
        }
        if self.lease.is_zero() || self.effective_timeout() >= self.lease {
            return Err(RelayError::Config(format!(
                "the publish timeout ({:?}) must be shorter than the lease ({:?}), or a slow \
                 publish could outlive its lease and be sent twice",
                self.effective_timeout(),
                self.lease
            )));
        }
        let horizon = self.retry_horizon();
        for (name, sink) in &self.sinks {
            sink.check(horizon)
                .await
                .map_err(|reason| RelayError::SinkRefused {
                    sink: name.clone(),
                    reason,
                })?;
        }
        let counters = self.counters.clone();
        let (stop, stopped) = watch::channel(false);
        let worker = Worker {
            names: self.sinks.keys().cloned().collect(),
            relay: Arc::new(self),
        };
        let owner = worker.relay.owner.clone();
        let listener = worker.relay.listen.then(|| {
            let pool = worker.relay.pool.clone();
            let retry = worker.relay.poll_interval;
            tokio::spawn(async move {
                loop {
                    match DB::listen_for_enqueues(&pool, wake_relays).await {
                        Ok(()) => return,
                        Err(error) => {
                            tracing::warn!(%error, "the outbox relay's listener failed; listening again");
                            tokio::time::sleep(retry).await;
                        }
                    }
                }
            })
        });
        let task = tokio::spawn(worker.run(stopped));
        Ok(RelayHandle {
            owner,
            counters,
            stop,
            task,
            listener,
        })
    }

    /// Runs one round by hand: claims a batch, publishes it, settles it.
    /// Returns how many messages it claimed. [`Relay::spawn`] does this in
    /// a loop; this is for tests and for draining from a script.
    pub async fn run_once(&self) -> Result<usize, RelayError> {
        let names: Vec<String> = self.sinks.keys().cloned().collect();
        let claimed = round(self, &names).await?;
        report_backlog(self).await;
        Ok(claimed)
    }

    /// The counters of [`Relay::run_once`] rounds (a spawned relay's are on
    /// its [`RelayHandle`]).
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }
}

/// A running relay.
#[derive(Debug)]
pub struct RelayHandle {
    owner: String,
    counters: Arc<Counters>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    listener: Option<JoinHandle<()>>,
}

impl RelayHandle {
    /// The relay's counters so far.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// The name this relay's leases carry.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Makes every relay in this process look for messages now (after a
    /// commit made on a connection `enqueue` did not see, say).
    pub fn wake(&self) {
        wake_relays();
    }

    /// Stops the relay: the round in flight finishes (its publishes are
    /// bounded by the publish timeout) and is settled, leases still held are
    /// released, and the task ends. Returns the final counters.
    pub async fn shutdown(self) -> RelayStats {
        let _ = self.stop.send(true);
        if let Some(listener) = &self.listener {
            listener.abort();
        }
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "the outbox relay task ended abnormally");
        }
        self.counters.snapshot()
    }
}

struct Worker<DB: Backend> {
    relay: Arc<Relay<DB>>,
    names: Vec<String>,
}

/// After an in-process wake-up that found nothing (the enqueuing transaction
/// had not committed yet), look again after these pauses.
const CHASE: [Duration; 5] = [
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(80),
    Duration::from_millis(400),
];

impl<DB: Backend> Worker<DB> {
    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let relay = &*self.relay;
        let mut next_purge = Instant::now();
        let mut next_report = Instant::now();
        let mut chase: Option<usize> = None;
        while !*stopped.borrow() {
            if Instant::now() >= next_purge {
                self.purge().await;
                next_purge = Instant::now() + relay.purge_every;
            }
            if Instant::now() >= next_report {
                report_backlog(relay).await;
                next_report = Instant::now() + relay.poll_interval;
            }
            let notified = WAKE.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let seen = ENQUEUES.load(Ordering::Acquire);
            match round(relay, &self.names).await {
                Ok(0) => {}
                Ok(_) => {
                    chase = Some(0);
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "outbox relay round failed; retrying after the poll interval");
                    chase = None;
                }
            }
            if let Some(step) = chase {
                if let Some(pause) = CHASE.get(step) {
                    chase = Some(step + 1);
                    tokio::select! {
                        _ = &mut notified => chase = Some(0),
                        _ = tokio::time::sleep(*pause) => {}
                        _ = stopped.changed() => {}
                    }
                    continue;
                }
                chase = None;
            }
            if ENQUEUES.load(Ordering::Acquire) != seen {
                chase = Some(0);
                continue;
            }
            tokio::select! {
                _ = &mut notified => chase = Some(0),
                _ = tokio::time::sleep(relay.poll_interval) => {}
                _ = stopped.changed() => {}
            }
        }
        match DB::release_leases(&relay.pool, &relay.owner).await {
            Ok(0) => {}
            Ok(released) => tracing::info!(released, "outbox relay released its leases"),
            Err(error) => {
                tracing::warn!(%error, "releasing the relay's leases failed; they expire on their own")
            }
        }
    }

    async fn purge(&self) {
        let relay = &*self.relay;
        loop {
            match DB::purge_sent_messages(&relay.pool, relay.retention, relay.purge_batch).await {
                Ok(purged) => {
                    relay.counters.purged.fetch_add(purged, Ordering::Relaxed);
                    if purged < u64::from(relay.purge_batch) {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "purging sent outbox messages failed");
                    return;
                }
            }
        }
    }
}

/// Sets the backlog gauges (`idem_outbox_pending`, `idem_outbox_oldest_pending_seconds`).
async fn report_backlog<DB: Backend>(relay: &Relay<DB>) {
    match DB::outbox_backlog(&relay.pool).await {
        Ok(backlog) => metrics::outbox_pending_on(
            &relay.shard,
            backlog.pending,
            backlog.oldest_pending.unwrap_or_default(),
        ),
        Err(error) => tracing::warn!(%error, "reading the outbox backlog failed"),
    }
}

/// The tag a message is logged under: the log tag of its id, which is the
/// key the consumer downstream claims it under, so one message can be
/// followed from the relay's span to the consumer's.
fn message_tag(id: &str) -> String {
    IdempotencyKey::new(id)
        .map(|key| key.log_tag())
        .unwrap_or_else(|_| "invalid".to_owned())
}

/// One claim, its publishes and their settles. Returns how many it claimed.
async fn round<DB: Backend>(relay: &Relay<DB>, names: &[String]) -> Result<usize, sqlx::Error> {
    let claimed =
        DB::lease_messages(&relay.pool, names, &relay.owner, relay.lease, relay.batch).await?;
    if claimed.is_empty() {
        return Ok(0);
    }
    let span =
        tracing::info_span!("idem.relay.batch", claimed = claimed.len(), owner = %relay.owner);
    publish_batch(relay, claimed).instrument(span).await
}

async fn publish_batch<DB: Backend>(
    relay: &Relay<DB>,
    claimed: Vec<Claimed>,
) -> Result<usize, sqlx::Error> {
    let counters = &*relay.counters;
    let count = claimed.len();
    counters.claimed.fetch_add(count as u64, Ordering::Relaxed);
    let timeout = relay.effective_timeout();
    let mut publishes = JoinSet::new();
    for message in claimed {
        let sink = relay.sinks[&message.sink].clone();
        let fault = relay.fault;
        let span = tracing::info_span!(
            "idem.relay.publish",
            key = %message_tag(&message.message.id),
            sink = %message.sink,
            step = %message.message.step,
            attempt = message.message.attempt,
        );
        publishes.spawn(
            async move {
                let outcome = publish(&*sink, &message, timeout, fault).await;
                (message, outcome, tracing::Span::current())
            }
            .instrument(span),
        );
    }
    // Deliveries, with the counter each goes to, and their rows for the settle.
    let mut sent = Vec::new();
    let mut rows: Vec<(i64, i64, Option<String>)> = Vec::new();
    while let Some(joined) = publishes.join_next().await {
        let (message, outcome, span) = match joined {
            Ok(done) => done,
            Err(error) => {
                // A panicking sink: the lease expires and the message is retried.
                tracing::error!(%error, "an outbox sink panicked");
                continue;
            }
        };
        let (counter, receipt) = match outcome {
            Ok(Delivered::Published { receipt }) => (&counters.published, receipt),
            Ok(Delivered::Duplicate { receipt }) => (&counters.duplicates, receipt),
            failed => {
                settle(relay, &message, failed).instrument(span).await?;
                continue;
            }
        };
        rows.push((message.row, message.token, receipt));
        sent.push((message, counter, span));
    }
    // Every delivery of the batch is marked sent by one statement, each row
    // still conditioned on its own lease token: the rows it does not return
    // were fenced.
    let marked: HashSet<i64> = DB::settle_sent(&relay.pool, &rows)
        .await?
        .into_iter()
        .collect();
    for (message, counter, span) in &sent {
        let _entered = span.enter();
        record(
            relay,
            message,
            counter,
            PublishResult::Ok,
            marked.contains(&message.row),
        );
    }
    Ok(count)
}

async fn publish(
    sink: &dyn Sink,
    message: &Claimed,
    timeout: Duration,
    fault: Option<FaultPoint>,
) -> Result<Delivered, SinkError> {
    abort_at(fault, FaultPoint::RelayBeforePublish);
    let outcome = match tokio::time::timeout(timeout, sink.publish(&message.message)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(SinkError::Transient {
            message: format!("publish timed out after {timeout:?}"),
            retry_after: None,
        }),
    };
    if outcome.is_ok() {
        abort_at(fault, FaultPoint::RelayAfterPublish);
        if let (true, Some(FaultPoint::RelayStallAfterPublish(pause))) = (ENABLED, fault) {
            tokio::time::sleep(pause).await;
        }
    }
    outcome
}

async fn settle<DB: Backend>(
    relay: &Relay<DB>,
    claimed: &Claimed,
    outcome: Result<Delivered, SinkError>,
) -> Result<(), sqlx::Error> {
    let counters = &*relay.counters;
    let id = &claimed.message.id;
    let attempt = claimed.message.attempt;
    let (settlement, counter, delivery) = match outcome {
        Ok(Delivered::Published { receipt }) => (
            Settlement::Sent { receipt },
            &counters.published,
            PublishResult::Ok,
        ),
        Ok(Delivered::Duplicate { receipt }) => (
            Settlement::Sent { receipt },
            &counters.duplicates,
            PublishResult::Ok,
        ),
        Err(SinkError::Permanent { message }) => {
            tracing::warn!(message_id = %id, attempt, error = %message, "outbox message is dead: permanent failure");
            (
                Settlement::Dead { error: message },
                &counters.dead,
                PublishResult::Dead,
            )
        }
        Err(SinkError::Transient { message, .. }) if attempt >= claimed.max_attempts => {
            tracing::warn!(message_id = %id, attempt, error = %message, "outbox message is dead: out of attempts");
            (
                Settlement::Dead {
                    error: format!("{message} (after {attempt} attempts)"),
                },
                &counters.dead,
                PublishResult::Dead,
            )
        }
        Err(SinkError::Transient {
            message,
            retry_after,
        }) => {
            let after = match retry_after {
                Some(asked) => asked.min(relay.backoff.cap),
                None => relay.backoff.delay(attempt),
            };
            tracing::debug!(message_id = %id, attempt, ?after, error = %message, "outbox message retried later");
            (
                Settlement::Retry {
                    after,
                    error: message,
                },
                &counters.retried,
                PublishResult::Retry,
            )
        }
    };
    let settled = DB::settle_message(&relay.pool, claimed.row, claimed.token, &settlement).await?;
    record(relay, claimed, counter, delivery, settled);
    Ok(())
}

/// Counts one settle: its outcome and metrics if it took, fenced if not.
fn record<DB: Backend>(
    relay: &Relay<DB>,
    claimed: &Claimed,
    counter: &AtomicU64,
    delivery: PublishResult,
    settled: bool,
) {
    let counters = &*relay.counters;
    let id = &claimed.message.id;
    let attempt = claimed.message.attempt;
    if settled {
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::outbox_published_on(&relay.shard, &claimed.sink, delivery);
        if delivery == PublishResult::Ok {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |now| now.as_millis() as i64);
            let lag = now_ms.saturating_sub(claimed.created_at_ms).max(0);
            metrics::outbox_relay_lag_on(
                &relay.shard,
                &claimed.sink,
                Duration::from_millis(lag as u64),
            );
        }
    } else {
        tracing::warn!(message_id = %id, attempt, "outbox relay lost its lease before settling; fenced");
        counters.fenced.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_the_capped_ceiling() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
        };
        assert_eq!(backoff.ceiling(1), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(3), Duration::from_millis(400));
        assert_eq!(backoff.ceiling(6), Duration::from_secs(2));
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(2));
        let delays: Vec<Duration> = (0..200).map(|_| backoff.delay(3)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(400)));
        // Spread out, not all at the ceiling.
        assert!(delays.iter().any(|d| *d < Duration::from_millis(200)));
        assert!(delays.iter().any(|d| *d > Duration::from_millis(200)));
    }

    #[test]
    fn the_horizon_covers_every_wait_and_lease() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(4),
        };
        // Waits after attempts 1..4: 1 + 2 + 4 + 4; leases: 5 × 10.
        assert_eq!(
            backoff.horizon(5, Duration::from_secs(10)),
            Duration::from_secs(61)
        );
        assert_eq!(
            backoff.horizon(1, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }
}
