use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem::http::Json;
use idem::sqlx::{Sqlite, SqliteConnection};
use idem::{idempotent, Engine, Fingerprint, IdempotencyKey};

#[derive(serde::Deserialize, Fingerprint)]
struct NewOrder {
    sku: String,
}

#[idempotent(http, scope = "tenant", step = "create-order.v1")]
async fn create_order(
    tx: &mut SqliteConnection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> (StatusCode, String) {
    let _ = tx;
    (StatusCode::CREATED, format!("{tenant}/{}", order.sku))
}

fn app(engine: Engine<Sqlite>) -> Router {
    Router::new().route("/{tenant}/orders", post(create_order)).with_state(engine)
}

fn main() {
    let _ = app;
}
