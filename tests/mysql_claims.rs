//! The MySQL backend's claim on a real MariaDB server: the key's row is the
//! lock, and a duplicate that waited on it reads the winner's record with a
//! locking read, whatever the transaction's snapshot says.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use idem_runtime::{Claim, IdemError, Policy, Problem, Via};
use idem_test_support::{operation, stores, TestBackend};
use sqlx::MySql;

/// The server's default isolation, which the claim's transaction keeps.
async fn default_isolation(pool: &sqlx::MySqlPool) -> String {
    // MariaDB names it tx_isolation (transaction_isolation from 11.1), MySQL 8
    // transaction_isolation.
    match sqlx::query_scalar::<_, String>("SELECT @@SESSION.tx_isolation")
        .fetch_one(pool)
        .await
    {
        Ok(level) => level,
        Err(_) => sqlx::query_scalar("SELECT @@SESSION.transaction_isolation")
            .fetch_one(pool)
            .await
            .expect("isolation"),
    }
}

/// Under REPEATABLE READ, a duplicate blocked on the winner's uncommitted row
/// must, once the winner commits, replay the winner's completed record (a
/// plain read would see its snapshot: no record, or the in-progress row)
/// and never run the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_that_waited_on_the_winners_row_replays_it() {
    let h =
        Arc::new(stores::mysql(Policy::default().with_wait_timeout(Duration::from_secs(20))).await);
    assert_eq!(default_isolation(h.engine.pool()).await, "REPEATABLE-READ");
    let op = operation("acme", "waited", 7);
    let Claim::Execute(mut winner) = h.engine.claim(&op).await.unwrap() else {
        panic!("the first claim executes")
    };
    MySql::insert_payment(&mut *winner, "acme", 7)
        .await
        .unwrap();

    let ran = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (h, op, ran) = (h.clone(), op.clone(), ran.clone());
        tokio::spawn(async move {
            h.engine
                .run(&op, async move |tx| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    MySql::insert_payment(tx, "acme", 7).await?;
                    Ok::<i64, Problem>(-1)
                })
                .await
        })
    };
    // The waiter is blocked on the winner's row, not answered yet.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!waiter.is_finished(), "the duplicate waits for the winner");

    winner.commit(Ok::<i64, Problem>(7)).await.unwrap();
    let answer = waiter.await.expect("no panic").expect("answered");
    assert_eq!(answer.via, Via::Replayed);
    assert_eq!(answer.value, Ok(7), "the winner's response, byte for byte");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the duplicate never ran the work"
    );
    assert_eq!(h.payments().await, 1);
    assert_eq!(h.records().await, 1);
}

/// A duplicate that waited on a winner that rolled back owns the key and
/// runs the work: once in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_that_waited_on_a_rolled_back_winner_executes() {
    let h =
        Arc::new(stores::mysql(Policy::default().with_wait_timeout(Duration::from_secs(20))).await);
    let op = operation("acme", "rolled-back", 3);
    let Claim::Execute(mut winner) = h.engine.claim(&op).await.unwrap() else {
        panic!("the first claim executes")
    };
    MySql::insert_payment(&mut *winner, "acme", 3)
        .await
        .unwrap();
    let waiter = {
        let (h, op) = (h.clone(), op.clone());
        tokio::spawn(async move {
            h.engine
                .run(&op, async move |tx| {
                    MySql::insert_payment(tx, "acme", 3).await?;
                    Ok::<i64, Problem>(3)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    drop(winner); // rolled back: its row and its payment go
    let answer = waiter.await.expect("no panic").expect("answered");
    assert_eq!((answer.via, answer.value), (Via::Executed, Ok(3)));
    assert_eq!(h.payments().await, 1);
}

/// 64 concurrent duplicates of one key: one execution, the others replay it
/// (or are told it is in progress), and the work's side effect happens once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_execute_once() {
    let h =
        Arc::new(stores::mysql(Policy::default().with_wait_timeout(Duration::from_secs(20))).await);
    let ran = Arc::new(AtomicUsize::new(0));
    let attempts = (0..64).map(|_| {
        let (h, ran) = (h.clone(), ran.clone());
        tokio::spawn(async move {
            h.engine
                .run(&operation("acme", "storm", 100), async move |tx| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    MySql::insert_payment(tx, "acme", 100).await?;
                    Ok::<i64, Problem>(100)
                })
                .await
        })
    });
    let (mut executed, mut replayed, mut in_progress) = (0, 0, 0);
    for result in join_all(attempts).await {
        match result.expect("no panic") {
            Ok(done) if done.via == Via::Executed => executed += 1,
            Ok(done) => {
                assert_eq!((done.via, done.value), (Via::Replayed, Ok(100)));
                replayed += 1;
            }
            Err(IdemError::InProgress { .. }) => in_progress += 1,
            Err(other) => panic!("unexpected answer: {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(executed + replayed + in_progress, 64);
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(h.payments().await, 1);
}
