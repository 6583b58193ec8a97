//! The `idem-macro` scenario: the same business insert through an
//! `#[idempotent]` handler. The macros are not on `main` yet; until they are,
//! this scenario is not run (and never stands in for the engine path).

use std::sync::Arc;

use idem_runtime::{IdemError, Via};

use crate::target::{BoxFut, Target};

/// Whether the `#[idempotent]` macro is available to this build.
pub const AVAILABLE: bool = false;

/// Runs one keyed operation through the macro-generated handler.
pub fn run(_target: &Arc<dyn Target>, _key: String) -> BoxFut<Result<Via, IdemError>> {
    Box::pin(async { Err(IdemError::Mismatch) })
}
