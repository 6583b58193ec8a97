use idem::{idempotent, Backend, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge<T> {
    amount: T,
}

/// Generic over the backend and the request's amount type.
#[idempotent(scope = "tenant", step = "charge.v1")]
async fn charge<DB: Backend, T>(tx: &mut DB::Connection, tenant: String, key: IdempotencyKey, #[fingerprint] req: Charge<T>) -> Result<String, Problem>
where
    T: Fingerprint + ToString + Send,
{
    let _ = tx;
    Ok(req.amount.to_string())
}

async fn call(sqlite: &idem::Engine<idem::sqlx::Sqlite>, pg: &idem::Engine<idem::sqlx::Postgres>) {
    let key = IdempotencyKey::new("k").unwrap();
    let _ = charge(sqlite, "acme".into(), key.clone(), Charge { amount: 1u32 }).await;
    let _ = charge(pg, "acme".into(), key, Charge { amount: "x".to_string() }).await;
}

fn main() {
    let _ = call;
}
