//! A ready-made error type for idempotent operations, shaped like RFC 9457
//! problem details.

use serde::{Deserialize, Serialize};

use crate::outcome::ErrorStatus;

/// An error with an HTTP-style status, a short title and a detail for the
/// client. Below 500 it is deterministic (stored and replayed); 500 and above
/// it is transient (rolled back, the retry runs).
///
/// ```
/// use idem_runtime::{ErrorStatus, Problem};
/// let declined = Problem::new(402, "card declined");
/// assert_eq!(declined.status(), 402);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{title} ({status})")]
pub struct Problem {
    /// The status.
    pub status: u16,
    /// A short, human-readable summary.
    pub title: String,
    /// What happened and what the client can do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Problem {
    /// A problem with a status and title.
    pub fn new(status: u16, title: impl Into<String>) -> Self {
        Self {
            status,
            title: title.into(),
            detail: None,
        }
    }

    /// Adds a detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

// Not listed in "the trait is implemented for" hints, which would quote this
// line in users' compile errors; the `ErrorStatus` note names `Problem`.
#[diagnostic::do_not_recommend]
impl ErrorStatus for Problem {
    fn status(&self) -> u16 {
        self.status
    }
}

impl From<sqlx::Error> for Problem {
    /// A database error during the work is transient: 503, rolled back.
    fn from(error: sqlx::Error) -> Self {
        Problem::new(503, "database unavailable").with_detail(error.to_string())
    }
}
