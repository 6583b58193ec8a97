//! The scheduled purger (`Engine::spawn_purger`) on real stores: it deletes
//! expired records, spares live ones, and stops when asked.

use std::time::{Duration, Instant};

use idem_runtime::{IdempotencyKey, Operation, Policy, Problem, Scope};
use idem_test_support::{on_each_store, Harness, TestBackend};

fn operation(key: &str) -> Operation {
    Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new(key).unwrap(),
        "charge-card.v1",
        &1i64,
    )
}

async fn fill<DB: TestBackend>(h: &Harness<DB>, expired: usize, live: usize) {
    let short = Policy::default().with_retention(Duration::from_millis(1));
    for i in 0..expired + live {
        let mut op = operation(&format!("k-{i}"));
        if i < expired {
            op = op.with_policy(short);
        }
        h.engine
            .run(&op, async |_tx| Ok::<i64, Problem>(1))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

async fn purges_on_schedule_and_shuts_down<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    fill(&h, 9, 2).await;
    let purger = h.engine.spawn_purger(Duration::from_millis(50), 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.records().await > 2 {
        assert!(Instant::now() < deadline, "the purger did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!purger.is_finished());
    let asked = Instant::now();
    purger.shutdown().await;
    assert!(asked.elapsed() < Duration::from_secs(2));
    assert_eq!(h.records().await, 2, "live records stay");

    // A purger waiting for its first run stops at once.
    let idle = h.engine.spawn_purger(Duration::from_secs(3600), 100);
    let asked = Instant::now();
    idle.shutdown().await;
    assert!(asked.elapsed() < Duration::from_secs(1));
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test]
    purges_on_schedule_and_shuts_down,
}
