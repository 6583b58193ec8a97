//! The guide's test plan and every row of the state table, run against a real
//! SQLite file and a real Postgres server, there with each kind of key lock,
//! and a real MariaDB server (the MySQL backend).
//! Each case counts rows in a business table to assert exactly how many side
//! effects happened.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use idem_runtime::{
    Claim, ClaimMode, Engine, FailureMode, IdemError, IdempotencyKey, Operation, Policy, Problem,
    Scope, Via,
};

use idem_test_support::{operation, Harness, TestBackend};

idem_test_support::on_each_store! {
    stores: sqlite, postgres, postgres_row_lock, mysql;
    #[tokio::test]
    first_attempt_executes_and_retries_replay,
    #[tokio::test]
    a_pool_of_one_connection_is_enough,
    #[tokio::test]
    lost_response_after_commit_then_retry_replays,
    #[tokio::test]
    process_abort_after_commit_then_retry_replays,
    #[tokio::test]
    process_abort_before_commit_then_retry_executes,
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    concurrent_duplicates_execute_exactly_once,
    #[tokio::test]
    replay_after_expiry_executes_anew,
    #[tokio::test]
    expired_record_with_another_payload_executes_anew,
    #[tokio::test]
    same_key_with_mutated_payload_is_a_mismatch,
    #[tokio::test]
    server_error_stores_nothing_and_the_retry_executes,
    #[tokio::test]
    deterministic_client_error_is_stored_and_replayed,
    #[tokio::test]
    panic_in_the_work_stores_nothing_and_the_retry_executes,
    #[tokio::test]
    cancelled_work_stores_nothing_and_the_retry_executes,
    #[tokio::test]
    work_timeout_rolls_back,
    #[tokio::test]
    waiter_on_an_uncommitted_claim_times_out_then_replays,
    #[tokio::test]
    expired_in_progress_lock_is_taken_over,
    #[tokio::test]
    attempt_that_lost_its_lock_rolls_back,
    #[tokio::test]
    durable_server_error_releases_the_claim,
    #[tokio::test]
    awkward_keys_and_scopes_round_trip,
    #[tokio::test]
    scopes_never_see_each_others_records,
    #[tokio::test]
    store_unavailable_fails_closed_without_running,
    #[tokio::test]
    store_unavailable_fails_open_when_configured,
    #[tokio::test]
    purge_deletes_expired_records_in_batches,
    #[tokio::test]
    purge_batches_cross_records_that_expire_together,
    #[tokio::test]
    migrations_are_idempotent_and_live_steps_are_listed,
}

// The row path with its waits bounded by `SET LOCAL`: the bodies where a
// claim waits for a key, locks an existing record or takes one over.
idem_test_support::on_each_store! {
    stores: postgres_set_local;
    #[tokio::test]
    first_attempt_executes_and_retries_replay,
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    concurrent_duplicates_execute_exactly_once,
    #[tokio::test]
    replay_after_expiry_executes_anew,
    #[tokio::test]
    waiter_on_an_uncommitted_claim_times_out_then_replays,
    #[tokio::test]
    expired_in_progress_lock_is_taken_over,
    #[tokio::test]
    attempt_that_lost_its_lock_rolls_back,
}

/// Engines cross threads and tasks.
#[allow(dead_code)]
fn _engines_are_send_sync(
    sqlite: Engine<sqlx::Sqlite>,
    postgres: Engine<sqlx::Postgres>,
) -> impl Send + Sync {
    (sqlite, postgres)
}

/// The business write: one payment row, answered with the amount.
async fn charge<DB: TestBackend>(
    h: &Harness<DB>,
    op: &Operation,
    amount: i64,
) -> Result<idem_runtime::Answer<Result<i64, Problem>>, IdemError> {
    let tenant = op.scope().to_string();
    h.engine
        .run(op, async move |tx| {
            DB::insert_payment(tx, &tenant, amount).await?;
            Ok(amount)
        })
        .await
}

async fn first_attempt_executes_and_retries_replay<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let op = operation("acme", "k-1", 2500);
    let first = charge(&h, &op, 2500).await.unwrap();
    assert_eq!((first.via, first.value.clone()), (Via::Executed, Ok(2500)));
    for _ in 0..3 {
        let again = charge(&h, &op, 2500).await.unwrap();
        assert_eq!((again.via, again.value), (Via::Replayed, Ok(2500)));
    }
    assert_eq!(h.payments().await, 1);
}

/// A claim reads, locks and works on one connection: a pool of one
/// serves fresh keys, replays and mismatches without waiting on itself.
async fn a_pool_of_one_connection_is_enough<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let policy = Policy {
        wait_timeout: Duration::from_secs(2),
        ..Policy::default()
    };
    let pool = <DB as TestBackend>::pool_of(h.db.url(), &policy, 1).await;
    let engine = h.engine.clone().with_pool(pool).with_policy(policy);
    let single = h.with_engine(engine);
    let op = operation("acme", "k-one", 700);
    let first = charge(&single, &op, 700).await.unwrap();
    let again = charge(&single, &op, 700).await.unwrap();
    assert_eq!((first.via, again.via), (Via::Executed, Via::Replayed));
    let other = operation("acme", "k-one", 701);
    assert!(matches!(
        charge(&single, &other, 701).await,
        Err(IdemError::Mismatch)
    ));
    assert_eq!(single.payments().await, 1);
}

/// Crash after commit, before the response is sent: the result is
/// dropped on the floor; the retry gets the stored answer.
async fn lost_response_after_commit_then_retry_replays<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let op = operation("acme", "lost-response", 700);
    drop(charge(&h, &op, 700).await);
    let retry = charge(&h, &op, 700).await.unwrap();
    assert_eq!((retry.via, retry.value), (Via::Replayed, Ok(700)));
    assert_eq!(h.payments().await, 1);
}

/// Crash after commit, for real: a child process commits and aborts
/// before answering. The retry replays; one effect.
async fn process_abort_after_commit_then_retry_replays<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    abort_in_child_then_retry(&h, "after-commit", 900, 1, Via::Replayed).await;
}

/// A crash between the business write and the commit leaves nothing:
/// the retry executes, exactly one effect in the end.
async fn process_abort_before_commit_then_retry_executes<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    abort_in_child_then_retry(&h, "before-commit", 300, 0, Via::Executed).await;
}

/// A child process charges `amount` under key `abort-<mode>` and aborts at
/// `mode`, leaving `left` payments; the retry answers `via`, one effect in the end.
async fn abort_in_child_then_retry<DB: TestBackend>(
    h: &Harness<DB>,
    mode: &str,
    amount: i64,
    left: i64,
    via: Via,
) {
    let key = format!("abort-{mode}");
    let status = h.run_child(mode, "acme", &key, amount);
    assert!(
        !status.success(),
        "the child must die by abort, got {status:?}"
    );
    assert_eq!(
        h.payments().await,
        left,
        "after-commit work is durable, uncommitted work is gone"
    );
    let retry = charge(h, &operation("acme", &key, amount), amount)
        .await
        .unwrap();
    assert_eq!((retry.via, retry.value), (via, Ok(amount)));
    assert_eq!(h.payments().await, 1);
}

/// 64 concurrent duplicates per key, for many keys, on a pool of 8:
/// one effect per key, every other attempt a replay or an in-progress error.
async fn concurrent_duplicates_execute_exactly_once<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = Arc::new(harness(Policy::default()).await);
    let keys = 8;
    for k in 0..keys {
        let key = format!("storm-{k}");
        let attempts = (0..64).map(|_| {
            let h = h.clone();
            let key = key.clone();
            tokio::spawn(async move { charge(&h, &operation("acme", &key, 100), 100).await })
        });
        let results = join_all(attempts).await;
        let (mut executed, mut replayed, mut in_progress) = (0, 0, 0);
        for result in results {
            match result.expect("no panic") {
                Ok(done) if done.via == Via::Executed => executed += 1,
                Ok(done) if done.via == Via::Replayed => {
                    assert_eq!(done.value, Ok(100));
                    replayed += 1
                }
                Err(IdemError::InProgress { retry_after }) => {
                    assert!(retry_after >= Duration::from_secs(1));
                    in_progress += 1
                }
                other => panic!("unexpected attempt result: {other:?}"),
            }
        }
        assert_eq!(executed, 1, "key {key}: exactly one execution");
        assert_eq!(executed + replayed + in_progress, 64);
    }
    assert_eq!(h.payments().await, keys);
}

async fn replay_after_expiry_executes_anew<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default().with_retention(Duration::from_millis(300))).await;
    let op = operation("acme", "expiring", 50);
    assert_eq!(charge(&h, &op, 50).await.unwrap().via, Via::Executed);
    assert_eq!(charge(&h, &op, 50).await.unwrap().via, Via::Replayed);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        charge(&h, &op, 50).await.unwrap().via,
        Via::Executed,
        "an expired record counts as absent"
    );
    assert_eq!(charge(&h, &op, 50).await.unwrap().via, Via::Replayed);
    assert_eq!(h.payments().await, 2);
}

async fn expired_record_with_another_payload_executes_anew<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default().with_retention(Duration::from_millis(200))).await;
    charge(&h, &operation("acme", "expired-reuse", 1), 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reused = charge(&h, &operation("acme", "expired-reuse", 2), 2)
        .await
        .unwrap();
    assert_eq!((reused.via, reused.value), (Via::Executed, Ok(2)));
    assert_eq!(h.payments().await, 2);
}

async fn same_key_with_mutated_payload_is_a_mismatch<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    charge(&h, &operation("acme", "reused", 2500), 2500)
        .await
        .unwrap();
    let mutated = charge(&h, &operation("acme", "reused", 9999), 9999).await;
    assert!(matches!(mutated, Err(IdemError::Mismatch)), "{mutated:?}");
    let step_changed = Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new("reused").unwrap(),
        "refund.v1",
        &2500i64,
    );
    assert!(matches!(
        charge(&h, &step_changed, 2500).await,
        Err(IdemError::Mismatch)
    ));
    assert_eq!(h.payments().await, 1);
    // The original request still replays.
    assert_eq!(
        charge(&h, &operation("acme", "reused", 2500), 2500)
            .await
            .unwrap()
            .via,
        Via::Replayed
    );
}

async fn server_error_stores_nothing_and_the_retry_executes<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let op = operation("acme", "flaky", 10);
    let failed = h
        .engine
        .run(&op, async move |tx| {
            DB::insert_payment(tx, "acme", 10).await?;
            Err::<i64, _>(Problem::new(503, "downstream timed out"))
        })
        .await
        .unwrap();
    assert_eq!(failed.via, Via::Executed);
    assert_eq!(failed.value.unwrap_err().status, 503);
    assert_eq!(
        h.payments().await,
        0,
        "the business write rolled back with the claim"
    );
    assert_eq!(h.records().await, 0);
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Executed);
    assert_eq!(h.payments().await, 1);
}

async fn deterministic_client_error_is_stored_and_replayed<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let op = operation("acme", "declined", 10);
    let runs = AtomicUsize::new(0);
    for expected in [Via::Executed, Via::Replayed] {
        let runs = &runs;
        let done = h
            .engine
            .run(&op, async move |_tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<i64, _>(Problem::new(402, "Card declined").with_detail("Use another card."))
            })
            .await
            .unwrap();
        assert_eq!(done.via, expected);
        assert_eq!(
            done.value,
            Err(Problem::new(402, "Card declined").with_detail("Use another card."))
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn panic_in_the_work_stores_nothing_and_the_retry_executes<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = Arc::new(harness(Policy::default()).await);
    let op = operation("acme", "panics", 10);
    let task = {
        let (h, op) = (h.clone(), op.clone());
        tokio::spawn(async move {
            h.engine
                .run(&op, async move |tx| {
                    DB::insert_payment(tx, "acme", 10).await.unwrap();
                    panic!("handler bug");
                    #[allow(unreachable_code)]
                    Ok::<i64, Problem>(0)
                })
                .await
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(h.payments().await, 0);
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Executed);
    assert_eq!(h.payments().await, 1);
}

async fn cancelled_work_stores_nothing_and_the_retry_executes<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let op = operation("acme", "cancelled", 10);
    let hanging = h.engine.run(&op, async move |tx| {
        DB::insert_payment(tx, "acme", 10).await?;
        std::future::pending::<()>().await;
        Ok::<i64, Problem>(0)
    });
    assert!(tokio::time::timeout(Duration::from_millis(200), hanging)
        .await
        .is_err());
    assert_eq!(h.payments().await, 0);
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Executed);
    assert_eq!(h.payments().await, 1);
    assert_eq!(h.records().await, 1);
}

async fn work_timeout_rolls_back<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default().with_work_timeout(Duration::from_millis(100))).await;
    let op = operation("acme", "slow", 10);
    let slow = h
        .engine
        .run(&op, async move |tx| {
            DB::insert_payment(tx, "acme", 10).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<i64, Problem>(0)
        })
        .await;
    assert!(matches!(slow, Err(IdemError::TimedOut { .. })), "{slow:?}");
    assert_eq!((h.payments().await, h.records().await), (0, 0));
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Executed);
}

/// A duplicate blocked on an uncommitted claim waits at most the
/// bound, then gets in-progress; once the winner commits, it replays.
async fn waiter_on_an_uncommitted_claim_times_out_then_replays<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default().with_wait_timeout(Duration::from_millis(300))).await;
    let op = operation("acme", "slow-winner", 10);
    let Claim::Execute(mut winner) = h.engine.claim(&op).await.unwrap() else {
        panic!("first claim executes")
    };
    DB::insert_payment(&mut *winner, "acme", 10).await.unwrap();
    let started = std::time::Instant::now();
    let waiter = charge(&h, &op, 10).await;
    assert!(
        matches!(waiter, Err(IdemError::InProgress { .. })),
        "{waiter:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waited {:?}",
        started.elapsed()
    );
    let stored = idem_runtime::StoredResponse {
        status: 200,
        content_type: "application/json".into(),
        body: b"10".to_vec(),
        headers: Vec::new(),
    };
    winner.commit(stored).await.unwrap();
    let after = charge(&h, &op, 10).await.unwrap();
    assert_eq!((after.via, after.value), (Via::Replayed, Ok(10)));
    assert_eq!(h.payments().await, 1);
}

/// Durable claims: a crashed attempt leaves an in_progress row; a
/// retry gets 409 with the seconds left, a changed body 422, and
/// once the lock expires the same request takes over.
async fn expired_in_progress_lock_is_taken_over<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let policy = Policy::default()
        .with_claim_mode(ClaimMode::Durable)
        .with_lock_ttl(Duration::from_millis(1500));
    let h = harness(policy).await;
    let op = operation("acme", "crashed", 10);
    let Claim::Execute(crashed) = h.engine.claim(&op).await.unwrap() else {
        panic!("executes")
    };
    drop(crashed); // the process died mid-work
    match charge(&h, &op, 10).await {
        Err(IdemError::InProgress { retry_after }) => {
            assert!(retry_after >= Duration::from_secs(1) && retry_after <= Duration::from_secs(2))
        }
        other => panic!("expected in-progress, got {other:?}"),
    }
    assert!(matches!(
        charge(&h, &operation("acme", "crashed", 11), 11).await,
        Err(IdemError::Mismatch)
    ));
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let taken = charge(&h, &op, 10).await.unwrap();
    assert_eq!((taken.via, taken.value), (Via::TookOver, Ok(10)));
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Replayed);
    assert_eq!(h.payments().await, 1);
}

/// A slow durable attempt whose lock expired and was taken over
/// cannot complete: its writes roll back.
async fn attempt_that_lost_its_lock_rolls_back<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let policy = Policy::default()
        .with_claim_mode(ClaimMode::Durable)
        .with_lock_ttl(Duration::from_millis(200));
    let h = harness(policy).await;
    let op = operation("acme", "slow-durable", 10);
    let Claim::Execute(mut slow) = h.engine.claim(&op).await.unwrap() else {
        panic!("executes")
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::TookOver);
    DB::insert_payment(&mut *slow, "acme", 10).await.unwrap();
    let stored = idem_runtime::StoredResponse {
        status: 200,
        content_type: "application/json".into(),
        body: b"10".to_vec(),
        headers: Vec::new(),
    };
    assert!(matches!(
        slow.commit(stored).await,
        Err(IdemError::LockLost)
    ));
    assert_eq!(h.payments().await, 1);
}

/// A durable attempt that fails with a server error releases its
/// claim, so the retry runs at once.
async fn durable_server_error_releases_the_claim<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default().with_claim_mode(ClaimMode::Durable)).await;
    let op = operation("acme", "durable-flaky", 10);
    let failed = h
        .engine
        .run(&op, async move |_tx| {
            Err::<i64, _>(Problem::new(500, "boom"))
        })
        .await
        .unwrap();
    assert!(failed.value.is_err());
    assert_eq!(h.records().await, 0);
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Executed);
    assert_eq!(charge(&h, &op, 10).await.unwrap().via, Via::Replayed);
    assert_eq!(h.payments().await, 1);
}

/// Keys and scopes holding quotes, backslashes, semicolons and
/// non-ASCII text round-trip exactly (some statements carry them
/// as hex literals).
async fn awkward_keys_and_scopes_round_trip<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let key = r#"a'b"c\d;--e$$f%g"#;
    let tenant = "tenant 'ü' \\ ; DROP TABLE payments; --";
    let first = charge(&h, &operation(tenant, key, 7), 7).await.unwrap();
    let again = charge(&h, &operation(tenant, key, 7), 7).await.unwrap();
    assert_eq!((first.via, again.via), (Via::Executed, Via::Replayed));
    assert_eq!(again.value, Ok(7));
    assert!(matches!(
        charge(&h, &operation(tenant, key, 8), 8).await,
        Err(IdemError::Mismatch)
    ));
    assert_eq!(h.payments().await, 1);
}

async fn scopes_never_see_each_others_records<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let a = charge(&h, &operation("tenant-a", "shared-key", 111), 111)
        .await
        .unwrap();
    let b = charge(&h, &operation("tenant-b", "shared-key", 222), 222)
        .await
        .unwrap();
    assert_eq!((a.via, a.value), (Via::Executed, Ok(111)));
    assert_eq!(
        (b.via, b.value),
        (Via::Executed, Ok(222)),
        "B runs its own operation, never sees A's"
    );
    let caller = Operation::new(
        Scope::tenant("tenant-a").with_caller("api"),
        IdempotencyKey::new("shared-key").unwrap(),
        "charge-card.v1",
        &333i64,
    );
    assert_eq!(charge(&h, &caller, 333).await.unwrap().via, Via::Executed);
    assert_eq!(h.payments().await, 3);
}

async fn store_unavailable_fails_closed_without_running<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    h.break_key_table().await;
    let ran = AtomicUsize::new(0);
    let ran_ref = &ran;
    let result = h
        .engine
        .run(&operation("acme", "down", 1), async move |_tx| {
            ran_ref.fetch_add(1, Ordering::SeqCst);
            Ok::<i64, Problem>(1)
        })
        .await;
    match result {
        Err(IdemError::Unavailable { retry_after, .. }) => {
            assert_eq!(retry_after, Duration::from_secs(1))
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

async fn store_unavailable_fails_open_when_configured<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default().with_failure_mode(FailureMode::Open)).await;
    h.break_key_table().await;
    let done = charge(&h, &operation("acme", "down-open", 5), 5)
        .await
        .unwrap();
    assert_eq!((done.via, done.value), (Via::FailedOpen, Ok(5)));
    assert_eq!(h.payments().await, 1);
    assert_eq!(h.engine.stats().failed_open, 1);
}

async fn purge_deletes_expired_records_in_batches<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let short = Policy::default().with_retention(Duration::from_millis(1));
    for i in 0..25 {
        charge(
            &h,
            &operation("acme", &format!("old-{i}"), i).with_policy(short),
            i,
        )
        .await
        .unwrap();
    }
    for i in 0..5 {
        charge(&h, &operation("acme", &format!("new-{i}"), i), i)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(h.engine.purge_expired(10).await.unwrap(), 25);
    assert_eq!(h.records().await, 5);
    assert_eq!(h.engine.purge_expired(10).await.unwrap(), 0);
    assert_eq!(
        charge(&h, &operation("acme", "new-0", 0), 0)
            .await
            .unwrap()
            .via,
        Via::Replayed
    );
}

/// Batches continue where the previous one stopped, also when
/// many records expire at the same instant across a batch's edge.
async fn purge_batches_cross_records_that_expire_together<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let short = Policy::default().with_retention(Duration::from_millis(1));
    for i in 0..25 {
        charge(
            &h,
            &operation("acme", &format!("old-{i}"), i).with_policy(short),
            i,
        )
        .await
        .unwrap();
    }
    charge(&h, &operation("acme", "new", 1), 1).await.unwrap();
    // `old-1` and `old-10` .. `old-19` expire at one instant,
    // older than the others.
    let tie = if DB::MODULE == "postgres" {
        "UPDATE idempotency_keys SET expires_at = now() - interval '1 hour' WHERE key LIKE 'old-1%'"
    } else if DB::MODULE == "mysql" {
        // `key` is a reserved word in MySQL.
        "UPDATE idempotency_keys SET expires_at = 1000 WHERE `key` LIKE 'old-1%'"
    } else {
        "UPDATE idempotency_keys SET expires_at = 1000 WHERE key LIKE 'old-1%'"
    };
    DB::execute(h.engine.pool(), tie).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(h.engine.purge_expired(4).await.unwrap(), 25);
    assert_eq!(h.records().await, 1);
}

async fn migrations_are_idempotent_and_live_steps_are_listed<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    h.engine.migrate().await.expect("migrate");
    h.engine.migrate().await.expect("migrate again");
    charge(&h, &operation("acme", "live", 1), 1).await.unwrap();
    assert_eq!(
        h.engine.live_steps().await.unwrap(),
        vec!["charge-card.v1".to_string()]
    );
}

/// A Postgres server that does not answer: the claim fails closed quickly and
/// the work never runs.
#[tokio::test]
async fn postgres_server_down_fails_closed() {
    use idem_runtime::{Engine, IdemError, IdempotencyKey, Operation, Policy, Problem, Scope};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = idem_runtime::store::postgres::pool_options(&Policy::default(), 2)
        .acquire_timeout(std::time::Duration::from_millis(500))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/none"))
        .unwrap();
    let engine = Engine::<sqlx::Postgres>::new(pool);
    let op = Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new("k").unwrap(),
        "charge-card.v1",
        &1i64,
    );
    let mut ran = false;
    let result = engine
        .run(&op, async |_tx| {
            ran = true;
            Ok::<i64, Problem>(1)
        })
        .await;
    assert!(
        matches!(result, Err(IdemError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(!ran);
}

/// A claim bounds only its own lock waits: the work runs with the session's
/// `lock_timeout`, for either kind of key lock and either way of bounding
/// the row path's waits, on a fresh key and on a key whose expired record
/// the claim locks.
#[tokio::test]
async fn postgres_work_runs_with_the_sessions_lock_timeout() {
    use idem_runtime::{
        IdempotencyKey, KeyLock, Operation, Policy, Problem, Scope, Via, WaitBound,
    };
    use std::time::Duration;
    for (key_lock, wait_bound) in [
        (KeyLock::Advisory, WaitBound::SetConfig),
        (KeyLock::Row, WaitBound::SetConfig),
        (KeyLock::Row, WaitBound::SetLocal),
    ] {
        let policy = Policy::default()
            .with_retention(Duration::from_millis(1))
            .with_wait_timeout(Duration::from_millis(750));
        let h = idem_test_support::stores::postgres(policy).await;
        let engine = h
            .engine
            .clone()
            .with_key_lock(key_lock)
            .with_wait_bound(wait_bound);
        let op = Operation::new(
            Scope::tenant("acme"),
            IdempotencyKey::new("k").unwrap(),
            "charge-card.v1",
            &1i64,
        );
        for round in ["fresh key", "expired record"] {
            let done = engine
                .run(&op, async |tx| {
                    sqlx::query_scalar::<_, String>("SHOW lock_timeout")
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(Problem::from)
                })
                .await
                .unwrap();
            assert_eq!(done.via, Via::Executed, "{key_lock:?}, {round}");
            assert_eq!(done.value.unwrap(), "0", "{key_lock:?}, {round}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `version()` as each engine shows it, and what claims take there:
/// CockroachDB's as its `cockroach sql` banner prints it (docs), YugabyteDB's
/// server versions on Postgres 11 and on Postgres 15 (2.25 and later) as its
/// `psql` banner prints them, completed to `version()`'s form, and a
/// Postgres 15 of Debian's.
#[test]
fn servers_are_told_apart_by_their_version() {
    use idem_runtime::{KeyLock, Server};
    for (version, server, key_lock) in [
        (
            "CockroachDB CCL v21.1.1 (x86_64-apple-darwin19, built 2021/05/24 15:00:00, go1.15.11)",
            Server::CockroachDb,
            KeyLock::Row,
        ),
        (
            "CockroachDB CCL v20.1.15 (x86_64-unknown-linux-gnu, built 2021/04/26 16:11:58, go1.13.9)",
            Server::CockroachDb,
            KeyLock::Row,
        ),
        (
            "PostgreSQL 11.2-YB-2.18.0.1-b0 on x86_64-pc-linux-gnu, compiled by clang, 64-bit",
            Server::YugabyteDb,
            KeyLock::Row,
        ),
        (
            "PostgreSQL 15.2-YB-2.25.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang, 64-bit",
            Server::YugabyteDb,
            KeyLock::Row,
        ),
        (
            "PostgreSQL 15.8 (Debian 15.8-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14) 12.2.0, 64-bit",
            Server::Postgres,
            KeyLock::Advisory,
        ),
    ] {
        assert_eq!(Server::from_version(version), server, "{version}");
        assert_eq!(server.key_lock(), key_lock, "{version}");
    }
}

/// On the test Postgres server detection keeps advisory locks, and a lock
/// chosen before it stays chosen.
#[tokio::test]
async fn postgres_detection_keeps_advisory_locks_and_a_chosen_lock() {
    use idem_runtime::{KeyLock, Server};
    let h = idem_test_support::stores::postgres(Policy::default()).await;
    assert_eq!(
        Server::detect(h.engine.pool()).await.unwrap(),
        Server::Postgres
    );
    let detected = h.engine.clone().detect_server().await.unwrap();
    assert_eq!(detected.key_lock(), KeyLock::Advisory);
    let chosen = h
        .engine
        .clone()
        .with_key_lock(KeyLock::Row)
        .detect_server()
        .await
        .unwrap();
    assert_eq!(chosen.key_lock(), KeyLock::Row);
    let op = operation("acme", "detected", 10);
    assert_eq!(
        detected
            .run(&op, async |_tx| Ok::<_, Problem>(1))
            .await
            .unwrap()
            .via,
        Via::Executed
    );
}
