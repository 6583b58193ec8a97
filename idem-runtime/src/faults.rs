//! Crash points for fault-injection tests.
//!
//! A test names a point; the service calls [`abort_at`] at each point of its
//! request path, and the process dies there with [`std::process::abort`]: no
//! unwinding, no destructors, no commit, exactly like a kill.
//!
//! Only a build with the `faults` feature can abort ([`ENABLED`]); without it
//! [`abort_at`] does nothing. Never enable the feature in a production build;
//! services should also require an explicit flag before they honour a fault
//! request.

use std::fmt;
use std::str::FromStr;

/// Where in an idempotent request a test wants the process to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The key is claimed, nothing written yet.
    AfterClaim,
    /// The business write is done in the claim's transaction, not committed.
    AfterBusinessWrite,
    /// The key record and the business write committed; the answer was not sent.
    AfterCommit,
}

impl FaultPoint {
    /// The point's name: `after-claim`, `after-business-write`, `after-commit`.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterClaim => "after-claim",
            FaultPoint::AfterBusinessWrite => "after-business-write",
            FaultPoint::AfterCommit => "after-commit",
        }
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Not one of the three point names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault point {0:?}; use after-claim, after-business-write or after-commit")]
pub struct UnknownFaultPoint(pub String);

impl FromStr for FaultPoint {
    type Err = UnknownFaultPoint;

    /// ```
    /// use idem_runtime::faults::FaultPoint;
    /// assert_eq!("after-commit".parse(), Ok(FaultPoint::AfterCommit));
    /// assert!("later".parse::<FaultPoint>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "after-claim" => Ok(FaultPoint::AfterClaim),
            "after-business-write" => Ok(FaultPoint::AfterBusinessWrite),
            "after-commit" => Ok(FaultPoint::AfterCommit),
            other => Err(UnknownFaultPoint(other.to_owned())),
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
