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
