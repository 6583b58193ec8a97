use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = ["tenant", "caller"], step = "charge.v1", retain = "7d", wait = "500ms", timeout = "10s", fail_open, group_commit = false)]
pub async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    caller: &str,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, Problem> {
    if req.amount < 0 {
        return Ok(0); // early return
    }
    let n: i64 = idem::sqlx::query_scalar("SELECT 1").fetch_one(&mut *tx).await.map_err(|_| Problem::new(503, "db"))?;
    Ok(n + req.amount)
}

async fn call(engine: &idem::Engine<idem::sqlx::Sqlite>) -> Result<i64, idem::IdemError> {
    let done = charge(engine, "acme".into(), "api", IdempotencyKey::new("k").unwrap(), Charge { amount: 1 }).await?;
    Ok(done.value.unwrap_or(0))
}

fn main() {
    let _ = call;
}
