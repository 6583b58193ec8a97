use axum::extract::Path;
use idem::http::Json;
use idem::sqlx::SqliteConnection;
use idem::{idempotent, IdempotencyKey};

#[derive(serde::Deserialize)]
struct NewOrder {
    sku: String,
}

#[idempotent(http, scope = "tenant", step = "create-order.v1")]
async fn create_order(
    tx: &mut SqliteConnection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> String {
    let _ = tx;
    format!("{tenant}/{}", order.sku)
}

fn main() {}
