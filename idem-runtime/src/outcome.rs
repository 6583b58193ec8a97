//! What an operation returns, and which of it is stored for replay.
//!
//! Successes and deterministic client errors are stored and replayed (see
//! [`StoredStatuses`]); 401, 403, 408, 425 and 429, server errors, panics, timeouts and cancelled futures leave nothing behind.

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
    /// Whether a response with this status is stored by default: below 500,
    /// except the 4xx in [`StoredStatuses::NOT_STORED_BY_DEFAULT`], which say
    /// nothing lasting about the request.
    ///
    /// ```
    /// use idem_runtime::StoredResponse;
    /// assert!(StoredResponse::is_storable_status(201));
    /// assert!(StoredResponse::is_storable_status(422));
    /// assert!(!StoredResponse::is_storable_status(429));
    /// assert!(!StoredResponse::is_storable_status(503));
    /// ```
    pub fn is_storable_status(status: u16) -> bool {
        StoredStatuses::DEFAULT.stores(status)
    }
}

/// Which statuses are stored and replayed; the others roll back like a 5xx,
/// so the retry runs again.
///
/// | status | stored by default | why |
/// |---|---|---|
/// | 1xx-3xx | yes | the operation's answer |
/// | 400, 404, 409, 422 and the other 4xx | yes | the same request gets the same answer |
/// | 401, 403 | no | credentials or permissions, which the client may fix |
/// | 408 | no | the request was not received in time |
/// | 425 | no | too early: the server asks for a retry |
/// | 429 | no | rate limited: the retry should run |
/// | 5xx | never | transient; cannot be made stored |
///
/// `#[idempotent(http, store = [401], never_store = [404])]` changes the set
/// for one handler (a 404 that replica lag can cause, say).
///
/// ```
/// use idem_runtime::StoredStatuses;
/// assert!(StoredStatuses::DEFAULT.stores(404));
/// assert!(!StoredStatuses::DEFAULT.stores(401));
/// let custom = StoredStatuses::new(&[401], &[404]);
/// assert!(custom.stores(401));
/// assert!(!custom.stores(404));
/// assert!(!StoredStatuses::new(&[503], &[]).stores(503));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredStatuses {
    also: &'static [u16],
    never: &'static [u16],
}

impl StoredStatuses {
    /// The 4xx that are not stored unless named with [`StoredStatuses::new`].
    pub const NOT_STORED_BY_DEFAULT: &'static [u16] = &[401, 403, 408, 425, 429];

    /// The default set (see the table above).
    pub const DEFAULT: Self = Self {
        also: &[],
        never: &[],
    };

    /// The default set, plus the 4xx in `also` and minus the statuses in
    /// `never`. Statuses of 500 and above are never stored.
    pub const fn new(also: &'static [u16], never: &'static [u16]) -> Self {
        Self { also, never }
    }

    /// Whether a response with `status` is stored.
    pub fn stores(&self, status: u16) -> bool {
        status < 500
            && !self.never.contains(&status)
            && (self.also.contains(&status) || !Self::NOT_STORED_BY_DEFAULT.contains(&status))
    }
}

impl Default for StoredStatuses {
    fn default() -> Self {
        Self::DEFAULT
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
    /// Whether the work failed because its transaction lost to a concurrent
    /// one, so that running it again may succeed (see
    /// [`crate::Engine::run_repeatable`]). Default `false`.
    fn is_conflict(&self) -> bool {
        false
    }
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

    /// Whether this error says the work's transaction lost to a concurrent
    /// one (a serialization failure or a deadlock, see
    /// [`crate::is_conflict`]): [`crate::Engine::run_repeatable`] then runs
    /// the claim and the work again. Default `false`; [`crate::Problem`]
    /// answers for its `transaction-conflict` type.
    fn is_conflict(&self) -> bool {
        false
    }
}

/// The status a stored success carries.
pub(crate) const SUCCESS_STATUS: u16 = 200;
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

    fn is_conflict(&self) -> bool {
        matches!(self, Err(error) if error.is_conflict())
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
