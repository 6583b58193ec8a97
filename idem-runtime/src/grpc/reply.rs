//! Replies and statuses to and from their stored form.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use idem_core::header::{IDEMPOTENCY_PROBLEM, IDEMPOTENT_REPLAYED};
use idem_core::problem::types;
use prost::Message;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Extensions, Response, Status};

use super::status::http_status;
use crate::engine::{Answer, Via};
use crate::error::IdemError;
use crate::http::{kept_headers, label, record_outcome, KeptHeaders};
use crate::outcome::StoredResponse;

/// The stored content type of a reply message (its protobuf encoding).
pub const REPLY_CONTENT_TYPE: &str = "application/grpc+proto";

/// The stored content type of a status: a protobuf message with the code
/// (field 1), the message (2) and the details bytes (3).
pub const STATUS_CONTENT_TYPE: &str = "application/grpc-status+proto";

/// A status as it is stored.
#[derive(Clone, PartialEq, Message)]
struct StoredStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(bytes = "vec", tag = "3")]
    details: Vec<u8>,
}

/// Turns a method's answer into the form the engine stores: the encoded
/// reply or status, and the response metadata `kept` keeps (the `x-…`
/// entries and those named, never the `grpc-` entries gRPC itself sets).
/// The status column holds the HTTP status the code stands for
/// ([`http_status`](super::http_status)). [`respond`] renders first answers
/// from this same form, so the first answer and every replay are identical.
///
/// ```
/// use idem_runtime::grpc::{into_stored, REPLY_CONTENT_TYPE};
/// use idem_runtime::http::KeptHeaders;
/// use tonic::{Response, Status};
///
/// let mut reply = Response::new("receipt-1".to_owned());
/// reply.metadata_mut().insert("x-ledger-entry", "le_9".parse().unwrap());
/// let stored = into_stored(Ok::<_, Status>(reply), KeptHeaders::DEFAULT);
/// assert_eq!((stored.status, stored.content_type.as_str()), (200, REPLY_CONTENT_TYPE));
/// assert_eq!(stored.headers, [("x-ledger-entry".to_owned(), "le_9".to_owned())]);
///
/// let stored = into_stored(Err::<Response<String>, _>(Status::not_found("no such card")), KeptHeaders::DEFAULT);
/// assert_eq!(stored.status, 404);
/// ```
pub fn into_stored<R: Message>(
    result: Result<Response<R>, Status>,
    kept: KeptHeaders,
) -> StoredResponse {
    match result {
        Ok(reply) => {
            let (metadata, message, _) = reply.into_parts();
            StoredResponse {
                status: 200,
                content_type: REPLY_CONTENT_TYPE.to_owned(),
                body: message.encode_to_vec(),
                headers: kept_metadata(metadata.into_headers(), kept),
            }
        }
        Err(status) => StoredResponse {
            status: http_status(status.code()),
            content_type: STATUS_CONTENT_TYPE.to_owned(),
            body: StoredStatus {
                code: status.code().into(),
                message: status.message().to_owned(),
                details: status.details().to_vec(),
            }
            .encode_to_vec(),
            headers: kept_metadata(status.metadata().clone().into_headers(), kept),
        },
    }
}

pub(crate) fn kept_metadata(headers: HeaderMap, kept: KeptHeaders) -> Vec<(String, String)> {
    let mut entries = kept_headers(&headers, kept);
    entries.retain(|(name, _)| !name.starts_with("grpc-"));
    entries
}

/// Renders an engine result as a tonic answer: the stored reply or status
/// (with `idempotent-replayed: true` when it is a replay), or the engine
/// error's status. Records the outcome on the current span.
///
/// ```
/// use idem_runtime::grpc::{into_stored, respond};
/// use idem_runtime::http::KeptHeaders;
/// use idem_runtime::{Answer, Via};
/// use tonic::{Response, Status};
///
/// let stored = into_stored(Ok::<_, Status>(Response::new("receipt-1".to_owned())), KeptHeaders::DEFAULT);
/// let replay: Response<String> = respond(Ok(Answer { value: stored, via: Via::Replayed })).unwrap();
/// assert_eq!(replay.get_ref(), "receipt-1");
/// assert_eq!(replay.metadata().get("idempotent-replayed").unwrap(), "true");
/// ```
pub fn respond<R: Message + Default>(
    result: Result<Answer<StoredResponse>, IdemError>,
) -> Result<Response<R>, Status> {
    let Answer { value, via } = result.map_err(Status::from)?;
    record_outcome(label(Ok(via)));
    match stored_answer(value, via)? {
        StoredAnswer::Reply(metadata, body) => {
            let message = R::decode(body.as_slice()).map_err(undecodable)?;
            Ok(Response::from_parts(metadata, message, Extensions::new()))
        }
        StoredAnswer::Status(status) => Err(status),
    }
}

/// A stored gRPC answer, its metadata restored.
pub(crate) enum StoredAnswer {
    /// The reply message's encoding and the reply's metadata.
    Reply(MetadataMap, Vec<u8>),
    /// A status, its metadata included.
    Status(Status),
}

/// Reads a stored answer back (with `idempotent-replayed: true` when it is a
/// replay); a status if it is not a gRPC answer.
pub(crate) fn stored_answer(value: StoredResponse, via: Via) -> Result<StoredAnswer, Status> {
    let mut metadata = stored_metadata(&value.headers);
    if via == Via::Replayed {
        metadata.insert(IDEMPOTENT_REPLAYED, "true".parse().expect("ASCII"));
    }
    match value.content_type.as_str() {
        STATUS_CONTENT_TYPE => {
            let status = StoredStatus::decode(value.body.as_slice()).map_err(undecodable)?;
            Ok(StoredAnswer::Status(Status::with_details_and_metadata(
                Code::from(status.code),
                status.message,
                status.details.into(),
                metadata,
            )))
        }
        REPLY_CONTENT_TYPE => Ok(StoredAnswer::Reply(metadata, value.body)),
        other => Err(not_a_grpc_answer(other)),
    }
}

fn undecodable(error: prost::DecodeError) -> Status {
    tracing::error!(%error, "a stored gRPC answer could not be decoded");
    replay_failed(
        "the answer stored for this key can no longer be decoded by this version of the service"
            .to_owned(),
    )
}

/// The key's answer was stored by something other than a gRPC method (an
/// HTTP handler under the same step): it is not replayed as a reply.
fn not_a_grpc_answer(content_type: &str) -> Status {
    tracing::error!(
        content_type,
        "the answer stored for this key is not a gRPC answer"
    );
    replay_failed(format!(
        "the answer stored for this key is not a gRPC reply (it was stored as `{content_type}`, \
         by an operation outside gRPC under the same step); use a step of its own for each transport"
    ))
}

/// `INTERNAL`, marked as idem's replay-failed problem.
fn replay_failed(message: String) -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert(
        IDEMPOTENCY_PROBLEM,
        MetadataValue::from_static(types::REPLAY_FAILED),
    );
    Status::with_metadata(Code::Internal, message, metadata)
}

fn stored_metadata(headers: &[(String, String)]) -> MetadataMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(value)) => {
                map.append(name, value);
            }
            _ => {
                tracing::warn!(entry = %name, "a stored metadata entry is not valid; not replayed")
            }
        }
    }
    MetadataMap::from_headers(map)
}
