//! The names of the headers idem reads and writes, lowercase as HTTP/2 sends
//! them (header names are case-insensitive).
//!
//! ```
//! use idem_core::header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
//!
//! assert!(IDEMPOTENCY_KEY.eq_ignore_ascii_case("Idempotency-Key"));
//! assert!(IDEMPOTENT_REPLAYED.eq_ignore_ascii_case("Idempotent-Replayed"));
//! ```

/// The request header the key is sent in: `Idempotency-Key: "<key>"`.
///
/// ```
/// assert_eq!(idem_core::header::IDEMPOTENCY_KEY, "idempotency-key");
/// ```
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header a replayed answer carries: `Idempotent-Replayed: true`.
///
/// ```
/// assert_eq!(idem_core::header::IDEMPOTENT_REPLAYED, "idempotent-replayed");
/// ```
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The gRPC response metadata entry that tells a client how long to wait
/// before its next attempt, in milliseconds (gRFC A6's retry pushback).
/// idem sets it on an in-progress `ABORTED` (the lock's time left) and on an
/// `UNAVAILABLE` store; a negative value means "do not retry".
///
/// ```
/// assert_eq!(idem_core::header::GRPC_RETRY_PUSHBACK_MS, "grpc-retry-pushback-ms");
/// ```
pub const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// The gRPC response metadata entry that names which of idem's answers a
/// status is: the problem type URI the HTTP answer carries in its body
/// ([`crate::problem::types`]). A client tells idem's in-progress `ABORTED`
/// (retry with the same key) from any other `ABORTED` by it.
///
/// ```
/// assert_eq!(idem_core::header::IDEMPOTENCY_PROBLEM, "idempotency-problem");
/// ```
pub const IDEMPOTENCY_PROBLEM: &str = "idempotency-problem";
