//! The engine as an extractor, taken from the router's state.

use std::convert::Infallible;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;

use crate::engine::Engine;
use crate::store::Backend;

/// Takes the engine from the router's state (any state `S` with
/// `Engine<DB>: FromRef<S>`, including the engine itself as the state).
///
/// ```
/// use axum::{extract::FromRef, routing::post, Router};
/// use idem_runtime::Engine;
/// use sqlx::Sqlite;
///
/// #[derive(Clone)]
/// struct AppState { engine: Engine<Sqlite> }
///
/// impl FromRef<AppState> for Engine<Sqlite> {
///     fn from_ref(state: &AppState) -> Self { state.engine.clone() }
/// }
///
/// async fn handler(engine: Engine<Sqlite>) -> String { format!("{engine:?}") }
///
/// fn app(state: AppState) -> Router { Router::new().route("/", post(handler)).with_state(state) }
/// ```
impl<S, DB> FromRequestParts<S> for Engine<DB>
where
    DB: Backend,
    Engine<DB>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Infallible;

    async fn from_request_parts(_parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Engine::from_ref(state))
    }
}
