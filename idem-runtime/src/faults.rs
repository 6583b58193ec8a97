//! Crash points for fault-injection tests, for the claim's request path, the
//! outbox relay and a tenant's move between shards alike.
//!
//! A test names a point; the service calls [`abort_at`] at each point of its
//! request path (the relay at each of its own), and the process dies there
//! with [`std::process::abort`]: no unwinding, no destructors, no commit,
//! exactly like a kill. One point stalls instead of dying
//! ([`FaultPoint::RelayStallAfterPublish`]).
//!
//! Only a build with the `faults` feature can abort ([`ENABLED`]); without it
//! [`abort_at`] does nothing. Never enable the feature in a production build;
//! services should also require an explicit flag before they honour a fault
//! request.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Where in an idempotent request a test wants the process to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The key is claimed, nothing written yet.
    AfterClaim,
    /// The business write is done in the claim's transaction, not committed.
    AfterBusinessWrite,
    /// The key record and the business write committed; the answer was not sent.
    AfterCommit,
    /// SQLite group commit: the batch's claims are written, its `COMMIT`
    /// not sent.
    BatchBeforeCommit,
    /// SQLite group commit: the batch committed; none of its claims was answered.
    BatchAfterCommit,
    /// A relay leased the message; the sink was not called.
    RelayBeforePublish,
    /// The sink acknowledged; the relay has not marked the row sent.
    RelayAfterPublish,
    /// After the sink acknowledged, the relay pauses this long before marking
    /// the row sent, as a stalled process would (`relay-stall-after-publish:<ms>`).
    RelayStallAfterPublish(Duration),
    /// A tenant move ([`crate::shard::TenantMove`]) fenced the tenant on its
    /// source shard; nothing copied yet.
    TenantMoveAfterFence,
    /// A tenant move copied the tenant's records to the target shard; the
    /// route not flipped yet.
    TenantMoveAfterCopy,
    /// A tenant move flipped the route to the target shard; the source's
    /// copies not deleted yet.
    TenantMoveAfterFlip,
    /// A tenant move deleted the source's copies; the directory row's
    /// record of the move not cleared yet.
    TenantMoveAfterDelete,
}

impl FaultPoint {
    /// The point's name: `after-claim`, `after-business-write`,
    /// `after-commit`, `batch-before-commit`, `batch-after-commit`, `relay-before-publish`, `relay-after-publish`,
    /// `relay-stall-after-publish` (written with its pause,
    /// `relay-stall-after-publish:<ms>`), `tenant-move-after-fence`,
    /// `tenant-move-after-copy`, `tenant-move-after-flip`,
    /// `tenant-move-after-delete`.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterClaim => "after-claim",
            FaultPoint::AfterBusinessWrite => "after-business-write",
            FaultPoint::AfterCommit => "after-commit",
            FaultPoint::BatchBeforeCommit => "batch-before-commit",
            FaultPoint::BatchAfterCommit => "batch-after-commit",
            FaultPoint::RelayBeforePublish => "relay-before-publish",
            FaultPoint::RelayAfterPublish => "relay-after-publish",
            FaultPoint::RelayStallAfterPublish(_) => "relay-stall-after-publish",
            FaultPoint::TenantMoveAfterFence => "tenant-move-after-fence",
            FaultPoint::TenantMoveAfterCopy => "tenant-move-after-copy",
            FaultPoint::TenantMoveAfterFlip => "tenant-move-after-flip",
            FaultPoint::TenantMoveAfterDelete => "tenant-move-after-delete",
        }
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultPoint::RelayStallAfterPublish(pause) => {
                write!(f, "{}:{}", self.name(), pause.as_millis())
            }
            point => f.write_str(point.name()),
        }
    }
}

/// Not one of the point names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown fault point {0:?}; use after-claim, after-business-write, after-commit, \
     batch-before-commit, batch-after-commit, relay-before-publish, relay-after-publish, \
     relay-stall-after-publish:<ms>, tenant-move-after-fence, tenant-move-after-copy, \
     tenant-move-after-flip or tenant-move-after-delete"
)]
pub struct UnknownFaultPoint(pub String);

impl FromStr for FaultPoint {
    type Err = UnknownFaultPoint;

    /// ```
    /// use idem_runtime::faults::FaultPoint;
    /// assert_eq!("after-commit".parse(), Ok(FaultPoint::AfterCommit));
    /// assert_eq!(
    ///     "relay-stall-after-publish:250".parse(),
    ///     Ok(FaultPoint::RelayStallAfterPublish(std::time::Duration::from_millis(250)))
    /// );
    /// assert_eq!(
    ///     "tenant-move-after-copy".parse(),
    ///     Ok(FaultPoint::TenantMoveAfterCopy)
    /// );
    /// assert!("later".parse::<FaultPoint>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "after-claim" => Ok(FaultPoint::AfterClaim),
            "after-business-write" => Ok(FaultPoint::AfterBusinessWrite),
            "after-commit" => Ok(FaultPoint::AfterCommit),
            "batch-before-commit" => Ok(FaultPoint::BatchBeforeCommit),
            "batch-after-commit" => Ok(FaultPoint::BatchAfterCommit),
            "relay-before-publish" => Ok(FaultPoint::RelayBeforePublish),
            "relay-after-publish" => Ok(FaultPoint::RelayAfterPublish),
            "tenant-move-after-fence" => Ok(FaultPoint::TenantMoveAfterFence),
            "tenant-move-after-copy" => Ok(FaultPoint::TenantMoveAfterCopy),
            "tenant-move-after-flip" => Ok(FaultPoint::TenantMoveAfterFlip),
            "tenant-move-after-delete" => Ok(FaultPoint::TenantMoveAfterDelete),
            other => other
                .strip_prefix("relay-stall-after-publish:")
                .and_then(|ms| ms.parse().ok())
                .map(|ms| FaultPoint::RelayStallAfterPublish(Duration::from_millis(ms)))
                .ok_or_else(|| UnknownFaultPoint(other.to_owned())),
        }
    }
}

/// Whether this build was compiled with the `faults` feature.
pub const ENABLED: bool = cfg!(feature = "faults");

/// Aborts the process if `armed` names `here` and [`ENABLED`] is true.
///
/// ```
/// use idem_runtime::faults::{abort_at, FaultPoint};
/// abort_at(None, FaultPoint::AfterClaim); // nothing armed: returns
/// abort_at(Some(FaultPoint::AfterCommit), FaultPoint::AfterClaim); // another point: returns
/// ```
pub fn abort_at(armed: Option<FaultPoint>, here: FaultPoint) {
    if ENABLED && armed == Some(here) {
        eprintln!("idem fault injection: aborting {here}");
        std::process::abort();
    }
}
