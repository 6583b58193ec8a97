use idem::sqlx::MySqlConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = "tenant", step = "charge.v1")]
pub async fn charge(
    tx: &mut MySqlConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<u64, Problem> {
    let done = idem::sqlx::query("INSERT INTO payments (tenant, amount) VALUES (?, ?)")
        .bind(&tenant)
        .bind(req.amount)
        .execute(&mut *tx)
        .await
        .map_err(|_| Problem::new(503, "db"))?;
    Ok(done.last_insert_id())
}

async fn call(engine: &idem::Engine<idem::sqlx::MySql>) -> Result<u64, idem::IdemError> {
    let done = charge(engine, "acme".into(), IdempotencyKey::new("k").unwrap(), Charge { amount: 1 }).await?;
    Ok(done.value.unwrap_or(0))
}

fn main() {
    let _ = call;
}
