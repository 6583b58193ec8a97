//! `#[idempotent]` functions through the whole state table, on SQLite and on
//! Postgres: execute, replay, mismatch, in progress, takeover, expiry, and
//! transient errors rolling back.

use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, ErrorStatus, Fingerprint, IdemError, IdempotencyKey, Via};
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

/// The same functions for each backend, from one template.
macro_rules! backend {
    ($module:ident, $conn:ty, $db:ty, $engine:expr) => {
        mod $module {
            use super::*;
            use idem::sqlx::{self, Executor};

            type Engine = idem::Engine<$db>;

            async fn engine() -> Engine {
                let engine: Engine = $engine;
                engine.migrate().await.unwrap();
                engine.pool().execute("CREATE TABLE payments (id BIGINT PRIMARY KEY, tenant TEXT NOT NULL, amount BIGINT NOT NULL)").await.unwrap();
                engine
            }

            async fn payments(engine: &Engine) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM payments").fetch_one(engine.pool()).await.unwrap()
            }

            async fn insert(tx: &mut $conn, tenant: &str, amount: i64) -> Result<i64, ChargeError> {
                let id: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) + 1 FROM payments")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|_| ChargeError::Flaky)?;
                tx.execute(format!("INSERT INTO payments (id, tenant, amount) VALUES ({id}, '{tenant}', {amount})").as_str())
                    .await
                    .map_err(|_| ChargeError::Flaky)?;
                Ok(id)
            }

            #[idempotent(scope = "tenant", step = CHARGE)]
            async fn charge(
                tx: &mut $conn,
                tenant: String,
                key: IdempotencyKey,
                #[fingerprint] req: ChargeRequest,
            ) -> Result<Payment, ChargeError> {
                assert!(req.trace_id.starts_with("trace-"));
                if req.amount < 0 {
                    return Err(ChargeError::Declined);
                }
                let id = insert(tx, &tenant, req.amount).await?;
                if req.amount == 13 {
                    // Written, then a transient failure: must roll back.
                    return Err(ChargeError::Flaky);
                }
                Ok(Payment { id, amount: req.amount })
            }

            /// Blocks inside the body until `gate` gives a permit.
            #[idempotent(scope = "tenant", step = SLOW_CHARGE, durable, lock_ttl = "1s")]
            async fn slow_charge(
                tx: &mut $conn,
                tenant: String,
                key: IdempotencyKey,
                #[fingerprint] req: ChargeRequest,
                gate: Arc<Semaphore>,
            ) -> Result<Payment, ChargeError> {
                let id = insert(tx, &tenant, req.amount).await?;
                let _permit = gate.acquire().await.map_err(|_| ChargeError::Flaky)?;
                Ok(Payment { id, amount: req.amount })
            }

            #[idempotent(scope = "tenant", step = SHORT_LIVED, retain = "1s")]
            async fn short_lived(
                tx: &mut $conn,
                tenant: String,
                key: IdempotencyKey,
                #[fingerprint] req: ChargeRequest,
            ) -> Result<Payment, ChargeError> {
                let id = insert(tx, &tenant, req.amount).await?;
                Ok(Payment { id, amount: req.amount })
            }

            #[tokio::test]
            async fn executes_once_then_replays() {
                let engine = engine().await;
                let first = charge(&engine, "acme".into(), key("k-1"), req(2500)).await.unwrap();
                assert_eq!(first.via, Via::Executed);
                // A retry with a different trace id (skipped) replays.
                let again = charge(&engine, "acme".into(), key("k-1"), req(2500)).await.unwrap();
                assert_eq!(again.via, Via::Replayed);
                assert_eq!(again.value, first.value);
                assert_eq!(payments(&engine).await, 1);
                // Another tenant with the same key executes its own operation.
                let other = charge(&engine, "globex".into(), key("k-1"), req(2500)).await.unwrap();
                assert_eq!(other.via, Via::Executed);
                assert_eq!(payments(&engine).await, 2);
            }

            #[tokio::test]
            async fn deterministic_errors_replay_and_transient_ones_roll_back() {
                let engine = engine().await;
                let declined = charge(&engine, "acme".into(), key("k-2"), req(-1)).await.unwrap();
                assert_eq!(declined.value, Err(ChargeError::Declined));
                let replayed = charge(&engine, "acme".into(), key("k-2"), req(-1)).await.unwrap();
                assert_eq!((replayed.via, replayed.value), (Via::Replayed, Err(ChargeError::Declined)));

                let flaky = charge(&engine, "acme".into(), key("k-3"), req(13)).await.unwrap();
                assert_eq!(flaky.value, Err(ChargeError::Flaky));
                assert_eq!(payments(&engine).await, 0, "the transient failure rolled its write back");
                let retried = charge(&engine, "acme".into(), key("k-3"), req(13)).await.unwrap();
                assert_eq!(retried.via, Via::Executed, "nothing was stored, so the retry runs");
            }

            #[tokio::test]
            async fn a_reused_key_with_another_request_is_refused() {
                let engine = engine().await;
                charge(&engine, "acme".into(), key("k-4"), req(100)).await.unwrap();
                let error = charge(&engine, "acme".into(), key("k-4"), req(200)).await.unwrap_err();
                assert!(matches!(error, IdemError::Mismatch), "{error:?}");
                assert_eq!(payments(&engine).await, 1);
            }

            #[tokio::test]
            async fn a_running_attempt_answers_in_progress_then_crashes_and_is_taken_over() {
                let engine = engine().await;
                let gate = Arc::new(Semaphore::new(0));
                let first = tokio::spawn({
                    let (engine, gate) = (engine.clone(), gate.clone());
                    async move { slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate).await }
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                let error = slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate.clone()).await.unwrap_err();
                assert!(matches!(error, IdemError::InProgress { .. }), "{error:?}");

                // The first attempt crashes (its future is dropped mid-body).
                first.abort();
                let _ = first.await;
                tokio::time::sleep(Duration::from_millis(1200)).await;

                gate.add_permits(10);
                let taken = slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate.clone()).await.unwrap();
                assert_eq!(taken.via, Via::TookOver);
                assert_eq!(payments(&engine).await, 1, "the crashed attempt's write was rolled back");
                let replay = slow_charge(&engine, "acme".into(), key("k-5"), req(7), gate).await.unwrap();
                assert_eq!(replay.via, Via::Replayed);
            }

            #[tokio::test]
            async fn an_expired_record_is_treated_as_absent() {
                let engine = engine().await;
                let first = short_lived(&engine, "acme".into(), key("k-6"), req(5)).await.unwrap();
                assert_eq!(first.via, Via::Executed);
                assert_eq!(short_lived(&engine, "acme".into(), key("k-6"), req(5)).await.unwrap().via, Via::Replayed);
                tokio::time::sleep(Duration::from_millis(2100)).await;
                let later = short_lived(&engine, "acme".into(), key("k-6"), req(5)).await.unwrap();
                assert_eq!(later.via, Via::Executed);
                assert_eq!(payments(&engine).await, 2);
            }
        }
    };
}

backend!(sqlite, idem::sqlx::SqliteConnection, idem::sqlx::Sqlite, {
    let (dir, path) = idem_runtime::test_support::sqlite_file();
    std::mem::forget(dir); // keep the file for the test's life
    idem::Engine::<idem::sqlx::Sqlite>::open_sqlite(path)
        .await
        .unwrap()
});

backend!(postgres, idem::sqlx::PgConnection, idem::sqlx::Postgres, {
    let url = idem_runtime::test_support::postgres()
        .fresh_database()
        .await;
    idem::Engine::<idem::sqlx::Postgres>::connect_postgres(&url)
        .await
        .unwrap()
});
