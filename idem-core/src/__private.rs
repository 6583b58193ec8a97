//! Helpers idem-runtime shares with this crate. Not part of the API: they
//! may change in any release.

/// Lowercase hex for digests.
pub mod hex {
    pub use crate::hex::{decode, encode};
}
pub use crate::problem::sentence;
