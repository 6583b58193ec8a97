//! RFC 9457 problem details: a ready-made error type for idempotent
//! operations, and the body of every error idem answers with over HTTP.

use serde::{Deserialize, Serialize};

use crate::outcome::ErrorStatus;

/// An RFC 9457 problem: a `type` URI, a short `title`, an HTTP-style
/// `status` and a `detail` that tells the client what to do. As the error of
/// an idempotent operation, below 500 it is deterministic (stored and
/// replayed); 500 and above it is transient (rolled back, the retry runs).
/// With the `axum` feature it renders as `application/problem+json`.
///
/// ```
/// use idem_runtime::{ErrorStatus, Problem};
/// let declined = Problem::new(402, "Card declined").with_detail("Use another card.");
/// assert_eq!(declined.status(), 402);
/// assert_eq!(declined.type_, "about:blank");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{title} ({status})")]
pub struct Problem {
    /// A URI naming the kind of problem; `about:blank` when the status says it all.
    #[serde(rename = "type", default = "about_blank")]
    pub type_: String,
    /// A short, human-readable summary of the kind of problem.
    pub title: String,
    /// The status.
    pub status: u16,
    /// What happened this time, and what the client can do about it; left
    /// out of the JSON when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

pub use idem_core::problem::ABOUT_BLANK;

fn about_blank() -> String {
    ABOUT_BLANK.to_owned()
}

impl Problem {
    /// A problem of type `about:blank` with a status and title and an empty detail.
    pub fn new(status: u16, title: impl Into<String>) -> Self {
        Self {
            type_: about_blank(),
            title: title.into(),
            status,
            detail: String::new(),
        }
    }

    /// Sets the type URI.
    pub fn with_type(mut self, type_: impl Into<String>) -> Self {
        self.type_ = type_.into();
        self
    }

    /// Sets the detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    /// The JSON body.
    pub fn to_body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a problem always serializes")
    }
}

pub(crate) use idem_core::__private::sentence;

// Not listed in "the trait is implemented for" hints, which would quote this
// line in users' compile errors; the `ErrorStatus` note names `Problem`.
#[diagnostic::do_not_recommend]
impl ErrorStatus for Problem {
    fn status(&self) -> u16 {
        self.status
    }

    fn is_conflict(&self) -> bool {
        self.type_ == idem_core::problem::types::TRANSACTION_CONFLICT
    }
}

impl From<sqlx::Error> for Problem {
    /// A database error during the work is transient: 503, rolled back. A
    /// serialization failure or a deadlock ([`crate::is_conflict`]) is the
    /// problem type `transaction-conflict` (over HTTP with `Retry-After`),
    /// which [`crate::Engine::run_repeatable`] answers by running the claim
    /// and the work again.
    ///
    /// ```
    /// use idem_runtime::{ErrorStatus, Problem};
    /// let problem = Problem::from(sqlx::Error::PoolTimedOut);
    /// assert_eq!(problem.status, 503);
    /// assert!(!problem.is_conflict());
    /// ```
    fn from(error: sqlx::Error) -> Self {
        if crate::error::is_conflict(&error) {
            return Problem::new(503, "Transaction conflict")
                .with_type(idem_core::problem::types::TRANSACTION_CONFLICT)
                .with_detail(
                    "The operation conflicted with a concurrent transaction and was rolled back; \
                     nothing was stored. Retry the same request with the same key.",
                );
        }
        Problem::new(503, "Database unavailable").with_detail(sentence(&error.to_string()))
    }
}

#[cfg(test)]
mod detail_tests {
    use super::Problem;

    #[test]
    fn an_empty_detail_is_left_out_and_reads_back_empty() {
        let json = serde_json::to_value(Problem::new(404, "Not found")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "about:blank", "title": "Not found", "status": 404})
        );
        let back: Problem = serde_json::from_value(json).unwrap();
        assert_eq!(back.detail, "");
        let with =
            serde_json::to_value(Problem::new(404, "Not found").with_detail("No such order."))
                .unwrap();
        assert_eq!(with["detail"], "No such order.");
    }
}
