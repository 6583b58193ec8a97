use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

struct Receipt {
    id: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1")]
async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<Receipt, Problem> {
    let _ = tx;
    Ok(Receipt { id: req.amount })
}

fn main() {}
