//! The idempotency key a client sends with every attempt of one logical operation.

use std::fmt;
use std::str::FromStr;

/// The longest key accepted, in bytes.
///
/// ```
/// use idem_core::{IdempotencyKey, MAX_KEY_LEN};
/// assert!(IdempotencyKey::new("k".repeat(MAX_KEY_LEN)).is_ok());
/// assert!(IdempotencyKey::new("k".repeat(MAX_KEY_LEN + 1)).is_err());
/// ```
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 visible ASCII characters (`'!'..='~'`).
///
/// Keys name one logical operation, not one attempt: the client mints a key
/// (typically a UUID) before the first attempt and sends it on every retry.
///
/// ```
/// use idem_core::IdempotencyKey;
///
/// let key = IdempotencyKey::new("3f6c1a2e-8b4d-4e7a-9c11-5d2f0b7e6a90").unwrap();
/// assert_eq!(key.as_str().len(), 36);
/// assert!(IdempotencyKey::new("").is_err());
/// assert!(IdempotencyKey::new("has space").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

/// Why a string is not a valid [`IdempotencyKey`].
///
/// ```
/// use idem_core::{IdempotencyKey, KeyError};
/// assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
/// assert_eq!(
///     IdempotencyKey::new("has space"),
///     Err(KeyError::InvalidCharacter { position: 3, what: "a space" })
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key was empty.
    #[error("idempotency key is empty; send 1 to 255 visible ASCII characters, e.g. a UUID")]
    Empty,
    /// The key was longer than [`MAX_KEY_LEN`] bytes.
    #[error("idempotency key is {len} bytes long; at most 255 are allowed")]
    TooLong {
        /// The length that was sent.
        len: usize,
    },
    /// The key held a character outside visible ASCII.
    #[error("idempotency key has {what} at byte {position}; only visible ASCII characters ('!' to '~') are allowed")]
    InvalidCharacter {
        /// Byte offset of the first offending character.
        position: usize,
        /// A description of the offending character.
        what: &'static str,
    },
}

impl IdempotencyKey {
    /// Validates `key` and wraps it.
    ///
    /// ```
    /// # use idem_core::{IdempotencyKey, KeyError};
    /// assert_eq!(IdempotencyKey::new("a".repeat(256)), Err(KeyError::TooLong { len: 256 }));
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        validate(&key)?;
        Ok(Self(key))
    }

    /// A fresh key for a new logical operation: a random (v4) UUID in its
    /// hyphenated form. Mint it once, before the first attempt, store it with
    /// the pending work, and send the same key on every retry.
    ///
    /// ```
    /// use idem_core::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::random();
    /// assert_eq!(key.as_str().len(), 36);
    /// assert_ne!(key, IdempotencyKey::random());
    /// ```
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().hyphenated().to_string())
    }

    /// The key as sent by the client.
    ///
    /// ```
    /// # use idem_core::IdempotencyKey;
    /// assert_eq!(IdempotencyKey::new("order-8812").unwrap().as_str(), "order-8812");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short, non-reversible tag for logs: the first 12 hex digits of the key's SHA-256.
    /// Raw keys are bearer-like secrets and never belong in logs.
    ///
    /// ```
    /// # use idem_core::IdempotencyKey;
    /// let key = IdempotencyKey::new("order-8812").unwrap();
    /// assert_eq!(key.log_tag().len(), 12);
    /// ```
    pub fn log_tag(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.0.as_bytes());
        crate::hex::encode(&digest[..6])
    }
}

fn validate(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    if let Some((position, byte)) = key
        .bytes()
        .enumerate()
        .find(|(_, b)| !(b'!'..=b'~').contains(b))
    {
        let what = match byte {
            b' ' => "a space",
            0..=0x1f | 0x7f => "a control character",
            _ => "a non-ASCII character",
        };
        return Err(KeyError::InvalidCharacter { position, what });
    }
    Ok(())
}

impl FromStr for IdempotencyKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = KeyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Debug shows only the log tag, so a key never leaks through `{:?}` in logs.
impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(#{})", self.log_tag())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_the_rule_that_failed() {
        assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::new("x".repeat(300)),
            Err(KeyError::TooLong { len: 300 })
        );
        assert_eq!(
            IdempotencyKey::new("ab\ncd"),
            Err(KeyError::InvalidCharacter {
                position: 2,
                what: "a control character"
            })
        );
        assert_eq!(
            IdempotencyKey::new("é"),
            Err(KeyError::InvalidCharacter {
                position: 0,
                what: "a non-ASCII character"
            })
        );
        assert!(IdempotencyKey::new("x".repeat(255)).is_ok());
    }

    proptest! {
        #[test]
        fn accepts_every_visible_ascii_string(key in "[!-~]{1,255}") {
            let parsed = IdempotencyKey::new(key.clone()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn accepts_exactly_the_valid_strings(key in any::<String>()) {
            let valid = !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| (b'!'..=b'~').contains(&b));
            prop_assert_eq!(IdempotencyKey::new(key).is_ok(), valid);
        }

        #[test]
        fn rejects_any_string_with_a_non_visible_byte(prefix in "[!-~]{0,20}", bad in "[\\x00-\\x20\\x7f\\u{80}-\\u{10ffff}]", suffix in "[!-~]{0,20}") {
            let key = format!("{prefix}{bad}{suffix}");
            let rejected = matches!(IdempotencyKey::new(key), Err(KeyError::InvalidCharacter { .. }));
            prop_assert!(rejected);
        }
    }
}
