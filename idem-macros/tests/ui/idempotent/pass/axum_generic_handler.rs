// One axum handler for both backends: generic over `DB: Backend`, mounted
// once per backend (SQLite in development, Postgres in production).
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem::http::{HeaderScope, Json, XTenantId};
use idem::sqlx::{Postgres, Sqlite};
use idem::{idempotent, Backend, Engine, Fingerprint, IdempotencyKey};

#[derive(serde::Deserialize, Fingerprint)]
struct NewOrder {
    sku: String,
}

#[idempotent(http, scope = "tenant", step = "create-order.v1")]
async fn create_order<DB: Backend>(
    tx: &mut DB::Connection,
    tenant: HeaderScope<XTenantId>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> (StatusCode, String) {
    let _ = tx;
    (StatusCode::CREATED, format!("{tenant}/{}", order.sku))
}

fn app<DB: Backend>(engine: Engine<DB>) -> Router {
    Router::new().route("/orders", post(create_order::<DB>)).with_state(engine)
}

fn main() {
    let _ = app::<Sqlite>;
    let _ = app::<Postgres>;
}
