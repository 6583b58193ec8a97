//! The engine as an extractor, taken from the router's state.

use std::convert::Infallible;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;

use crate::engine::Engine;
use crate::shard::{Engines, Router, Shards};
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

/// The engine taken from any state the engine itself is taken from:
/// `.with_state(engine)`, or an application state with
/// `impl FromRef<AppState> for Engine<DB>`.
impl<S, DB> FromRef<S> for Engines<DB>
where
    DB: Backend,
    Engine<DB>: FromRef<S>,
{
    fn from_ref(state: &S) -> Self {
        Engine::from_ref(state).into()
    }
}

/// The shards as the state: `.with_state(shards)`.
impl<DB: Backend, R: Router> FromRef<Shards<DB, R>> for Engines<DB> {
    fn from_ref(shards: &Shards<DB, R>) -> Self {
        shards.clone().into()
    }
}

/// Takes the engines from the router's state (any state `S` with
/// `Engines<DB>: FromRef<S>`): what an `#[idempotent(http)]` handler takes.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem_runtime::shard::{HashRouter, Shards};
/// use idem_runtime::{Engine, Engines};
/// use sqlx::Sqlite;
///
/// async fn handler(engines: Engines<Sqlite>) -> String { format!("{engines:?}") }
///
/// fn one(engine: Engine<Sqlite>) -> Router { Router::new().route("/", post(handler)).with_state(engine) }
/// fn sharded(shards: Shards<Sqlite, HashRouter>) -> Router { Router::new().route("/", post(handler)).with_state(shards) }
/// ```
impl<S, DB> FromRequestParts<S> for Engines<DB>
where
    DB: Backend,
    Engines<DB>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Infallible;

    async fn from_request_parts(_parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Engines::from_ref(state))
    }
}
