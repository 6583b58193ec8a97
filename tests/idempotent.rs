//! `#[idempotent]` functions through the whole state table, on SQLite and on
//! Postgres: execute, replay, mismatch, in progress, takeover, expiry, and
//! transient errors rolling back.

use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Engine, ErrorStatus, Fingerprint, IdemError, IdempotencyKey, Policy, Via};
use idem_test_support::{Harness, TestBackend};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

idem::steps! {
    const CHARGE = "charge.v1";
    const SLOW_CHARGE = "slow-charge.v1";
    const SHORT_LIVED = "short-lived.v1";
}

#[derive(Debug, Clone, Fingerprint)]
struct ChargeRequest {
    amount: i64,
    #[fingerprint(skip)]
    trace_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    id: i64,
    amount: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ChargeError {
    Declined,
    Flaky,
}

impl ErrorStatus for ChargeError {
    fn status(&self) -> u16 {
        match self {
            ChargeError::Declined => 402,
            ChargeError::Flaky => 503,
        }
    }
}

fn req(amount: i64) -> ChargeRequest {
    ChargeRequest {
        amount,
        trace_id: format!("trace-{amount}-{}", rand_suffix()),
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).unwrap()
}

idem_test_support::on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test]
    executes_once_then_replays,
    #[tokio::test]
    deterministic_errors_replay_and_transient_ones_roll_back,
    #[tokio::test]
    a_reused_key_with_another_request_is_refused,
    #[tokio::test]
    a_running_attempt_answers_in_progress_then_crashes_and_is_taken_over,
    #[tokio::test]
    an_expired_record_is_treated_as_absent,
}

const CREATE_CHARGES: &str =
    "CREATE TABLE charges (id BIGINT PRIMARY KEY, tenant TEXT NOT NULL, amount BIGINT NOT NULL)";

/// The store with the `charges` table added.
async fn with_charges<DB: TestBackend>(store: Harness<DB>) -> Harness<DB> {
    DB::execute(store.engine.pool(), CREATE_CHARGES).await;
    store
}

async fn payments<DB: TestBackend>(engine: &Engine<DB>) -> i64 {
    DB::count(engine.pool(), "SELECT COUNT(*) FROM charges").await
}

async fn insert<DB: TestBackend>(
    tx: &mut DB::Connection,
    tenant: &str,
    amount: i64,
) -> Result<i64, ChargeError> {
    let id = DB::fetch_i64_on(tx, "SELECT COALESCE(MAX(id), 0) + 1 FROM charges")
        .await
        .map_err(|_| ChargeError::Flaky)?;
    let sql =
        format!("INSERT INTO charges (id, tenant, amount) VALUES ({id}, '{tenant}', {amount})");
    DB::execute_on(tx, &sql)
        .await
        .map_err(|_| ChargeError::Flaky)?;
    Ok(id)
}

#[idempotent(scope = "tenant", step = CHARGE)]
async fn charge<DB: TestBackend>(
    tx: &mut DB::Connection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: ChargeRequest,
) -> Result<Payment, ChargeError> {
    assert!(req.trace_id.starts_with("trace-"));
    if req.amount < 0 {
        return Err(ChargeError::Declined);
    }
    let id = insert::<DB>(tx, &tenant, req.amount).await?;
    if req.amount == 13 {
        // Written, then a transient failure: must roll back.
        return Err(ChargeError::Flaky);
    }
    Ok(Payment {
        id,
        amount: req.amount,
    })
}

/// Blocks inside the body until `gate` gives a permit.
#[idempotent(scope = "tenant", step = SLOW_CHARGE, durable, lock_ttl = "1s")]
async fn slow_charge<DB: TestBackend>(
    tx: &mut DB::Connection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: ChargeRequest,
    gate: Arc<Semaphore>,
) -> Result<Payment, ChargeError> {
    let id = insert::<DB>(tx, &tenant, req.amount).await?;
    let _permit = gate.acquire().await.map_err(|_| ChargeError::Flaky)?;
    Ok(Payment {
        id,
        amount: req.amount,
    })
}

#[idempotent(scope = "tenant", step = SHORT_LIVED, retain = "1s")]
async fn short_lived<DB: TestBackend>(
    tx: &mut DB::Connection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: ChargeRequest,
) -> Result<Payment, ChargeError> {
    let id = insert::<DB>(tx, &tenant, req.amount).await?;
    Ok(Payment {
        id,
        amount: req.amount,
    })
}

async fn executes_once_then_replays<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let store = with_charges(harness(Policy::default()).await).await;
    let engine = store.engine.clone();
    let first = charge(&engine, "acme".into(), key("k-1"), req(2500))
        .await
        .unwrap();
    assert_eq!(first.via, Via::Executed);
    // A retry with a different trace id (skipped) replays.
    let again = charge(&engine, "acme".into(), key("k-1"), req(2500))
        .await
        .unwrap();
    assert_eq!(again.via, Via::Replayed);
    assert_eq!(again.value, first.value);
    assert_eq!(payments(&engine).await, 1);
    // Another tenant with the same key executes its own operation.
    let other = charge(&engine, "globex".into(), key("k-1"), req(2500))
        .await
        .unwrap();
    assert_eq!(other.via, Via::Executed);
    assert_eq!(payments(&engine).await, 2);
}

async fn deterministic_errors_replay_and_transient_ones_roll_back<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = with_charges(harness(Policy::default()).await).await;
    let engine = store.engine.clone();
    let declined = charge(&engine, "acme".into(), key("k-2"), req(-1))
        .await
        .unwrap();
    assert_eq!(declined.value, Err(ChargeError::Declined));
    let replayed = charge(&engine, "acme".into(), key("k-2"), req(-1))
        .await
        .unwrap();
    assert_eq!(
        (replayed.via, replayed.value),
        (Via::Replayed, Err(ChargeError::Declined))
    );

    let flaky = charge(&engine, "acme".into(), key("k-3"), req(13))
        .await
        .unwrap();
    assert_eq!(flaky.value, Err(ChargeError::Flaky));
    assert_eq!(
        payments(&engine).await,
        0,
        "the transient failure rolled its write back"
    );
    let retried = charge(&engine, "acme".into(), key("k-3"), req(13))
        .await
        .unwrap();
    assert_eq!(
        retried.via,
        Via::Executed,
        "nothing was stored, so the retry runs"
    );
}

async fn a_reused_key_with_another_request_is_refused<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = with_charges(harness(Policy::default()).await).await;
    let engine = store.engine.clone();
    charge(&engine, "acme".into(), key("k-4"), req(100))
        .await
        .unwrap();
    let error = charge(&engine, "acme".into(), key("k-4"), req(200))
        .await
        .unwrap_err();
    assert!(matches!(error, IdemError::Mismatch), "{error:?}");
    assert_eq!(payments(&engine).await, 1);
}

async fn a_running_attempt_answers_in_progress_then_crashes_and_is_taken_over<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = with_charges(harness(Policy::default()).await).await;
    let engine = store.engine.clone();
    let gate = Arc::new(Semaphore::new(0));
    let first = tokio::spawn({
        let (engine, gate) = (engine.clone(), gate.clone());
        async move { slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let error = slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate.clone())
        .await
        .unwrap_err();
    assert!(matches!(error, IdemError::InProgress { .. }), "{error:?}");

    // The first attempt crashes (its future is dropped mid-body).
    first.abort();
    let _ = first.await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    gate.add_permits(10);
    let taken = slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate.clone())
        .await
        .unwrap();
    assert_eq!(taken.via, Via::TookOver);
    assert_eq!(
        payments(&engine).await,
        1,
        "the crashed attempt's write was rolled back"
    );
    let replay = slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate)
        .await
        .unwrap();
    assert_eq!(replay.via, Via::Replayed);
}

async fn an_expired_record_is_treated_as_absent<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = with_charges(harness(Policy::default()).await).await;
    let engine = store.engine.clone();
    let first = short_lived(&engine, "acme".into(), key("k-6"), req(5))
        .await
        .unwrap();
    assert_eq!(first.via, Via::Executed);
    assert_eq!(
        short_lived(&engine, "acme".into(), key("k-6"), req(5))
            .await
            .unwrap()
            .via,
        Via::Replayed
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let later = short_lived(&engine, "acme".into(), key("k-6"), req(5))
        .await
        .unwrap();
    assert_eq!(later.via, Via::Executed);
    assert_eq!(payments(&engine).await, 2);
}
