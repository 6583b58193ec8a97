//! The `idem-macro` scenario: the same business insert through an
//! `#[idempotent]` handler, with a `#[derive(Fingerprint)]` request, on each
//! backend. The `idem` scenario sends the same request type through
//! `Engine::run`, so the two differ only by the macro.

use idem::sqlx::{PgConnection, SqliteConnection};
use idem::{idempotent, steps, Engine, Fingerprint, IdemError, IdempotencyKey, Problem, Via};
use sqlx::{Postgres, Sqlite};

use crate::target::REQUEST;

steps! {
    /// The benchmark's one step.
    pub const CHARGE_CARD = "charge-card.v1";
}

/// The request every keyed scenario sends.
#[derive(Debug, Clone, Fingerprint)]
pub struct Charge {
    /// Amount in cents.
    pub amount_cents: i64,
    /// ISO currency.
    pub currency: String,
}

impl Charge {
    /// The benchmark's request.
    pub fn new() -> Self {
        Self {
            amount_cents: REQUEST.0,
            currency: REQUEST.1.to_string(),
        }
    }
}

impl Default for Charge {
    fn default() -> Self {
        Self::new()
    }
}

#[idempotent(scope = "tenant_id", step = CHARGE_CARD)]
async fn charge_pg(
    tx: &mut PgConnection,
    tenant_id: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, Problem> {
    let _ = &req;
    crate::pg::business(tx, &tenant_id).await
}

#[idempotent(scope = "tenant_id", step = CHARGE_CARD)]
async fn charge_lite(
    tx: &mut SqliteConnection,
    tenant_id: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, Problem> {
    let _ = &req;
    crate::lite::business(tx, &tenant_id).await
}

fn via<E: std::fmt::Display>(done: idem::Answer<Result<i64, E>>) -> Via {
    match done.value {
        Ok(_) => done.via,
        Err(problem) => panic!("business insert failed: {problem}"),
    }
}

/// One keyed operation through the Postgres handler.
pub async fn run_pg(
    engine: &Engine<Postgres>,
    key: String,
    tenant: String,
) -> Result<Via, IdemError> {
    let key = IdempotencyKey::new(key).expect("valid key");
    charge_pg(engine, tenant, key, Charge::new()).await.map(via)
}

/// One keyed operation through the SQLite handler.
pub async fn run_lite(
    engine: &Engine<Sqlite>,
    key: String,
    tenant: String,
) -> Result<Via, IdemError> {
    let key = IdempotencyKey::new(key).expect("valid key");
    charge_lite(engine, tenant, key, Charge::new())
        .await
        .map(via)
}
