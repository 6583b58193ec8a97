//! [`IdemError`] as a gRPC status, and which statuses a method stores.

use std::time::Duration;

use idem_core::header::{GRPC_RETRY_PUSHBACK_MS, IDEMPOTENCY_PROBLEM};
use idem_core::problem::types;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::error::IdemError;
use crate::http::record_outcome;

/// Which status codes a gRPC method stores and replays; the others roll the
/// work back, so the retry runs again.
///
/// | code | stored by default | why |
/// |---|---|---|
/// | `OK` | yes | the operation's answer |
/// | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE` | yes | deterministic: the same request gets the same answer |
/// | `PERMISSION_DENIED`, `UNAUTHENTICATED` | no | credentials or permissions, which the client may fix |
/// | `RESOURCE_EXHAUSTED` | no | a quota or rate limit: the retry should run |
/// | `UNIMPLEMENTED` | no | a deploy away from working |
/// | `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `INTERNAL`, `UNKNOWN`, `ABORTED`, `CANCELLED`, `DATA_LOSS` | never | transient; cannot be made stored |
///
/// `#[idempotent(grpc, store = [PERMISSION_DENIED], never_store = [NOT_FOUND])]`
/// changes the set for one method.
///
/// ```
/// use idem_runtime::grpc::StoredCodes;
/// use tonic::Code;
///
/// assert!(StoredCodes::DEFAULT.stores(Code::Ok));
/// assert!(StoredCodes::DEFAULT.stores(Code::FailedPrecondition));
/// assert!(!StoredCodes::DEFAULT.stores(Code::Unavailable));
/// let custom = StoredCodes::new(&[Code::PermissionDenied], &[Code::NotFound]);
/// assert!(custom.stores(Code::PermissionDenied));
/// assert!(!custom.stores(Code::NotFound));
/// assert!(!StoredCodes::new(&[Code::Internal], &[]).stores(Code::Internal));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredCodes {
    also: &'static [Code],
    never: &'static [Code],
}

impl StoredCodes {
    /// The codes stored unless named in `never`.
    pub const STORED_BY_DEFAULT: &'static [Code] = &[
        Code::Ok,
        Code::InvalidArgument,
        Code::NotFound,
        Code::AlreadyExists,
        Code::FailedPrecondition,
        Code::OutOfRange,
    ];

    /// The codes a method may add to the stored set.
    pub const STORABLE_ON_REQUEST: &'static [Code] = &[
        Code::PermissionDenied,
        Code::Unauthenticated,
        Code::ResourceExhausted,
        Code::Unimplemented,
    ];

    /// The default set (see the table above).
    pub const DEFAULT: Self = Self {
        also: &[],
        never: &[],
    };

    /// The default set, plus the codes in `also` that
    /// [`StoredCodes::STORABLE_ON_REQUEST`] lists, minus the codes in `never`.
    pub const fn new(also: &'static [Code], never: &'static [Code]) -> Self {
        Self { also, never }
    }

    /// Whether an answer with `code` is stored.
    pub fn stores(&self, code: Code) -> bool {
        !self.never.contains(&code)
            && (Self::STORED_BY_DEFAULT.contains(&code)
                || (self.also.contains(&code) && Self::STORABLE_ON_REQUEST.contains(&code)))
    }
}

impl Default for StoredCodes {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The HTTP status a gRPC code stands for (the mapping of
/// `google.rpc.Code`), kept in the key table's status column so `idem
/// inspect` and the metrics read gRPC answers as they read HTTP ones.
///
/// ```
/// use idem_runtime::grpc::http_status;
/// use tonic::Code;
/// assert_eq!(http_status(Code::Ok), 200);
/// assert_eq!(http_status(Code::NotFound), 404);
/// assert_eq!(http_status(Code::Unavailable), 503);
/// ```
pub fn http_status(code: Code) -> u16 {
    match code {
        Code::Ok => 200,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::ResourceExhausted => 429,
        Code::Cancelled => 499,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::DeadlineExceeded => 504,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    }
}

/// The status for an engine error, with the metadata a client needs to act
/// on it: `grpc-retry-pushback-ms` and `retry-after` (seconds) where a retry
/// helps, and `idempotency-problem`, the problem type URI of the HTTP answer.
///
/// | error | code | retry |
/// |---|---|---|
/// | key reused with another request | `FAILED_PRECONDITION` | never: send a new key for a new operation |
/// | in progress, or taken over | `ABORTED` | after the pushback (the lock's time left), same key |
/// | store down or busy | `UNAVAILABLE` | after the pushback, same key |
/// | timed out (rolled back) | `DEADLINE_EXCEEDED` | same key |
/// | stored reply cannot be decoded | `INTERNAL` | no |
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::IdemError;
/// use tonic::{Code, Status};
///
/// let status = Status::from(IdemError::InProgress { retry_after: Duration::from_millis(1500) });
/// assert_eq!(status.code(), Code::Aborted);
/// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "1500");
/// assert_eq!(status.metadata().get("retry-after").unwrap(), "2");
/// assert_eq!(Status::from(IdemError::Mismatch).code(), Code::FailedPrecondition);
/// ```
impl From<IdemError> for Status {
    fn from(error: IdemError) -> Self {
        record_outcome(crate::http::label(Err(&error)));
        let (code, problem, message) = match &error {
            IdemError::Mismatch => (
                Code::FailedPrecondition,
                types::KEY_REUSED,
                "this idempotency key was already used with a different request; nothing was executed. \
                 Retry with the original request to get the original answer, or send a new key for a new operation"
                    .to_owned(),
            ),
            IdemError::InProgress { retry_after } => (
                Code::Aborted,
                types::IN_PROGRESS,
                format!(
                    "a request with this idempotency key is still in progress; nothing was executed. \
                     Retry the same request with the same key after {} ms to get its answer",
                    retry_after.as_millis()
                ),
            ),
            IdemError::LockLost => (
                Code::Aborted,
                types::IN_PROGRESS,
                "another attempt with this idempotency key took over and this one was rolled back; \
                 retry the same request with the same key to get the answer"
                    .to_owned(),
            ),
            IdemError::StoreBusy { .. } => (
                Code::Unavailable,
                types::STORE_BUSY,
                "the idempotency store is busy with other requests' writes; nothing was executed. \
                 Retry the same request with the same key"
                    .to_owned(),
            ),
            IdemError::Unavailable { source, .. } => {
                tracing::warn!(error = %source, "idempotency store unavailable; refusing the call (fail closed)");
                (
                    Code::Unavailable,
                    types::STORE_UNAVAILABLE,
                    "the idempotency store is unavailable; nothing was executed. \
                     Retry the same request with the same key"
                        .to_owned(),
                )
            }
            IdemError::Conflict { .. } => (
                Code::Unavailable,
                types::TRANSACTION_CONFLICT,
                "the operation conflicted with a concurrent transaction and was rolled back; nothing was \
                 stored. Retry the same request with the same key"
                    .to_owned(),
            ),
            IdemError::TimedOut { limit } => (
                Code::DeadlineExceeded,
                types::TIMED_OUT,
                format!(
                    "the operation did not finish within {} ms and was rolled back; nothing was stored. \
                     Retry the same request with the same key",
                    limit.as_millis()
                ),
            ),
            IdemError::Replay(_) => (
                Code::Internal,
                types::REPLAY_FAILED,
                "the answer stored for this key can no longer be decoded by this version of the service"
                    .to_owned(),
            ),
        };
        let mut metadata = MetadataMap::new();
        metadata.insert(IDEMPOTENCY_PROBLEM, MetadataValue::from_static(problem));
        if let Some(retry_after) = error.retry_after() {
            insert_pushback(&mut metadata, retry_after);
        }
        Status::with_metadata(code, message, metadata)
    }
}

/// `grpc-retry-pushback-ms` and `retry-after` (whole seconds, at least 1).
fn insert_pushback(metadata: &mut MetadataMap, wait: Duration) {
    let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    metadata.insert(GRPC_RETRY_PUSHBACK_MS, MetadataValue::from(millis));
    metadata.insert(
        "retry-after",
        MetadataValue::from(millis.div_ceil(1000).max(1)),
    );
}

/// A status for a request refused before anything was claimed (a missing or
/// malformed key or scope): `code`, the message, and the problem type.
pub(crate) fn refused(code: Code, problem: &'static str, message: String) -> Status {
    crate::http::record_rejected();
    let mut metadata = MetadataMap::new();
    metadata.insert(IDEMPOTENCY_PROBLEM, MetadataValue::from_static(problem));
    Status::with_metadata(code, message, metadata)
}
