use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1", retain = "24h", retain = "7d")]
async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, Problem> {
    let _ = tx;
    Ok(req.amount)
}

fn main() {}
