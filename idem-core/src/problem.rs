//! RFC 9457 problem details: their media type and the `type` URIs idem
//! answers with. A client matches on these; idem-runtime's `Problem` renders
//! them.
//!
//! ```
//! use idem_core::problem::{types, PROBLEM_JSON};
//!
//! // How a client recognises idem's in-progress 409.
//! fn in_progress(content_type: &str, problem_type: &str) -> bool {
//!     content_type.starts_with(PROBLEM_JSON) && problem_type == types::IN_PROGRESS
//! }
//! assert!(in_progress("application/problem+json", types::IN_PROGRESS));
//! assert!(!in_progress("application/problem+json", types::KEY_REUSED));
//! ```

/// A problem `type` URI: the section `anchor` of `docs/PROBLEMS.md` in the
/// repository named by the calling crate's `Cargo.toml` (idem's workspace
/// names one repository for all its crates).
#[doc(hidden)]
#[macro_export]
macro_rules! __problem_type {
    ($anchor:literal) => {
        concat!(
            env!("CARGO_PKG_REPOSITORY"),
            "/blob/main/docs/PROBLEMS.md#",
            $anchor
        )
    };
}

/// The media type of a problem body.
///
/// ```
/// assert_eq!(idem_core::problem::PROBLEM_JSON, "application/problem+json");
/// ```
pub const PROBLEM_JSON: &str = "application/problem+json";

/// RFC 9457's default type: the status code says it all.
///
/// ```
/// assert_eq!(idem_core::problem::ABOUT_BLANK, "about:blank");
/// ```
pub const ABOUT_BLANK: &str = "about:blank";

/// The `type` of each problem idem itself answers with: each names its
/// section of
/// [PROBLEMS.md](https://github.com/idem-rs/idem/blob/main/docs/PROBLEMS.md)
/// in idem's repository, which says when it happens and what a client should
/// do. The URIs are stable: a client may match on them.
///
/// ```
/// use idem_core::problem::types;
/// assert_eq!(
///     types::KEY_REUSED,
///     "https://github.com/idem-rs/idem/blob/main/docs/PROBLEMS.md#idempotency-key-reused"
/// );
/// ```
pub mod types {
    /// No `Idempotency-Key` header where the route requires one (400).
    ///
    /// ```
    /// assert!(idem_core::problem::types::KEY_MISSING.ends_with("#idempotency-key-missing"));
    /// ```
    pub const KEY_MISSING: &str = crate::__problem_type!("idempotency-key-missing");
    /// An `Idempotency-Key` header that is not 1-255 visible ASCII characters (400).
    ///
    /// ```
    /// assert!(idem_core::problem::types::KEY_MALFORMED.ends_with("#idempotency-key-malformed"));
    /// ```
    pub const KEY_MALFORMED: &str = crate::__problem_type!("idempotency-key-malformed");
    /// The key was used before with a different request (422).
    ///
    /// ```
    /// assert!(idem_core::problem::types::KEY_REUSED.ends_with("#idempotency-key-reused"));
    /// ```
    pub const KEY_REUSED: &str = crate::__problem_type!("idempotency-key-reused");
    /// Another attempt with the key is still running (409).
    ///
    /// ```
    /// assert!(idem_core::problem::types::IN_PROGRESS.ends_with("#request-in-progress"));
    /// ```
    pub const IN_PROGRESS: &str = crate::__problem_type!("request-in-progress");
    /// The idempotency store is down and the service fails closed (503).
    ///
    /// ```
    /// assert!(idem_core::problem::types::STORE_UNAVAILABLE.ends_with("#store-unavailable"));
    /// ```
    pub const STORE_UNAVAILABLE: &str = crate::__problem_type!("store-unavailable");
    /// The store's single writer is busy with other keys' writes (503, SQLite).
    ///
    /// ```
    /// assert!(idem_core::problem::types::STORE_BUSY.ends_with("#store-busy"));
    /// ```
    pub const STORE_BUSY: &str = crate::__problem_type!("store-busy");
    /// The operation's transaction conflicted with a concurrent one (a
    /// serialization failure or a deadlock) and was rolled back (503).
    ///
    /// ```
    /// assert!(idem_core::problem::types::TRANSACTION_CONFLICT.ends_with("#transaction-conflict"));
    /// ```
    pub const TRANSACTION_CONFLICT: &str = crate::__problem_type!("transaction-conflict");
    /// The operation did not finish in time and was rolled back (504).
    ///
    /// ```
    /// assert!(idem_core::problem::types::TIMED_OUT.ends_with("#operation-timed-out"));
    /// ```
    pub const TIMED_OUT: &str = crate::__problem_type!("operation-timed-out");
    /// A stored response could not be replayed (500).
    ///
    /// ```
    /// assert!(idem_core::problem::types::REPLAY_FAILED.ends_with("#replay-failed"));
    /// ```
    pub const REPLAY_FAILED: &str = crate::__problem_type!("replay-failed");
    /// The body is not valid JSON for this route (400).
    ///
    /// ```
    /// assert!(idem_core::problem::types::MALFORMED_BODY.ends_with("#malformed-body"));
    /// ```
    pub const MALFORMED_BODY: &str = crate::__problem_type!("malformed-body");
    /// The body is larger than the route accepts (413).
    ///
    /// ```
    /// assert!(idem_core::problem::types::BODY_TOO_LARGE.ends_with("#body-too-large"));
    /// ```
    pub const BODY_TOO_LARGE: &str = crate::__problem_type!("body-too-large");
    /// The body was not sent as `application/json` (415).
    ///
    /// ```
    /// assert!(idem_core::problem::types::UNSUPPORTED_MEDIA_TYPE.ends_with("#unsupported-media-type"));
    /// ```
    pub const UNSUPPORTED_MEDIA_TYPE: &str = crate::__problem_type!("unsupported-media-type");
    /// RFC 9457's default: the status code says it all.
    ///
    /// ```
    /// assert_eq!(idem_core::problem::types::ABOUT_BLANK, "about:blank");
    /// ```
    pub const ABOUT_BLANK: &str = super::ABOUT_BLANK;
}

/// `text` as a problem detail: first letter capitalised, ending in a full
/// stop, whatever the error's own `Display` (lower case, by Rust's
/// convention) says.
///
/// ```
/// # use idem_core::__private::sentence;
/// assert_eq!(sentence("no such key; retry"), "No such key; retry.");
/// ```
pub fn sentence(text: &str) -> String {
    let mut chars = text.trim().chars();
    let mut out: String = match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => return String::new(),
    };
    if !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_sentences() {
        assert_eq!(sentence("no such key; retry"), "No such key; retry.");
        assert_eq!(sentence("Done."), "Done.");
        assert_eq!(sentence(""), "");
    }

    #[test]
    fn problem_types_name_sections_of_the_problems_page() {
        let page = include_str!("../../docs/PROBLEMS.md");
        for type_ in [
            types::KEY_MISSING,
            types::KEY_MALFORMED,
            types::KEY_REUSED,
            types::IN_PROGRESS,
            types::STORE_UNAVAILABLE,
            types::STORE_BUSY,
            types::TIMED_OUT,
            types::REPLAY_FAILED,
            types::MALFORMED_BODY,
            types::BODY_TOO_LARGE,
            types::UNSUPPORTED_MEDIA_TYPE,
        ] {
            let (page_url, anchor) = type_.split_once('#').expect("an anchor");
            assert_eq!(
                page_url,
                concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/docs/PROBLEMS.md")
            );
            assert!(
                page.contains(&format!("\n## {anchor}\n")),
                "no section {anchor}"
            );
        }
    }
}
