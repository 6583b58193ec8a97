//! Step names and the keys derived from them.
//!
//! A step name is a contract between a service and everything downstream of
//! it: `name.vN`, where `name` is lowercase ASCII letters, digits and dashes
//! (starting with a letter) and `N` a version number without leading zeros.
//! Renaming a step during the retry window changes every child key derived
//! from it, so names are versioned constants, never labels.

use sha2::{Digest, Sha256};

use crate::key::IdempotencyKey;

/// Why a string is not a valid step name.
///
/// ```
/// use idem_core::{check_step_name, StepNameError};
/// assert_eq!(check_step_name("charge-card"), Err(StepNameError::MissingVersion));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StepNameError {
    /// The name was empty.
    #[error("step name is empty; use the form `name.vN`, e.g. `charge-card.v1`")]
    Empty,
    /// The name had no `.vN` version suffix.
    #[error("step name has no version; end it with `.v1`, `.v2`, ..., e.g. `charge-card.v1`")]
    MissingVersion,
    /// The version after `.v` was not a number without leading zeros.
    #[error(
        "step version must be a number without leading zeros after `.v`, e.g. `charge-card.v2`"
    )]
    BadVersion,
    /// The name part broke the character rules.
    #[error("step name must start with a lowercase letter and hold only lowercase letters, digits and dashes before `.vN`, e.g. `charge-card.v1`")]
    BadName,
}

/// Checks that `name` has the form `name.vN`. Usable in `const` context, which
/// is how the macros check step names at compile time.
///
/// ```
/// use idem_core::check_step_name;
/// assert!(check_step_name("charge-card.v1").is_ok());
/// assert!(check_step_name("charge-card").is_err());
/// assert!(check_step_name("Charge.v1").is_err());
/// assert!(check_step_name("charge.v01").is_err());
/// ```
pub const fn check_step_name(name: &str) -> Result<(), StepNameError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(StepNameError::Empty);
    }
    // Find the last ".v".
    let mut dot = bytes.len();
    let mut i = bytes.len();
    while i >= 2 {
        if bytes[i - 2] == b'.' && bytes[i - 1] == b'v' {
            dot = i - 2;
            break;
        }
        i -= 1;
    }
    if dot == bytes.len() {
        return Err(StepNameError::MissingVersion);
    }
    let version_start = dot + 2;
    if version_start == bytes.len() {
        return Err(StepNameError::BadVersion);
    }
    if bytes[version_start] == b'0' {
        return Err(StepNameError::BadVersion);
    }
    let mut j = version_start;
    while j < bytes.len() {
        if !bytes[j].is_ascii_digit() {
            return Err(StepNameError::BadVersion);
        }
        j += 1;
    }
    if dot == 0 || !bytes[0].is_ascii_lowercase() {
        return Err(StepNameError::BadName);
    }
    let mut k = 0;
    while k < dot {
        let b = bytes[k];
        if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return Err(StepNameError::BadName);
        }
        k += 1;
    }
    Ok(())
}

/// The key a downstream call uses: `hex(sha256(parent + ":" + step))`.
///
/// The same parent key and step always give the same child key, so a retried
/// parent sends identical keys downstream and each service dedupes in its own
/// store.
///
/// ```
/// use idem_core::child_key;
/// let key = child_key("3f6c1a2e-8b4d-4e7a-9c11-5d2f0b7e6a90", "charge-card.v1");
/// assert_eq!(key.len(), 64);
/// assert_eq!(key, child_key("3f6c1a2e-8b4d-4e7a-9c11-5d2f0b7e6a90", "charge-card.v1"));
/// ```
pub fn child_key(parent: &str, step: &str) -> String {
    let mut sha = Sha256::new();
    sha.update(parent.as_bytes());
    sha.update(b":");
    sha.update(step.as_bytes());
    crate::hex::encode(&sha.finalize())
}

/// A declared step: a versioned name, usable as `#[idempotent(step = CONST)]`
/// and for derived keys. Build it with the `steps!` macro, which checks the
/// name at compile time and registers the declaration.
///
/// ```
/// use idem_core::Step;
/// const CHARGE: Step = Step::new("charge-card.v1");
/// assert_eq!(CHARGE.name(), "charge-card.v1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    name: &'static str,
}

impl Step {
    /// A step named `name`. Panics (at compile time, in a `const`) unless the
    /// name has the form `name.vN`.
    ///
    /// ```
    /// use idem_core::Step;
    /// const CHARGE: Step = Step::new("charge-card.v1");
    /// ```
    ///
    /// ```compile_fail
    /// use idem_core::Step;
    /// const BAD: Step = Step::new("Charge Card");
    /// ```
    pub const fn new(name: &'static str) -> Self {
        if check_step_name(name).is_err() {
            panic!("step names have the form `name.vN`: lowercase letters, digits and dashes, then `.v` and a version, e.g. `charge-card.v1`");
        }
        Self { name }
    }

    /// The step's name.
    ///
    /// ```
    /// use idem_core::Step;
    /// assert_eq!(Step::new("send-receipt.v2").name(), "send-receipt.v2");
    /// ```
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl IdempotencyKey {
    /// The key for a downstream call made as `step` on behalf of this key:
    /// [`child_key`]`(self, step)`. Only declared [`Step`]s are accepted, so a
    /// derived key can never come from an ad-hoc string that a later rename
    /// would silently change.
    ///
    /// ```
    /// use idem_core::{child_key, IdempotencyKey, Step};
    /// const SEND_RECEIPT: Step = Step::new("send-receipt.v1");
    /// let key = IdempotencyKey::new("order-8812").unwrap();
    /// assert_eq!(key.child(SEND_RECEIPT).as_str(), child_key("order-8812", "send-receipt.v1"));
    /// ```
    pub fn child(&self, step: Step) -> IdempotencyKey {
        // 64 lowercase hex digits: always a valid key.
        IdempotencyKey::new(child_key(self.as_str(), step.name()))
            .expect("a child key is 64 hex digits")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guide's example key, hashed with Python's
    /// `hashlib.sha256(f"{parent}:{step}".encode()).hexdigest()`.
    #[test]
    fn matches_the_guides_python_reference() {
        let parent = "3f6c1a2e-8b4d-4e7a-9c11-5d2f0b7e6a90";
        assert_eq!(
            child_key(parent, "charge-card.v1"),
            "957cd1ac2ce0b1fcfb0b878166ea50a28cd21fada14c5b4473a1fa8fb23ac914"
        );
    }

    #[test]
    fn step_names() {
        for ok in ["charge-card.v1", "a.v1", "send-confirmation.v12", "x9.v3"] {
            assert_eq!(check_step_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(check_step_name(""), Err(StepNameError::Empty));
        assert_eq!(
            check_step_name("charge"),
            Err(StepNameError::MissingVersion)
        );
        assert_eq!(check_step_name("charge.v"), Err(StepNameError::BadVersion));
        assert_eq!(check_step_name("charge.v0"), Err(StepNameError::BadVersion));
        assert_eq!(
            check_step_name("charge.v1a"),
            Err(StepNameError::BadVersion)
        );
        assert_eq!(check_step_name("Charge.v1"), Err(StepNameError::BadName));
        assert_eq!(
            check_step_name("charge_card.v1"),
            Err(StepNameError::BadName)
        );
        assert_eq!(check_step_name(".v1"), Err(StepNameError::BadName));
        assert_eq!(check_step_name("1charge.v1"), Err(StepNameError::BadName));
    }
}
