//! The benchmark's one keyed operation, shared by every backend: the request,
//! its step, the hash a careful user computes, and the two idem scenarios. The
//! `idem` scenario sends the request through [`Engine::run`] ([`keyed`]); the
//! `idem-macro` scenario through an `#[idempotent]` handler ([`charge`]). Both
//! scope by the tenant and run [`Business::business`], so they differ only by
//! the macro.

use std::future::Future;

use idem::{
    idempotent, steps, Answer, Backend, Engine, Fingerprint, IdemError, IdempotencyKey, Operation,
    Problem, Scope, Via,
};
use sha2::{Digest, Sha256};

use crate::target::{BenchError, TENANT};

steps! {
    /// The benchmark's one step.
    pub const CHARGE_CARD = "charge-card.v1";
}

/// The request every keyed scenario sends (amount in cents, currency).
pub const REQUEST: (i64, &str) = (2500, "EUR");

/// The request every keyed scenario sends, as a fingerprinted type.
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

/// What a careful user hashes a request with: serde_json + SHA-256.
pub fn user_hash() -> Vec<u8> {
    let body = serde_json::to_vec(&REQUEST).expect("serialize");
    Sha256::digest(body).to_vec()
}

/// A backend's business insert: one payment row for `tenant`, answered with its id.
pub trait Business: Backend {
    /// Inserts the payment on `conn` (inside the claim's transaction).
    fn business<'c>(
        conn: &'c mut Self::Connection,
        tenant: &'c str,
    ) -> impl Future<Output = Result<i64, Problem>> + Send + 'c;
}

/// The unprotected write: `BEGIN`, the business insert, `COMMIT`.
pub async fn unprotected<DB: Business>(pool: sqlx::Pool<DB>) -> Result<(), BenchError> {
    let mut tx = pool.begin().await?;
    DB::business(&mut tx, TENANT)
        .await
        .map_err(|problem| problem.to_string())?;
    Ok(tx.commit().await?)
}

/// The `idem-macro` scenario's handler.
#[idempotent(scope = "tenant", step = CHARGE_CARD)]
async fn charge<DB: Business>(
    tx: &mut DB::Connection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<i64, Problem> {
    let _ = &req;
    DB::business(tx, &tenant).await
}

/// One keyed operation through the `#[idempotent]` handler.
pub async fn through_macro<DB: Business>(
    engine: &Engine<DB>,
    key: String,
    tenant: String,
) -> Result<Via, IdemError> {
    let key = IdempotencyKey::new(key).expect("valid key");
    charge(engine, tenant, key, Charge::new()).await.map(via)
}

/// The replay cache the `replay-cached` and `mixed-cached` scenarios' engine
/// keeps: room for every key a run completes.
pub fn replay_cache() -> idem::ReplayCache {
    idem::ReplayCache::new(1_000_000, 256 * 1024 * 1024)
}

/// One keyed operation through [`Engine::run`].
pub async fn keyed<DB: Business>(
    engine: &Engine<DB>,
    key: String,
    tenant: String,
) -> Result<Via, IdemError> {
    let op = Operation::new(
        Scope::tenant(&tenant),
        IdempotencyKey::new(key).expect("valid key"),
        CHARGE_CARD.name(),
        &Charge::new(),
    );
    engine
        .run(&op, async move |tx| DB::business(tx, &tenant).await)
        .await
        .map(via)
}

/// How the operation was answered; the business insert never fails.
fn via(done: Answer<Result<i64, Problem>>) -> Via {
    match done.value {
        Ok(_) => done.via,
        Err(problem) => panic!("business insert failed: {problem}"),
    }
}
