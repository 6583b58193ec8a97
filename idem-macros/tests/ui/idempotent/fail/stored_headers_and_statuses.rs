use idem::http::Json;
use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey};

#[derive(Fingerprint, serde::Deserialize)]
struct Charge {
    amount: i64,
}

#[idempotent(
    http,
    scope = "tenant",
    step = "charge.v1",
    headers = ["set-cookie", "Transfer-Encoding", "not a name"],
    store = [401, 503],
    never_store = [700]
)]
async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] Json(req): Json<Charge>,
) -> String {
    let _ = tx;
    req.amount.to_string()
}

#[idempotent(scope = "tenant", step = "refund.v1", headers = ["location"], never_store = [404])]
async fn refund(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, idem::Problem> {
    let _ = tx;
    Ok(req.amount)
}

fn main() {}
