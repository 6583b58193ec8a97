use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    id: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1")]
async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Receipt {
    let _ = tx;
    Receipt { id: req.amount }
}

fn main() {}
