// `key = <field>` reads a gRPC request message's field; an HTTP handler's
// key is the `Idempotency-Key` header.
use axum::http::StatusCode;
use idem::http::{HeaderScope, Json, XTenantId};
use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey};

#[derive(serde::Deserialize, Fingerprint)]
struct NewOrder {
    request_id: String,
}

#[idempotent(http, scope = "tenant", step = "create-order.v1", key = request_id)]
async fn create_order(tx: &mut SqliteConnection, tenant: HeaderScope<XTenantId>, key: IdempotencyKey, #[fingerprint] Json(order): Json<NewOrder>) -> StatusCode {
    let _ = (tx, tenant, key, order.request_id);
    StatusCode::CREATED
}

fn main() {}
