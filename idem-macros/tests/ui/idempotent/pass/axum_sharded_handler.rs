// One handler, served on one engine, on shards by tenant, and on application
// states holding either.
use axum::extract::{FromRef, Path};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem::http::Json;
use idem::shard::{DirectoryRouter, HashRouter, Shards};
use idem::sqlx::{PgConnection, Postgres};
use idem::{idempotent, Engine, Engines, Fingerprint, IdempotencyKey};

#[derive(serde::Deserialize, Fingerprint)]
struct NewOrder {
    sku: String,
}

#[idempotent(http, scope = "tenant", step = "create-order.v1")]
async fn create_order(
    tx: &mut PgConnection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> (StatusCode, String) {
    let _ = tx;
    (StatusCode::CREATED, format!("{tenant}/{}", order.sku))
}

fn routes<S: Clone + Send + Sync + 'static>(state: S) -> Router
where
    Engines<Postgres>: FromRef<S>,
{
    Router::new().route("/{tenant}/orders", post(create_order)).with_state(state)
}

#[derive(Clone)]
struct WithEngine {
    engine: Engine<Postgres>,
}

impl FromRef<WithEngine> for Engine<Postgres> {
    fn from_ref(state: &WithEngine) -> Self {
        state.engine.clone()
    }
}

#[derive(Clone)]
struct WithShards {
    shards: Shards<Postgres, DirectoryRouter>,
}

impl FromRef<WithShards> for Engines<Postgres> {
    fn from_ref(state: &WithShards) -> Self {
        state.shards.clone().into()
    }
}

fn apps(
    engine: Engine<Postgres>,
    hashed: Shards<Postgres, HashRouter>,
    directed: Shards<Postgres, DirectoryRouter>,
) -> [Router; 5] {
    [
        Router::new().route("/{tenant}/orders", post(create_order)).with_state(engine.clone()),
        Router::new().route("/{tenant}/orders", post(create_order)).with_state(hashed),
        routes(directed.clone()),
        routes(WithEngine { engine }),
        routes(WithShards { shards: directed }),
    ]
}

fn main() {
    let _ = apps;
}
