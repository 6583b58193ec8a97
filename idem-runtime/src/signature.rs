//! Webhook signatures per the [Standard Webhooks] specification.
//!
//! The signed content is `"{webhook-id}.{webhook-timestamp}.{body}"`, signed
//! with HMAC-SHA256 under the secret, and sent base64-encoded as
//! `webhook-signature: v1,<signature>` (several space-separated signatures
//! are allowed, so a secret can be rotated). Secrets are written
//! `whsec_<base64>`; the bytes after the prefix are the key.
//!
//! [Standard Webhooks]: https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the message id.
pub const ID_HEADER: &str = "webhook-id";
/// The header carrying the signing time, in seconds since the Unix epoch.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header carrying the signatures.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// A webhook signing secret.
///
/// ```
/// use idem_runtime::signature::{SigningSecret, SignatureError};
///
/// let secret = SigningSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
/// let signature = secret.sign("msg_1", 1_700_000_000, b"{}");
/// assert!(secret.verify("msg_1", 1_700_000_000, b"{}", &signature, 1_700_000_010).is_ok());
/// assert_eq!(
///     secret.verify("msg_1", 1_700_000_000, b"{ }", &signature, 1_700_000_010),
///     Err(SignatureError::Mismatch)
/// );
/// ```
#[derive(Clone)]
pub struct SigningSecret(Vec<u8>);

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The secret is not `whsec_` followed by base64.
    #[error("webhook secret is not `whsec_` followed by base64")]
    MalformedSecret,
    /// A required header is missing or not valid text.
    #[error("webhook header `{0}` is missing or malformed")]
    MissingHeader(&'static str),
    /// The timestamp is further from now than the tolerance allows.
    #[error("webhook timestamp is outside the tolerance of {tolerance_secs} seconds")]
    Stale {
        /// The tolerance, in seconds.
        tolerance_secs: i64,
    },
    /// No `v1` signature matches the content.
    #[error("no webhook signature matches the message")]
    Mismatch,
}

/// How far a timestamp may be from the receiver's clock, in seconds (the
/// specification's recommended five minutes).
pub const TOLERANCE_SECS: i64 = 5 * 60;

impl SigningSecret {
    /// Parses a `whsec_<base64>` secret (the prefix is optional).
    pub fn new(secret: &str) -> Result<Self, SignatureError> {
        let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
        let bytes = STANDARD
            .decode(encoded)
            .map_err(|_| SignatureError::MalformedSecret)?;
        if bytes.is_empty() {
            return Err(SignatureError::MalformedSecret);
        }
        Ok(Self(bytes))
    }

    /// A secret from raw key bytes.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The `webhook-signature` header value for a message: `v1,<base64>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mac = self.mac(id, timestamp, body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }

    /// Checks a `webhook-signature` header value against the message, and the
    /// timestamp against `now` (seconds since the epoch) within
    /// [`TOLERANCE_SECS`]. The comparison is constant-time.
    pub fn verify(
        &self,
        id: &str,
        timestamp: i64,
        body: &[u8],
        signatures: &str,
        now: i64,
    ) -> Result<(), SignatureError> {
        if (now - timestamp).abs() > TOLERANCE_SECS {
            return Err(SignatureError::Stale {
                tolerance_secs: TOLERANCE_SECS,
            });
        }
        let matches = signatures
            .split(' ')
            .filter_map(|entry| entry.strip_prefix("v1,"))
            .filter_map(|encoded| STANDARD.decode(encoded).ok())
            .any(|candidate| {
                self.mac(id, timestamp, body)
                    .verify_slice(&candidate)
                    .is_ok()
            });
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// Seconds since the Unix epoch, for signing and verifying.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs() as i64)
        .unwrap_or(0)
}
