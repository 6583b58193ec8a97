//! The fresh-first claim and the replay cache on real stores: keys and
//! scopes that need quoting travel intact, a repeat is answered from the
//! record read under the lock, and the cache answers only what the store
//! would, until the record's expiry.

mod support;

use std::time::Duration;

use idem_runtime::{
    IdemError, IdempotencyKey, Operation, Policy, Problem, ReplayCache, Scope, Via,
};
use support::{Harness, TestBackend};

fn operation(scope: &str, key: &str, amount: i64) -> Operation {
    Operation::new(
        Scope::tenant(scope),
        IdempotencyKey::new(key).unwrap(),
        "charge-card.v1",
        &amount,
    )
}

async fn charge<DB: TestBackend>(h: &Harness<DB>, op: &Operation) -> Result<Via, IdemError> {
    h.engine
        .run(op, async |tx| {
            DB::insert_payment(tx, "acme", 1).await?;
            Ok::<i64, Problem>(1)
        })
        .await
        .map(|answer| answer.via)
}

/// Quotes, backslashes, dollar quotes and non-ASCII scopes: each key is its
/// own, executed once, replayed after, refused with another request.
async fn keys_that_need_quoting_are_claimed_intact<DB: TestBackend>(h: Harness<DB>) {
    let keys = [
        "o'brien",
        "''",
        r"back\slash",
        r"\'",
        "$$x$$",
        "E'\\x00'",
        "k);DROP-TABLE-payments;--",
    ];
    let scopes = ["acme", "münchen's \\ shop", "$tag$"];
    let mut executed = 0;
    for scope in scopes {
        for key in keys {
            let op = operation(scope, key, 10);
            assert_eq!(
                charge(&h, &op).await.unwrap(),
                Via::Executed,
                "{scope} {key}"
            );
            executed += 1;
            assert_eq!(
                charge(&h, &op).await.unwrap(),
                Via::Replayed,
                "{scope} {key}"
            );
            let other = operation(scope, key, 11);
            assert!(
                matches!(charge(&h, &other).await, Err(IdemError::Mismatch)),
                "{scope} {key}"
            );
        }
    }
    assert_eq!(h.payments().await, executed);
    assert_eq!(h.records().await, executed);
}

/// A cached repeat is answered without the store (which is broken here);
/// another request under the same key still goes to the store.
async fn the_cache_answers_repeats_of_what_this_process_completed<DB: TestBackend>(h: Harness<DB>) {
    let cached = h
        .engine
        .clone()
        .with_replay_cache(ReplayCache::new(100, 1 << 20));
    let h = h.with_engine(cached);
    let op = operation("acme", "k-cached", 10);
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Executed);
    assert_eq!(h.engine.replay_cache().unwrap().len(), 1);
    let other = operation("acme", "k-cached", 11);
    assert!(matches!(charge(&h, &other).await, Err(IdemError::Mismatch)));
    h.break_key_table().await;
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Replayed);
    assert!(matches!(
        charge(&h, &other).await,
        Err(IdemError::Unavailable { .. })
    ));
    // Cleared (what an operator does after deleting keys): the store decides.
    h.engine.clear_replay_cache();
    assert!(matches!(
        charge(&h, &op).await,
        Err(IdemError::Unavailable { .. })
    ));
    assert_eq!(h.payments().await, 1);
}

/// An entry lives no longer than its record: once the retention has passed,
/// the repeat runs anew, as it would without the cache.
async fn the_cache_honours_the_records_expiry<DB: TestBackend>(h: Harness<DB>) {
    let cached = h
        .engine
        .clone()
        .with_replay_cache(ReplayCache::new(100, 1 << 20));
    let h = h.with_engine(cached);
    let op = operation("acme", "k-short", 10)
        .with_policy(Policy::default().with_retention(Duration::from_millis(50)));
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Executed);
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Replayed);
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Executed);
    assert_eq!(h.payments().await, 2);
}

macro_rules! backend_tests {
    ($module:ident, $harness:path) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn keys_that_need_quoting_are_claimed_intact() {
                super::keys_that_need_quoting_are_claimed_intact($harness(Policy::default()).await)
                    .await;
            }

            #[tokio::test]
            async fn the_cache_answers_repeats_of_what_this_process_completed() {
                super::the_cache_answers_repeats_of_what_this_process_completed(
                    $harness(Policy::default()).await,
                )
                .await;
            }

            #[tokio::test]
            async fn the_cache_honours_the_records_expiry() {
                super::the_cache_honours_the_records_expiry($harness(Policy::default()).await)
                    .await;
            }
        }
    };
}

backend_tests!(postgres, support::postgres);
backend_tests!(postgres_row_lock, support::postgres_row_lock);
backend_tests!(sqlite, support::sqlite);
