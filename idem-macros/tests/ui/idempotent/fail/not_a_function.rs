use idem::{idempotent, Fingerprint};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1")]
pub struct Service {
    pub charge: Charge,
}

fn main() {}
