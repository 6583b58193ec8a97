use axum::extract::Path;
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
    #[fingerprint] Json(order): Json<NewOrder>,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
) -> String {
    let _ = tx;
    format!("{tenant}/{}", order.sku)
}

fn main() {
    let _: Router<Engine<Sqlite>> = Router::new().route("/{tenant}/orders", post(create_order));
}
