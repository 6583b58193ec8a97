//! The axum integration (feature `axum`, on by default).
//!
//! Everything an HTTP handler needs to speak the
//! [Idempotency-Key draft](https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/):
//!
//! - [`IdempotencyKey`](crate::IdempotencyKey) is an extractor for the
//!   `Idempotency-Key` header (a structured-field string `"..."`, or the bare
//!   value Stripe-style clients send). Missing or malformed: 400.
//!   `Option<IdempotencyKey>` for routes where the key is optional.
//! - [`Engine`](crate::Engine) is an extractor too, taken from the router's
//!   state through [`FromRef`](axum::extract::FromRef).
//! - [`Json`] parses the body before anything is claimed: malformed JSON is a
//!   400, a body over the [`DefaultBodyLimit`](axum::extract::DefaultBodyLimit)
//!   a 413, both as problem details, with nothing stored.
//! - [`into_stored`] turns a handler's response into the stored form (status,
//!   content type, body and the headers [`KeptHeaders`] keeps: `Location`,
//!   `ETag`, `X-…` and the like, never hop-by-hop ones or `Set-Cookie` unless
//!   named), and [`respond`] renders the stored form, first answer and replays
//!   alike, so a replay is byte-identical to the first answer plus
//!   `Idempotent-Replayed: true`.
//! - [`IdemError`](crate::IdemError) renders as 422 / 409 + `Retry-After` /
//!   503 + `Retry-After` / 504 / 500, each an `application/problem+json` body
//!   (RFC 9457) whose `detail` tells the client what to do.
//! - [`HeaderScope`], [`PathScope`] and [`PrincipalScope`] extract the scope
//!   a key lives in from a header, a named path segment, or the
//!   authenticated principal (your type, implementing
//!   [`ScopePart`](crate::ScopePart)); name them in
//!   `#[idempotent(http, scope = "...")]`.
//! - [`operation_span`] opens the per-request `tracing` span (scope, step, a
//!   short hash of the key, never the key) whose `outcome` [`respond`] records.
//!
//! A handler written with the engine's guard API:
//!
//! ```
//! use axum::{extract::State, response::{IntoResponse, Response}, routing::post, Router};
//! use idem_runtime::http::{self, Json};
//! use idem_runtime::{Claim, Engine, IdempotencyKey, Operation, Scope};
//! use sqlx::Sqlite;
//! use tracing::Instrument;
//!
//! async fn create(State(engine): State<Engine<Sqlite>>, key: IdempotencyKey, Json(body): Json<serde_json::Value>) -> Response {
//!     let op = Operation::new(Scope::tenant("acme"), key, "create-thing.v1", &body);
//!     let span = http::operation_span(&op);
//!     async move {
//!         let mut guard = match engine.claim(&op).await {
//!             Ok(Claim::Execute(guard)) => guard,
//!             Ok(Claim::Replay(replay)) => return http::respond(replay.decode()),
//!             Err(error) => return http::respond(Err(error)),
//!         };
//!         // ... business writes on `&mut *guard`, the claim's connection ...
//!         let stored = http::into_stored((axum::http::StatusCode::CREATED, axum::Json(body)).into_response()).await;
//!         http::respond(guard.commit(stored).await)
//!     }
//!     .instrument(span)
//!     .await
//! }
//!
//! fn app(engine: Engine<Sqlite>) -> Router {
//!     Router::new().route("/things", post(create)).with_state(engine)
//! }
//! ```

mod engine;
mod error;
mod fingerprint;
mod json;
mod linger;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod problem;
mod response;
mod scope;
mod trace;

pub use idem_core::extract::{parse_header_value, KeyRejection};
pub use idem_core::header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use json::{Json, JsonRejection};
pub use linger::{LINGER_MAX_BYTES, LINGER_MAX_TIME};

pub(crate) use response::kept_headers;
pub use response::{into_stored, into_stored_keeping, respond, KeptHeaders};
pub use scope::{
    HeaderScope, PathScope, PrincipalScope, ScopeHeaderName, ScopePathParam, ScopeRejection,
    XTenantId,
};
#[cfg(feature = "tonic")]
pub(crate) use trace::label;
pub(crate) use trace::record_rejected;
pub use trace::{operation_span, record_outcome};
