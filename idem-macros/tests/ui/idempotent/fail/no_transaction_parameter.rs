use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1")]
async fn charge(tenant: String, key: IdempotencyKey, #[fingerprint] req: Charge) -> Result<i64, Problem> {
    Ok(req.amount)
}

fn main() {}
