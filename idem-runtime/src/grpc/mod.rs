//! The tonic integration (feature `tonic`): idempotent gRPC methods.
//!
//! The protocol is the HTTP one carried in metadata:
//!
//! - the key is the `idempotency-key` ASCII metadata entry, with the syntax
//!   and limits of the HTTP header; missing, malformed or sent as
//!   `idempotency-key-bin`: `INVALID_ARGUMENT`, nothing runs
//!   ([`FromRequestMetadata`] for [`IdempotencyKey`](crate::IdempotencyKey));
//! - the scope is a metadata entry ([`HeaderScope`](crate::http::HeaderScope)),
//!   the authenticated principal an interceptor put in the request's
//!   extensions ([`PrincipalScope`](crate::http::PrincipalScope)), or a type
//!   of yours implementing [`FromRequestMetadata`];
//! - the reply message and the response metadata worth keeping are stored
//!   ([`into_stored`]) and replayed with `idempotent-replayed: true`
//!   ([`respond`]); which status codes are stored is [`StoredCodes`]';
//! - engine errors are statuses a gRPC client knows how to act on
//!   (`ABORTED` / `UNAVAILABLE` with `grpc-retry-pushback-ms`,
//!   `FAILED_PRECONDITION` for a reused key: see
//!   [`Status::from`](tonic::Status#impl-From<IdemError>-for-Status)).
//!
//! `#[idempotent(grpc, scope = "...", step = "...")]` on a method of a tonic
//! service impl does all of it; the service says which engine it claims on
//! through [`HasEngine`].
//!
//! ```
//! use idem_runtime::grpc::{self, HasEngine};
//! use idem_runtime::http::KeptHeaders;
//! use idem_runtime::{Claim, Engine, IdempotencyKey, Operation, Scope};
//! use sqlx::Sqlite;
//! use tonic::{Request, Response, Status};
//!
//! struct Echo {
//!     engine: Engine<Sqlite>,
//! }
//!
//! impl HasEngine<Sqlite> for Echo {
//!     fn engine(&self) -> &Engine<Sqlite> {
//!         &self.engine
//!     }
//! }
//!
//! // What the attribute writes, by hand, with the engine's guard API.
//! async fn echo(service: &Echo, request: Request<String>) -> Result<Response<String>, Status> {
//!     use grpc::FromRequestMetadata;
//!     let key = IdempotencyKey::from_request_metadata(request.metadata(), request.extensions())?;
//!     let op = Operation::new(Scope::tenant("acme"), key, "echo.v1", request.get_ref());
//!     let mut guard = match service.engine().claim(&op).await.map_err(Status::from)? {
//!         Claim::Execute(guard) => guard,
//!         Claim::Replay(replay) => return grpc::respond(replay.decode()),
//!     };
//!     // ... business writes on `&mut *guard`, the claim's connection ...
//!     let stored = grpc::into_stored(Ok::<_, Status>(Response::new(request.into_inner())), KeptHeaders::DEFAULT);
//!     grpc::respond(guard.commit(stored).await)
//! }
//! ```

mod reply;
mod request;
mod status;

pub use reply::{into_stored, respond, REPLY_CONTENT_TYPE, STATUS_CONTENT_TYPE};
pub(crate) use reply::{kept_metadata, stored_answer, StoredAnswer};
pub use request::{fingerprint_encoding, key_from_field, FromRequestMetadata, HasEngine};
pub use status::{http_status, StoredCodes};
