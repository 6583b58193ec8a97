//! Why an outbox operation failed, and what a handler answers for it.

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The message is incomplete or out of bounds; nothing was written.
    #[error("invalid outbox message: {0}")]
    Invalid(String),
    /// Another operation (a different scope, parent key or step) already
    /// enqueued a message with this id; nothing was written. Two scopes
    /// sharing an idempotency key derive the same ids: keys must be unique
    /// (a UUID) for the outbox to tell their messages apart.
    #[error("outbox message id {id} is taken by step {step} in scope {scope:?}")]
    IdTaken {
        /// The id.
        id: String,
        /// The scope that holds it.
        scope: String,
        /// The step that holds it.
        step: String,
    },
    /// The database refused.
    #[error("outbox store error: {0}")]
    Store(#[from] sqlx::Error),
}

impl From<OutboxError> for crate::Problem {
    /// An invalid message is a bug in the handler (500); a store error is
    /// transient (503). Either way the claim's transaction rolls back.
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Invalid(detail) => crate::Problem::new(500, "Invalid outbox message")
                .with_detail(crate::problem::sentence(&detail)),
            error @ OutboxError::IdTaken { .. } => {
                crate::Problem::new(500, "Outbox message id taken")
                    .with_detail(crate::problem::sentence(&error.to_string()))
            }
            OutboxError::Store(error) => error.into(),
        }
    }
}
