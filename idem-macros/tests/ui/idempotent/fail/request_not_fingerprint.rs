use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

struct Refund {
    amount: i64,
}

#[idempotent(scope = "tenant", step = "refund.v1")]
async fn refund(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Refund,
) -> Result<i64, Problem> {
    let _ = tx;
    Ok(req.amount)
}

fn unused(_: Charge) {}

fn main() {}
