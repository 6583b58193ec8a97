// The wrapper's own names never shadow the user's: parameters named like
// the wrapper's locals, a local `Result` alias and a user type named `Engine`.
use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[allow(dead_code)]
struct Engine;

type Result<T> = core::result::Result<T, Problem>;

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

#[idempotent(scope = ["engine", "policy", "limit"], step = "charge.v1", timeout = "10s", retain = "1d")]
pub async fn charge(
    tx: &mut SqliteConnection,
    engine: String,
    policy: u32,
    limit: i64,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64> {
    let _: &mut SqliteConnection = tx;
    let _: &IdempotencyKey = &key;
    let _: String = engine;
    Ok(limit + i64::from(policy) + req.amount)
}

#[idempotent(scope = "tenant", step = "refund.v1")]
pub async fn refund(
    conn: &mut SqliteConnection,
    tenant: String,
    key: &IdempotencyKey,
    #[fingerprint] tx: Charge,
) -> core::result::Result<i64, Problem> {
    let _ = conn;
    let _: &IdempotencyKey = key;
    Ok(tx.amount)
}

async fn call(engine: &idem::Engine<idem::sqlx::Sqlite>) -> core::result::Result<i64, idem::IdemError> {
    let key = IdempotencyKey::new("k").unwrap();
    let done = charge(engine, "acme".into(), 1, 2, key.clone(), Charge { amount: 1 }).await?;
    let undone = refund(engine, "acme".into(), &key, Charge { amount: 1 }).await?;
    Ok(done.value.unwrap_or(0) + undone.value.unwrap_or(0))
}

fn main() {
    let _ = call;
    let _ = Engine;
}
