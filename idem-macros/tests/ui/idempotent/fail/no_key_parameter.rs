use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1")]
async fn charge(tx: &mut SqliteConnection, tenant: String, key: String, #[fingerprint] req: Charge) -> Result<i64, Problem> {
    let _ = (tx, key);
    Ok(req.amount)
}

fn main() {}
