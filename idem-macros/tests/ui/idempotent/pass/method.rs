use idem::sqlx::SqliteConnection;
use idem::{idempotent, Fingerprint, IdempotencyKey, Problem};

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
}

struct Service {
    fee: i64,
}

impl Service {
    #[idempotent(scope = "tenant", step = steps::CHARGE, durable, lock_ttl = "30s")]
    async fn charge(&self, tx: &mut SqliteConnection, tenant: &str, key: &IdempotencyKey, #[fingerprint] req: &Charge) -> Result<i64, Problem> {
        let _ = tx;
        Ok(req.amount + self.fee)
    }
}

mod steps {
    idem::steps! {
        pub const CHARGE = "charge.v1";
    }
}

async fn call(service: &Service, engine: &idem::Engine<idem::sqlx::Sqlite>) {
    let key = IdempotencyKey::new("k").unwrap();
    let _ = service.charge(engine, "acme", &key, &Charge { amount: 1 }).await;
}

fn main() {
    let _ = call;
}
