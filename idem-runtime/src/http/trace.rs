//! The per-request `tracing` span: scope, step, a short hash of the key, and the outcome.

pub use idem_core::extract::record_outcome;
use tracing::Span;

use crate::engine::Via;
use crate::error::IdemError;
use crate::operation::Operation;

/// Opens the span for one keyed request: `idem.request` with fields `scope`,
/// `step`, `key` (the key's [`log_tag`](crate::IdempotencyKey::log_tag), never
/// the raw key) and `outcome`, which [`respond`](super::respond) fills in with
/// `executed`, `replayed`, `took_over`, `mismatch`, `in_progress`, `rejected`
/// (or `failed_open`). Instrument the handler's future with it.
///
/// ```
/// use idem_runtime::{http, IdempotencyKey, Operation, Scope};
/// use tracing::Instrument;
///
/// # async fn demo() {
/// let op = Operation::new(Scope::tenant("acme"), IdempotencyKey::new("k-1").unwrap(), "charge-card.v1", &1i64);
/// async { /* claim, work, respond */ }.instrument(http::operation_span(&op)).await;
/// # }
/// ```
pub fn operation_span(op: &Operation) -> Span {
    tracing::info_span!(
        "idem.request",
        scope = %op.scope(),
        step = op.step(),
        key = %op.key().log_tag(),
        outcome = tracing::field::Empty,
    )
}

/// The outcome label of a result.
pub(crate) fn label(result: Result<Via, &IdemError>) -> &'static str {
    match result {
        Ok(via) => via.as_str(),
        Err(IdemError::Mismatch) => "mismatch",
        Err(IdemError::InProgress { .. }) => "in_progress",
        Err(_) => "rejected",
    }
}

pub(crate) fn record_rejected() {
    record_outcome("rejected");
}
