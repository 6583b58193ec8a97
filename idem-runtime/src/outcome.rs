//! What an operation returns, and which of it is stored for replay.
//!
//! Successes and deterministic client errors are stored and replayed; server
//! errors, panics, timeouts and cancelled futures leave nothing behind.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The stored form of an outcome: what a replay hands back, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// An HTTP-style status: below 400 a success, 400-499 a deterministic client error.
    pub status: u16,
    /// The body's media type, e.g. `application/json`.
    pub content_type: String,
    /// The body bytes.
    pub body: Vec<u8>,
    /// Response headers replayed with the body, as `(lower-case name, value)`
    /// pairs in the order they were sent; never `Content-Type` (kept in
    /// [`StoredResponse::content_type`]), `Content-Length` or hop-by-hop
    /// headers. Empty for outcomes that are not HTTP responses.
    pub headers: Vec<(String, String)>,
}

impl StoredResponse {
    /// Whether a response with this status is stored: anything below 500.
    ///
    /// ```
    /// use idem_runtime::StoredResponse;
    /// assert!(StoredResponse::is_storable_status(201));
    /// assert!(StoredResponse::is_storable_status(422));
    /// assert!(!StoredResponse::is_storable_status(503));
    /// ```
    pub fn is_storable_status(status: u16) -> bool {
        status < 500
    }
}

/// Why a stored response could not be turned back into an outcome.
#[derive(Debug, thiserror::Error)]
#[error("stored response (status {status}) could not be decoded: {source}")]
pub struct ReplayError {
    /// The stored status.
    pub status: u16,
    /// The decoding error.
    #[source]
    pub source: serde_json::Error,
}

/// A value an idempotent operation returns: it knows whether it is kept and
/// how to come back from storage.
///
/// Implemented for `Result<T, E>` with a serializable `T` and an [`ErrorStatus`]
/// `E`, and for [`StoredResponse`] itself (for HTTP layers that store rendered
/// responses).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored as an idempotent outcome",
    label = "not storable: return `Result<T, E>`",
    note = "an idempotent operation returns `Result<T, E>` where `T: Serialize + DeserializeOwned` (stored and replayed as JSON) and `E: ErrorStatus` (deterministic errors are stored, transient ones roll back)"
)]
pub trait Outcome: Sized {
    /// What to store with the business writes before committing, or `None`
    /// to roll everything back (nothing is stored, a retry executes again).
    /// Called once, after the work ran.
    fn to_stored(&self) -> Option<StoredResponse>;
    /// Rebuilds the outcome for a replay.
    fn from_stored(stored: StoredResponse) -> Result<Self, ReplayError>;
}

/// An error an idempotent operation may return.
///
/// `status()` below 500 means deterministic (validation failed, card declined):
/// retrying would give the same answer, so it is stored and replayed. 500 and
/// above means transient: the transaction rolls back and the retry runs.
///
/// ```
/// use idem_runtime::ErrorStatus;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// enum ChargeError { Declined, DatabaseDown }
///
/// impl ErrorStatus for ChargeError {
///     fn status(&self) -> u16 {
///         match self { ChargeError::Declined => 402, ChargeError::DatabaseDown => 503 }
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of an idempotent operation: it does not implement `ErrorStatus`",
    label = "`{Self}` does not implement `ErrorStatus`",
    note = "implement `idem::ErrorStatus` for `{Self}` (its `status()` decides: below 500 the error is stored and replayed, 500 and above rolls back; it also needs `Serialize` and `Deserialize`), or return `idem::Problem`"
)]
pub trait ErrorStatus: Serialize + DeserializeOwned {
    /// The HTTP-style status of this error.
    fn status(&self) -> u16;
}

/// The status a stored success carries.
pub const SUCCESS_STATUS: u16 = 200;
const JSON: &str = "application/json";

impl<T, E> Outcome for Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: ErrorStatus,
{
    fn to_stored(&self) -> Option<StoredResponse> {
        let (status, body) = match self {
            Ok(value) => (SUCCESS_STATUS, serde_json::to_vec(value)),
            Err(error) if StoredResponse::is_storable_status(error.status()) => {
                (error.status(), serde_json::to_vec(error))
            }
            Err(_) => return None,
        };
        match body {
            Ok(body) => Some(StoredResponse {
                status,
                content_type: JSON.to_owned(),
                body,
                headers: Vec::new(),
            }),
            Err(error) => {
                tracing::error!(%error, "outcome could not be serialized; rolling back");
                None
            }
        }
    }

    fn from_stored(stored: StoredResponse) -> Result<Self, ReplayError> {
        let decoded = if stored.status < 400 {
            serde_json::from_slice(&stored.body).map(Ok)
        } else {
            serde_json::from_slice(&stored.body).map(Err)
        };
        decoded.map_err(|source| ReplayError {
            status: stored.status,
            source,
        })
    }
}

impl Outcome for StoredResponse {
    fn to_stored(&self) -> Option<StoredResponse> {
        Self::is_storable_status(self.status).then(|| self.clone())
    }

    fn from_stored(stored: StoredResponse) -> Result<Self, ReplayError> {
        Ok(stored)
    }
}
