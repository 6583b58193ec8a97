//! SQLite group commit: concurrent claims of one engine share the writer's
//! transaction and its `COMMIT`. Every guarantee of a claim in a transaction
//! of its own holds: a turn that fails, panics or is cancelled rolls back
//! alone; a duplicate in the same batch replays; a process killed at the
//! batch's commit leaves every key of the batch complete or absent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{IdemError, Policy, Problem, Via};
use idem_test_support::{on_each_store, operation, Harness, TestBackend, BATCH_CHILD_CHARGES};
use tokio::task::JoinSet;

/// `charges` claims at once, each writing one payment; every `fail_every`th
/// one answers a 503 after its write (rolled back), `panic_at` panics.
async fn concurrently<DB: TestBackend>(
    h: &Harness<DB>,
    charges: usize,
    fail_every: usize,
    panic_at: Option<usize>,
) -> Vec<Result<Result<Via, IdemError>, tokio::task::JoinError>> {
    let mut set = JoinSet::new();
    for i in 0..charges {
        let engine = h.engine.clone();
        set.spawn(async move {
            let op = operation("acme", &format!("k-{i}"), 1);
            engine
                .run(&op, async move |tx| {
                    DB::insert_payment(tx, "acme", 1).await?;
                    if Some(i) == panic_at {
                        panic!("the work panics mid-turn");
                    }
                    if fail_every > 0 && i % fail_every == 0 {
                        return Err(Problem::new(503, "ledger down"));
                    }
                    Ok::<i64, Problem>(1)
                })
                .await
                .map(|answer| answer.via)
        });
    }
    let mut results = Vec::new();
    while let Some(result) = set.join_next().await {
        results.push(result);
    }
    results
}

/// 32 concurrent claims: each executes once, the rolled-back ones (every
/// fourth answers 503) leave no row and no record, the others commit.
async fn turns_roll_back_alone<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default()).await;
    let results = concurrently(&h, 32, 4, None).await;
    assert!(results.iter().all(|r| matches!(r, Ok(Ok(Via::Executed)))));
    assert_eq!((h.payments().await, h.records().await), (24, 24));
    // Every kept claim replays; every rolled-back one runs again.
    let again = concurrently(&h, 32, 0, None).await;
    let executed = again
        .iter()
        .filter(|r| matches!(r, Ok(Ok(Via::Executed))))
        .count();
    assert_eq!(executed, 8);
    assert_eq!(h.payments().await, 32);
}

/// A turn that panics mid-work is rolled back when its future is dropped;
/// the turns batched with it commit.
async fn a_panicking_turn_rolls_back_alone<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let results = concurrently(&h, 16, 0, Some(5)).await;
    assert_eq!(
        results.iter().filter(|r| r.is_err()).count(),
        1,
        "one panic"
    );
    assert_eq!((h.payments().await, h.records().await), (15, 15));
    let retry = concurrently(&h, 16, 0, None).await;
    let executed = retry
        .iter()
        .filter(|r| matches!(r, Ok(Ok(Via::Executed))))
        .count();
    assert_eq!((executed, h.payments().await), (1, 16));
}

/// 64 duplicates of one key, all in flight together: one execution, every
/// other a replay of it (they wait their turn; none is told 409).
async fn duplicates_latch_onto_the_first<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default().with_wait_timeout(Duration::from_secs(10))).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..64 {
        let (engine, runs) = (h.engine.clone(), runs.clone());
        set.spawn(async move {
            engine
                .run(&operation("acme", "k-storm", 7), async move |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    DB::insert_payment(tx, "acme", 7).await?;
                    Ok::<i64, Problem>(7)
                })
                .await
                .map(|answer| (answer.via, answer.value))
        });
    }
    let mut vias = Vec::new();
    while let Some(result) = set.join_next().await {
        let (via, value) = result
            .unwrap()
            .expect("a replay or the execution, never 409");
        assert_eq!(value, Ok(7));
        vias.push(via);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(vias.iter().filter(|via| **via == Via::Executed).count(), 1);
    assert_eq!(h.payments().await, 1);
}

/// With group commit off, claims commit alone and keep every guarantee.
async fn group_commit_off<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default().with_group_commit(None)).await;
    let results = concurrently(&h, 16, 4, None).await;
    assert!(results.iter().all(|r| matches!(r, Ok(Ok(Via::Executed)))));
    assert_eq!((h.payments().await, h.records().await), (12, 12));
}

/// A child process runs a batch of charges and is killed at the batch's
/// commit: before it, every key is absent and each retry executes once;
/// after it, every key is complete and each retry replays.
async fn killed_at_the_batch_commit<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    for (mode, left, via) in [
        ("batch-before-commit", 0, Via::Executed),
        (
            "batch-after-commit",
            BATCH_CHILD_CHARGES as i64,
            Via::Replayed,
        ),
    ] {
        let h = harness(Policy::default()).await;
        let status = h.run_child(mode, "acme", "batch", 1);
        assert!(
            !status.success(),
            "{mode}: the child must die, got {status:?}"
        );
        // The first batch may have held fewer than all the charges: those
        // after it never ran. Each key is complete with its row, or absent.
        let (payments, records) = (h.payments().await, h.records().await);
        assert_eq!(
            payments, records,
            "{mode}: a record for each row, a row for each record"
        );
        if left == 0 {
            assert_eq!(payments, 0, "{mode}: the batch's writes are gone");
        } else {
            assert!(payments >= 1, "{mode}: the batch's writes are durable");
        }
        let mut executed = 0;
        for i in 0..BATCH_CHILD_CHARGES {
            let op = operation("acme", &format!("batch-{i}"), 1);
            let answer = h
                .engine
                .run(&op, async |tx| {
                    DB::insert_payment(tx, "acme", 1).await?;
                    Ok::<i64, Problem>(1)
                })
                .await
                .unwrap();
            assert_eq!(answer.value, Ok(1));
            if answer.via == Via::Executed {
                executed += 1;
            }
            if left == 0 {
                assert_eq!(answer.via, via, "{mode}: key {i}");
            }
        }
        assert_eq!(executed as i64, BATCH_CHILD_CHARGES as i64 - payments);
        assert_eq!(
            h.payments().await,
            BATCH_CHILD_CHARGES as i64,
            "{mode}: once each"
        );
    }
}

/// Another writer of the database file (another process, here another
/// connection) holds its write lock past the claims' wait: a repeat is
/// still answered from the record (never refused as busy), and a fresh key
/// waits for the lock and then runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_is_answered_while_another_process_writes() {
    use idem::sqlx::{Connection, Executor, SqliteConnection};

    let wait = Duration::from_millis(300);
    let h = idem_test_support::stores::sqlite(Policy::default().with_wait_timeout(wait)).await;
    let charge = async |key: &str| {
        h.engine
            .run(&operation("acme", key, 1), async |tx| {
                <idem::sqlx::Sqlite as TestBackend>::insert_payment(tx, "acme", 1).await?;
                Ok::<i64, Problem>(1)
            })
            .await
    };
    assert_eq!(charge("k-done").await.unwrap().via, Via::Executed);

    let mut other = SqliteConnection::connect(h.db.url()).await.unwrap();
    other.execute("BEGIN IMMEDIATE").await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(charge("k-done").await.unwrap().via, Via::Replayed);
    assert!(
        started.elapsed() < wait + Duration::from_secs(1),
        "the repeat waited {:?} for the other writer",
        started.elapsed()
    );

    let fresh = tokio::spawn({
        let engine = h.engine.clone();
        async move {
            engine
                .run(&operation("acme", "k-fresh", 1), async |tx| {
                    <idem::sqlx::Sqlite as TestBackend>::insert_payment(tx, "acme", 1).await?;
                    Ok::<i64, Problem>(1)
                })
                .await
                .map(|answer| answer.via)
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    other.execute("COMMIT").await.unwrap();
    assert_eq!(fresh.await.unwrap().unwrap(), Via::Executed);
    assert_eq!((h.payments().await, h.records().await), (2, 2));
}

on_each_store! {
    stores: sqlite;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    turns_roll_back_alone,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_panicking_turn_rolls_back_alone,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    duplicates_latch_onto_the_first,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    group_commit_off,
    #[tokio::test]
    killed_at_the_batch_commit,
}
