//! The runtime behind [idem](https://docs.rs/idem): retried requests made safe.
//!
//! Usable on its own, without the macros:
//!
//! - [`IdempotencyKey`], [`Scope`]: who asks, with which key.
//! - [`Fingerprint`] and [`fingerprint()`]: a canonical SHA-256 of the request.
//! - [`Engine`]: claim, run the work in the claim's transaction, store the
//!   outcome in the same transaction, commit; or replay, or refuse.
//! - [`child_key`]: deterministic keys for downstream calls.
//!
//! The engine implements this state table for the record of `(scope, key)`:
//!
//! | found | fingerprint | lock | outcome |
//! |---|---|---|---|
//! | nothing | – | – | execute; business writes and the completed record commit together |
//! | completed, not expired | same | – | replay the stored outcome unchanged |
//! | completed or in progress | different | any | [`IdemError::Mismatch`] (422) |
//! | in progress | same | live | [`IdemError::InProgress`] (409, seconds left on the lock) |
//! | in progress | same | expired | take over and execute |
//! | expired, not yet purged | any | – | treated as absent |

// Without a backend the store's shared code has no caller; the key types
// (`IdempotencyKey`, `child_key`, `Step`) are all a client needs.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

#[doc(hidden)]
pub mod __private;
pub mod admin;
mod batch;
mod engine;
mod error;
pub mod faults;
pub mod fingerprint;
#[cfg(feature = "tonic")]
pub mod grpc;
#[cfg(feature = "axum")]
pub mod http;
pub mod inbox;
pub mod metrics;
pub mod migrations;
mod operation;
pub mod outbox;
mod outcome;
mod policy;
mod problem;
pub mod registry;
mod replay_cache;
mod retention;
mod scope;
pub mod shard;
pub mod signature;
pub mod store;
#[cfg(feature = "axum")]
pub mod tower;

pub use engine::{Answer, Claim, ClaimGuard, Engine, Replay, Stats, Via};
pub use error::{is_conflict, IdemError};
pub use fingerprint::{fingerprint, Fingerprint, FingerprintHasher, Label, RequestHash};
// The key and step types live in idem-core, which idem-client shares.
pub use idem_core::{check_step_name, child_key, Step, StepNameError};
pub use idem_core::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use operation::Operation;
pub use outcome::{ErrorStatus, Outcome, ReplayError, StoredResponse, StoredStatuses};
pub use policy::{ClaimMode, FailureMode, GroupCommit, Policy};
pub use problem::{Problem, ABOUT_BLANK};
pub use replay_cache::ReplayCache;
pub use retention::Purger;
pub use scope::{Scope, ScopePart};
pub use shard::Engines;
#[cfg(feature = "postgres")]
pub use store::postgres::{KeyLock, Pooler, Server, WaitBound};
pub use store::Backend;

pub use sqlx;

// Lowercase hex for digests, shared with idem-core.
use idem_core::__private::hex;
