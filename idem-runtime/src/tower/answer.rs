//! What [`IdempotencyLayer`](super::IdempotencyLayer) answers, over HTTP and
//! over gRPC: its refusals, the inner service's answer in its stored form,
//! and a stored answer rendered again.

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Response};
use http_body_util::{BodyExt, Full};

use super::{BoxError, Config};
use crate::engine::{Answer, Via};
use crate::error::IdemError;
use crate::http::problem::types;
use crate::http::{kept_headers, KeyRejection};
use crate::outcome::StoredResponse;
use crate::{IdempotencyKey, Problem};

/// How a request speaks, and so how it is answered.
#[derive(Clone, Copy)]
pub(super) enum Protocol {
    Http,
    /// `application/grpc…`: answers are gRPC statuses and framed replies.
    #[cfg(feature = "tonic")]
    Grpc,
}

impl Protocol {
    pub(super) fn of(headers: &HeaderMap) -> Self {
        #[cfg(feature = "tonic")]
        if headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/grpc"))
        {
            return Self::Grpc;
        }
        let _ = headers;
        Self::Http
    }

    /// The request's key, or the refusal to answer with.
    pub(super) fn key(self, headers: &HeaderMap) -> Result<IdempotencyKey, Box<Response<Body>>> {
        match self {
            Self::Http => match idem_core::extract::key_from_headers(headers) {
                Ok(Some(key)) => Ok(key),
                Ok(None) => Err(Box::new(KeyRejection::Missing.into_response())),
                Err(rejection) => Err(Box::new(rejection.into_response())),
            },
            #[cfg(feature = "tonic")]
            Self::Grpc => {
                use crate::grpc::FromRequestMetadata;
                IdempotencyKey::from_request_metadata(
                    &tonic::metadata::MetadataMap::from_headers(headers.clone()),
                    &tonic::Extensions::default(),
                )
                .map_err(|status| Box::new(grpc::status(status)))
            }
        }
    }

    /// The request has no scope.
    pub(super) fn no_scope(self, header: Option<&str>) -> Response<Body> {
        crate::http::record_rejected();
        let detail = match header {
            Some(name) => format!(
                "this request needs a `{name}` header, the scope its idempotency key lives in; nothing was executed"
            ),
            None => "this request carries no scope for its idempotency key; nothing was executed"
                .to_owned(),
        };
        match self {
            Self::Http => Problem::new(400, "Scope missing")
                .with_detail(detail)
                .into_response(),
            #[cfg(feature = "tonic")]
            Self::Grpc => grpc::status(tonic::Status::invalid_argument(detail)),
        }
    }

    /// The body is over `max` bytes, or could not be read.
    pub(super) fn unreadable_body(self, error: BoxError, max: usize) -> Response<Body> {
        crate::http::record_rejected();
        let too_large = error.is::<http_body_util::LengthLimitError>();
        let detail = if too_large {
            format!("the body is over the {max} bytes this service accepts; nothing was executed")
        } else {
            format!("the body could not be read ({error}); nothing was executed")
        };
        match (self, too_large) {
            (Self::Http, true) => Problem::new(413, "Body too large")
                .with_type(types::BODY_TOO_LARGE)
                .with_detail(detail)
                .into_response(),
            (Self::Http, false) => Problem::new(400, "Body unreadable")
                .with_detail(detail)
                .into_response(),
            #[cfg(feature = "tonic")]
            (Self::Grpc, true) => grpc::status(tonic::Status::resource_exhausted(detail)),
            #[cfg(feature = "tonic")]
            (Self::Grpc, false) => grpc::status(tonic::Status::invalid_argument(detail)),
        }
    }

    /// An engine error.
    pub(super) fn error(self, error: IdemError) -> Response<Body> {
        match self {
            Self::Http => error.into_response(),
            #[cfg(feature = "tonic")]
            Self::Grpc => grpc::status(tonic::Status::from(error)),
        }
    }

    /// A stored answer, first time or replayed.
    pub(super) fn render(self, stored: StoredResponse, via: Via) -> Response<Body> {
        match self {
            Self::Http => crate::http::respond(Ok(Answer { value: stored, via })),
            #[cfg(feature = "tonic")]
            Self::Grpc => grpc::render(stored, via),
        }
    }
}

/// The inner service's answer, read to its end.
pub(super) struct Collected {
    parts: http::response::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Collected {
    pub(super) async fn read<B>(response: Response<B>) -> Self
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let (mut parts, body) = response.into_parts();
        match body.collect().await {
            Ok(collected) => Self {
                parts,
                trailers: collected.trailers().cloned(),
                body: collected.to_bytes(),
            },
            Err(error) => {
                let error: BoxError = error.into();
                tracing::error!(%error, "the service's answer could not be read; rolling back, answering 500");
                parts.status = http::StatusCode::INTERNAL_SERVER_ERROR;
                parts.headers.clear();
                Self {
                    parts,
                    body: Bytes::new(),
                    trailers: None,
                }
            }
        }
    }

    /// The answer's stored form, if its status or code is stored.
    pub(super) fn to_stored(&self, protocol: Protocol, config: &Config) -> Option<StoredResponse> {
        match protocol {
            Protocol::Http => {
                let status = self.parts.status.as_u16();
                config.statuses.stores(status).then(|| StoredResponse {
                    status,
                    content_type: self
                        .parts
                        .headers
                        .get(CONTENT_TYPE)
                        .and_then(|value| value.to_str().ok())
                        .unwrap_or_default()
                        .to_owned(),
                    body: self.body.to_vec(),
                    headers: kept_headers(&self.parts.headers, config.kept),
                })
            }
            #[cfg(feature = "tonic")]
            Protocol::Grpc => grpc::to_stored(self, config),
        }
    }

    /// The answer as the service gave it.
    pub(super) fn into_response(self) -> Response<Body> {
        let body = match self.trailers {
            Some(trailers) => {
                Body::new(Full::new(self.body).with_trailers(async move { Some(Ok(trailers)) }))
            }
            None => Body::from(self.body),
        };
        Response::from_parts(self.parts, body)
    }
}

/// gRPC's answers: statuses in headers or trailers, replies as one
/// length-prefixed message.
#[cfg(feature = "tonic")]
mod grpc {
    use axum::body::Body;
    use bytes::Bytes;
    use http::header::CONTENT_TYPE;
    use http::{HeaderMap, HeaderValue, Response};
    use http_body_util::{BodyExt, Full};
    use tonic::metadata::MetadataMap;
    use tonic::{Code, Status};

    use super::{Collected, Config};
    use crate::engine::Via;
    use crate::grpc::{kept_metadata, stored_answer, StoredAnswer, REPLY_CONTENT_TYPE};
    use crate::http::{label, record_outcome};
    use crate::outcome::StoredResponse;

    /// A status as a trailers-only response.
    pub(super) fn status(status: Status) -> Response<Body> {
        status.into_http()
    }

    pub(super) fn render(stored: StoredResponse, via: Via) -> Response<Body> {
        record_outcome(label(Ok(via)));
        match stored_answer(stored, via) {
            Ok(StoredAnswer::Reply(metadata, message)) => reply(metadata, message),
            Ok(StoredAnswer::Status(answer)) | Err(answer) => status(answer),
        }
    }

    /// A reply: its metadata, the message framed, `grpc-status: 0` after it.
    fn reply(metadata: MetadataMap, message: Vec<u8>) -> Response<Body> {
        let length = u32::try_from(message.len()).expect("a stored message is under 4 GiB");
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0);
        frame.extend_from_slice(&length.to_be_bytes());
        frame.extend_from_slice(&message);
        let mut trailers = HeaderMap::new();
        trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from(frame)).with_trailers(async move { Some(Ok(trailers)) });
        let mut response = Response::new(Body::new(body));
        *response.headers_mut() = metadata.into_headers();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        response
    }

    pub(super) fn to_stored(answer: &Collected, config: &Config) -> Option<StoredResponse> {
        let status = answer
            .trailers
            .as_ref()
            .and_then(Status::from_header_map)
            .or_else(|| Status::from_header_map(&answer.parts.headers))?;
        if !config.codes.stores(status.code()) {
            return None;
        }
        let mut metadata = answer.parts.headers.clone();
        metadata.extend(answer.trailers.clone().unwrap_or_default());
        let headers = kept_metadata(metadata, config.kept);
        if status.code() != Code::Ok {
            let mut stored = crate::grpc::into_stored(
                Err::<tonic::Response<()>, _>(status),
                crate::http::KeptHeaders::DEFAULT,
            );
            stored.headers = headers;
            return Some(stored);
        }
        let Some(message) = single_message(&answer.body) else {
            tracing::warn!("a streamed or compressed gRPC reply is not stored; rolling back");
            return None;
        };
        Some(StoredResponse {
            status: 200,
            content_type: REPLY_CONTENT_TYPE.to_owned(),
            body: message.to_vec(),
            headers,
        })
    }

    /// The message of a body holding exactly one uncompressed one.
    fn single_message(body: &[u8]) -> Option<&[u8]> {
        let ([flag, length @ ..], message) = body.split_first_chunk::<5>()?;
        (*flag == 0 && u32::from_be_bytes(*length) as usize == message.len()).then_some(message)
    }
}
