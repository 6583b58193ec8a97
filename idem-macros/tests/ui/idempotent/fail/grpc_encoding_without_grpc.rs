// `fingerprint = encoding` fingerprints a gRPC request message; elsewhere
// the fingerprinted parameter is marked `#[fingerprint]`.
use idem::sqlx::SqliteConnection;
use idem::{idempotent, IdempotencyKey, Problem};

#[idempotent(scope = "tenant", step = "charge.v1", fingerprint = encoding)]
async fn charge(tx: &mut SqliteConnection, tenant: &str, key: &IdempotencyKey, #[fingerprint] amount: &i64) -> Result<i64, Problem> {
    let _ = (tx, tenant);
    Ok(*amount)
}

fn main() {}
