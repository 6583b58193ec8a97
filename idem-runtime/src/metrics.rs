//! What idem records through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! idem installs no recorder and no exporter: install one in the application
//! (for example `metrics-exporter-prometheus`) and these series appear; without
//! one every call below is a no-op. Labels are bounded: step names (declared
//! constants), fixed outcome words, sink names chosen by the application. Keys,
//! scopes and tenants are never labels.
//!
//! An engine built into [`Shards`](crate::shard::Shards) (see
//! [`Engine::with_shard`](crate::Engine::with_shard)) adds a `shard` label,
//! its index (`"0"`, `"1"`, …), to the series it, its relay and its purger
//! record: the claims, handler, purge and outbox series below. An unsharded
//! engine's series carry no `shard` label.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `idem_claims_total` | counter | `step`, `outcome` | one per claim or finish, by outcome (below) |
//! | `idem_claim_wait_seconds` | histogram | `step` | from asking for the key to the claim's answer: the read, the lock wait, the in-progress write |
//! | `idem_handler_duration_seconds` | histogram | `step` | the work under a claim, from the claim to its finish |
//! | `idem_batch_claims` | histogram | – | SQLite group commit: the claims one `COMMIT` answered |
//! | `idem_purge_rows_total` | counter | – | expired records deleted |
//! | `idem_purge_duration_seconds` | histogram | `result` (`ok`, `error`) | one purge run, all its batches |
//! | `idem_outbox_pending` | gauge | – | messages not yet delivered (set by the relay) |
//! | `idem_outbox_oldest_pending_seconds` | gauge | – | age of the oldest undelivered message: **the** outbox alert |
//! | `idem_outbox_published_total` | counter | `sink`, `result` (`ok`, `retry`, `dead`) | delivery attempts by sink and result |
//! | `idem_outbox_dead_total` | counter | `sink` | messages given up on |
//! | `idem_outbox_relay_lag_seconds` | histogram | `sink` | from the enqueue (in the claim's transaction) to the settled delivery |
//! | `idem_inbox_messages_total` | counter | `consumer`, `result` (`processed`, `duplicate`, `poison`) | messages a consumer handled |
//!
//! The `outcome` of `idem_claims_total`:
//!
//! | outcome | meaning |
//! |---|---|
//! | `executed` | the work ran for the first time under the key |
//! | `took_over` | the work ran after taking over a crashed attempt's expired lock |
//! | `replayed` | the stored answer was returned; nothing ran |
//! | `mismatch` | the key was used before with a different request (422) |
//! | `in_progress` | another attempt holds the key (409) |
//! | `failed_open` | the store was down and the policy fails open: ran without deduplication |
//! | `unavailable` | the store was down and the policy fails closed (503) |
//! | `fenced` | a durable claim's lock was taken over while the work ran; this attempt rolled back |
//! | `error` | anything else (a stored answer that no longer decodes, a work timeout) |
//!
//! The relay records the outbox rows (the two gauges after a round, at most
//! once per poll interval, from one backlog query; the rest as it settles each
//! message) and the inbox records `idem_inbox_messages_total` for each message
//! it processes, finds a duplicate of, or poisons, through [`outbox_pending`],
//! [`outbox_published`], [`outbox_dead`], [`outbox_relay_lag`] and
//! [`inbox_message`].

use std::sync::Arc;
use std::time::Duration;

use metrics::{Label, SharedString};

use crate::error::IdemError;

/// The `shard` label of an engine built into
/// [`Shards`](crate::shard::Shards): its index, kept as text once so that
/// recording a series does not format it again. Unsharded engines have none.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardLabel(Option<(usize, SharedString)>);

impl ShardLabel {
    /// No `shard` label: an unsharded engine.
    pub(crate) const NONE: Self = Self(None);

    /// The label of shard `index`.
    pub(crate) fn of(index: usize) -> Self {
        let text: Arc<str> = Arc::from(index.to_string());
        Self(Some((index, SharedString::from_shared(text))))
    }

    /// The shard's index, if there is one.
    pub(crate) fn index(&self) -> Option<usize> {
        self.0.as_ref().map(|(index, _)| *index)
    }

    /// `labels`, and `shard` after them if there is one.
    fn on<const N: usize>(&self, labels: [(&'static str, SharedString); N]) -> Vec<Label> {
        let mut all: Vec<Label> = labels
            .into_iter()
            .map(|(key, value)| Label::new(key, value))
            .collect();
        if let Some((_, shard)) = &self.0 {
            all.push(Label::new("shard", shard.clone()));
        }
        all
    }
}

/// Claims by step and outcome (counter; labels `step`, `outcome`).
pub const CLAIMS: &str = "idem_claims_total";
/// Time to the claim's answer (histogram, seconds; label `step`).
pub const CLAIM_WAIT: &str = "idem_claim_wait_seconds";
/// The work under a claim (histogram, seconds; label `step`).
pub const HANDLER_DURATION: &str = "idem_handler_duration_seconds";
/// The claims one group `COMMIT` answered (histogram; SQLite).
pub const BATCH_CLAIMS: &str = "idem_batch_claims";
/// Expired records deleted by purges (counter).
pub const PURGE_ROWS: &str = "idem_purge_rows_total";
/// One purge run (histogram, seconds; label `result`).
pub const PURGE_DURATION: &str = "idem_purge_duration_seconds";
/// Undelivered outbox messages (gauge).
pub const OUTBOX_PENDING: &str = "idem_outbox_pending";
/// Age of the oldest undelivered outbox message (gauge, seconds).
pub const OUTBOX_OLDEST_PENDING: &str = "idem_outbox_oldest_pending_seconds";
/// Outbox delivery attempts (counter; labels `sink`, `result`).
pub const OUTBOX_PUBLISHED: &str = "idem_outbox_published_total";
/// Outbox messages given up on (counter; label `sink`).
pub const OUTBOX_DEAD: &str = "idem_outbox_dead_total";
/// From an outbox message's commit to its delivery (histogram, seconds; label `sink`).
pub const OUTBOX_RELAY_LAG: &str = "idem_outbox_relay_lag_seconds";
/// Messages a consumer handled (counter; labels `consumer`, `result`).
pub const INBOX_MESSAGES: &str = "idem_inbox_messages_total";

/// How a claim (or its finish) ended: the `outcome` label of [`CLAIMS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimOutcome {
    /// The work ran for the first time.
    Executed,
    /// The work ran after a takeover.
    TookOver,
    /// The stored answer was returned.
    Replayed,
    /// A different request under the same key.
    Mismatch,
    /// Another attempt holds the key.
    InProgress,
    /// Ran without deduplication (store down, fail open).
    FailedOpen,
    /// Store down, fail closed.
    Unavailable,
    /// The claim's lock was taken over while the work ran.
    Fenced,
    /// Any other error.
    Error,
    /// The claim's transaction lost to a concurrent one (serialization
    /// failure or deadlock) and rolled back.
    Conflict,
}

impl ClaimOutcome {
    /// The label value.
    ///
    /// ```
    /// use idem_runtime::metrics::ClaimOutcome;
    /// assert_eq!(ClaimOutcome::TookOver.as_str(), "took_over");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimOutcome::Executed => "executed",
            ClaimOutcome::TookOver => "took_over",
            ClaimOutcome::Replayed => "replayed",
            ClaimOutcome::Mismatch => "mismatch",
            ClaimOutcome::InProgress => "in_progress",
            ClaimOutcome::FailedOpen => "failed_open",
            ClaimOutcome::Unavailable => "unavailable",
            ClaimOutcome::Fenced => "fenced",
            ClaimOutcome::Error => "error",
            ClaimOutcome::Conflict => "conflict",
        }
    }

    /// The outcome an error stands for.
    pub fn of_error(error: &IdemError) -> Self {
        match error {
            IdemError::Mismatch => ClaimOutcome::Mismatch,
            IdemError::InProgress { .. } => ClaimOutcome::InProgress,
            IdemError::Unavailable { .. } | IdemError::StoreBusy { .. } => {
                ClaimOutcome::Unavailable
            }
            IdemError::Conflict { .. } => ClaimOutcome::Conflict,
            IdemError::LockLost => ClaimOutcome::Fenced,
            IdemError::TimedOut { .. } | IdemError::Replay(_) => ClaimOutcome::Error,
        }
    }
}

/// Counts one claim outcome for `step`.
pub fn claim_outcome(step: &'static str, outcome: ClaimOutcome) {
    claim_outcome_on(&ShardLabel::NONE, step, outcome);
}

fn claim_outcome_on(shard: &ShardLabel, step: &'static str, outcome: ClaimOutcome) {
    let labels = shard.on([("step", step.into()), ("outcome", outcome.as_str().into())]);
    metrics::counter!(CLAIMS, labels).increment(1);
}

/// Records a claim's answer and how long it took to get it.
pub(crate) fn claim(
    shard: &ShardLabel,
    step: &'static str,
    outcome: ClaimOutcome,
    waited: Duration,
) {
    claim_outcome_on(shard, step, outcome);
    metrics::histogram!(CLAIM_WAIT, shard.on([("step", step.into())])).record(waited.as_secs_f64());
}

/// Records the work's duration under a claim, and a fenced finish.
pub(crate) fn finished(
    shard: &ShardLabel,
    step: &'static str,
    worked: Duration,
    result: &Result<(), IdemError>,
) {
    metrics::histogram!(HANDLER_DURATION, shard.on([("step", step.into())]))
        .record(worked.as_secs_f64());
    if let Err(error @ IdemError::LockLost) = result {
        claim_outcome_on(shard, step, ClaimOutcome::of_error(error));
    }
}

/// Records a group commit and the claims it answered.
pub(crate) fn batch_committed(claims: usize) {
    metrics::histogram!(BATCH_CLAIMS).record(claims as f64);
}

/// Records one purge run.
pub(crate) fn purged(shard: &ShardLabel, result: &Result<u64, sqlx::Error>, took: Duration) {
    let label = match result {
        Ok(rows) => {
            metrics::counter!(PURGE_ROWS, shard.on([])).increment(*rows);
            "ok"
        }
        Err(_) => "error",
    };
    metrics::histogram!(PURGE_DURATION, shard.on([("result", label.into())]))
        .record(took.as_secs_f64());
}

/// Sets the outbox backlog: how many messages wait, and the oldest one's age.
/// The relay calls this after each scan.
///
/// ```
/// idem_runtime::metrics::outbox_pending(12, std::time::Duration::from_secs(3));
/// ```
pub fn outbox_pending(pending: u64, oldest: Duration) {
    outbox_pending_on(&ShardLabel::NONE, pending, oldest);
}

/// [`outbox_pending`] for one shard's relay.
pub(crate) fn outbox_pending_on(shard: &ShardLabel, pending: u64, oldest: Duration) {
    metrics::gauge!(OUTBOX_PENDING, shard.on([])).set(pending as f64);
    metrics::gauge!(OUTBOX_OLDEST_PENDING, shard.on([])).set(oldest.as_secs_f64());
}

/// The result of one outbox delivery attempt: the `result` label of [`OUTBOX_PUBLISHED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PublishResult {
    /// The sink accepted the message.
    Ok,
    /// The attempt failed; the message is retried later.
    Retry,
    /// The message was given up on.
    Dead,
}

impl PublishResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PublishResult::Ok => "ok",
            PublishResult::Retry => "retry",
            PublishResult::Dead => "dead",
        }
    }
}

/// Counts one delivery attempt through `sink` (a name the application gives
/// each sink, not a URL). A dead message also counts in [`OUTBOX_DEAD`].
///
/// ```
/// use idem_runtime::metrics::{outbox_published, PublishResult};
/// outbox_published("webhooks", PublishResult::Ok);
/// ```
pub fn outbox_published(sink: &str, result: PublishResult) {
    outbox_published_on(&ShardLabel::NONE, sink, result);
}

/// [`outbox_published`] for one shard's relay.
pub(crate) fn outbox_published_on(shard: &ShardLabel, sink: &str, result: PublishResult) {
    let labels = shard.on([
        ("sink", sink.to_owned().into()),
        ("result", result.as_str().into()),
    ]);
    metrics::counter!(OUTBOX_PUBLISHED, labels).increment(1);
    if result == PublishResult::Dead {
        outbox_dead_on(shard, sink);
    }
}

/// Counts a message given up on by `sink`'s relay.
pub fn outbox_dead(sink: &str) {
    outbox_dead_on(&ShardLabel::NONE, sink);
}

fn outbox_dead_on(shard: &ShardLabel, sink: &str) {
    metrics::counter!(OUTBOX_DEAD, shard.on([("sink", sink.to_owned().into())])).increment(1);
}

/// Records the lag from a message's commit to its delivery through `sink`.
pub fn outbox_relay_lag(sink: &str, lag: Duration) {
    outbox_relay_lag_on(&ShardLabel::NONE, sink, lag);
}

/// [`outbox_relay_lag`] for one shard's relay.
pub(crate) fn outbox_relay_lag_on(shard: &ShardLabel, sink: &str, lag: Duration) {
    metrics::histogram!(
        OUTBOX_RELAY_LAG,
        shard.on([("sink", sink.to_owned().into())])
    )
    .record(lag.as_secs_f64());
}

/// What a consumer did with one message: the `result` label of [`INBOX_MESSAGES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InboxResult {
    /// Handled for the first time.
    Processed,
    /// Seen before; acknowledged without handling.
    Duplicate,
    /// Set aside after failing too often.
    Poison,
}

impl InboxResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxResult::Processed => "processed",
            InboxResult::Duplicate => "duplicate",
            InboxResult::Poison => "poison",
        }
    }
}

/// Counts one message handled by `consumer` (a name the application gives it).
///
/// ```
/// use idem_runtime::metrics::{inbox_message, InboxResult};
/// inbox_message("ledger", InboxResult::Duplicate);
/// ```
pub fn inbox_message(consumer: &str, result: InboxResult) {
    metrics::counter!(INBOX_MESSAGES, "consumer" => consumer.to_owned(), "result" => result.as_str())
        .increment(1);
}
