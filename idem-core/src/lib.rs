//! What an idem client and an idem service share, without a database or an
//! async runtime:
//!
//! - [`IdempotencyKey`] and [`KeyError`]: the key a client mints once per
//!   logical operation and sends on every attempt.
//! - [`Step`], [`child_key`] and [`check_step_name`]: versioned step names and
//!   the keys derived from them for downstream calls.
//! - [`header`]: the names of the headers idem reads and writes.
//! - [`problem`]: the RFC 9457 problem `type` URIs idem answers with, and
//!   their media type.
//! - `extract` (feature `axum`): the `Idempotency-Key` header's parser and
//!   the axum extractor for [`IdempotencyKey`].
//!
//! idem-runtime re-exports all of it at its own paths
//! (`idem_runtime::IdempotencyKey`, `idem_runtime::http::problem::types`, …);
//! a client such as idem-client depends on this crate alone.
//!
//! ```
//! use idem_core::{child_key, header, problem::types, IdempotencyKey, Step};
//!
//! const CHARGE: Step = Step::new("charge-card.v1");
//! let key = IdempotencyKey::random();
//! assert_eq!(key.child(CHARGE).as_str(), child_key(key.as_str(), "charge-card.v1"));
//! assert_eq!(header::IDEMPOTENCY_KEY, "idempotency-key");
//! assert!(types::IN_PROGRESS.ends_with("#request-in-progress"));
//! ```

#[doc(hidden)]
pub mod __private;
#[cfg(feature = "axum")]
pub mod extract;
pub mod header;
mod hex;
mod key;
pub mod problem;
mod step;

pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use step::{check_step_name, child_key, Step, StepNameError};
