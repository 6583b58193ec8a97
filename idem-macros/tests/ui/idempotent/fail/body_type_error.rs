use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

// The wrapper is invisible: a type error in the body points at the body.
#[idempotent(scope = "tenant", step = "charge.v1")]
async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, Problem> {
    let _ = (tx, req);
    let amount: i64 = tenant;
    Ok(amount)
}

fn main() {}
