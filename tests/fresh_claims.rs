//! The fresh-first claim, the one-message completion and the replay cache on
//! real stores: keys, scopes and responses that need quoting travel intact,
//! a repeat is answered from the record read under the lock, a completion
//! that fails rolls the work back and leaves its connection clean, and the
//! cache answers only what the store would, until the record's expiry.

use std::time::Duration;

use idem_runtime::{Engine, IdemError, Policy, Problem, ReplayCache, StoredResponse, Via};
use idem_test_support::{charge, on_each_store, operation, Harness, TestBackend};

/// Quotes, backslashes, dollar quotes and non-ASCII scopes: each key is its
/// own, executed once, replayed after, refused with another request.
async fn keys_that_need_quoting_are_claimed_intact<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
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

/// Every byte value in a body, a quote and a backslash in the content type
/// and headers, and a body above the size sent inline: each is replayed
/// exactly as it was stored, through an engine whose pool has one
/// connection (so every claim reuses the connection the previous one left).
async fn responses_are_replayed_byte_for_byte<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let pool = DB::pool_of(h.db.url(), &Policy::default(), 1).await;
    let h = h.with_engine(Engine::new(pool));
    let all_bytes: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
    let large: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    for (key, body) in [
        ("k-bytes", all_bytes),
        ("k-large", large),
        ("k-empty", Vec::new()),
    ] {
        let stored = StoredResponse {
            status: 201,
            content_type: r"application/x-it's \ odd".to_owned(),
            body,
            headers: vec![
                ("location".to_owned(), "/payments/o'brien".to_owned()),
                (
                    "x-note".to_owned(),
                    r"back\slash \' 'quote' $$x$$ ünïcode".to_owned(),
                ),
            ],
        };
        let op = operation("acme", key, 10);
        let first = h
            .engine
            .run(&op, async |tx| {
                DB::insert_payment(tx, "acme", 10).await.expect("payment");
                stored.clone()
            })
            .await
            .unwrap();
        assert_eq!(first.via, Via::Executed, "{key}");
        let replay = h
            .engine
            .run(&op, async |_tx| -> StoredResponse {
                panic!("{key} ran twice")
            })
            .await
            .unwrap();
        assert_eq!(replay.via, Via::Replayed, "{key}");
        assert_eq!(replay.value, stored, "{key}");
    }
    assert_eq!(h.payments().await, 3);
    assert_eq!(h.records().await, 3);
    assert_connection_left_clean(&h).await;
}

/// The pool's one connection is usable and outside any transaction: a write
/// on it commits and is seen from another connection.
async fn assert_connection_left_clean<DB: TestBackend>(h: &Harness<DB>) {
    let other = DB::pool_of(h.db.url(), &Policy::default(), 1).await;
    let before = DB::count(&other, "SELECT COUNT(*) FROM payments").await;
    DB::execute(
        h.engine.pool(),
        "INSERT INTO payments (tenant, amount) VALUES ('after', 1)",
    )
    .await;
    assert_eq!(
        DB::count(&other, "SELECT COUNT(*) FROM payments").await,
        before + 1
    );
}

#[tokio::test]
async fn a_completion_that_fails_rolls_the_work_back_on_postgres() {
    a_completion_that_fails_rolls_the_work_back(idem_test_support::stores::postgres).await;
}

/// A completion whose record cannot be written (here: a row for the key
/// written on another connection while the work ran) fails closed: the
/// work's writes roll back, and the connection goes back to the pool
/// outside any transaction. Postgres with advisory key locks only: nothing
/// else lets another writer in while a claim holds its key.
async fn a_completion_that_fails_rolls_the_work_back<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
    let pool = DB::pool_of(h.db.url(), &Policy::default(), 1).await;
    let h = h.with_engine(Engine::new(pool));
    assert_eq!(
        charge(&h, &operation("acme", "k-seed", 10)).await.unwrap(),
        Via::Executed
    );
    let other = DB::pool_of(h.db.url(), &Policy::default(), 1).await;
    let op = operation("acme", "k-intruder", 10);
    let outcome = h
        .engine
        .run(&op, async |tx| {
            DB::insert_payment(tx, "acme", 10).await.expect("payment");
            DB::execute(
                &other,
                "INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, \
                   response_content_type, response_body, created_at, locked_until, expires_at) \
                 SELECT scope, 'k-intruder', step, fingerprint, status, response_status, \
                   response_content_type, response_body, created_at, locked_until, expires_at \
                 FROM idempotency_keys WHERE key = 'k-seed'",
            )
            .await;
            Ok::<i64, Problem>(1)
        })
        .await;
    // Another writer's row for the key is a conflicting transaction: 503 +
    // Retry-After, nothing committed.
    assert!(
        matches!(outcome, Err(IdemError::Conflict { .. })),
        "{outcome:?}"
    );
    assert_eq!(h.payments().await, 1, "only k-seed's payment");
    assert_connection_left_clean(&h).await;
}

/// A replay and a conflict on Postgres are the fresh-first message refused
/// with SQLSTATE IDEMK: expected, so the server does not log them (the
/// migration sets `log_min_messages` on the function when its role may).
#[tokio::test]
async fn refusals_stay_out_of_the_server_log() {
    let Some(log) = idem_test_support::postgres().log_file() else {
        return; // a server from IDEM_TEST_DATABASE_URL: its log is not ours to read
    };
    let h = idem_test_support::stores::postgres(Policy::default()).await;
    let op = operation("acme", "k-quiet-log", 10);
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Executed);
    assert_eq!(charge(&h, &op).await.unwrap(), Via::Replayed);
    assert!(matches!(
        charge(&h, &operation("acme", "k-quiet-log", 11)).await,
        Err(IdemError::Mismatch)
    ));
    let text = std::fs::read_to_string(log).expect("server log");
    assert!(
        !text.contains("k-quiet-log"),
        "the server logged a refusal:\n{text}"
    );
}

/// A cached repeat is answered without the store (which is broken here);
/// another request under the same key still goes to the store.
async fn the_cache_answers_repeats_of_what_this_process_completed<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
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
async fn the_cache_honours_the_records_expiry<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = harness(Policy::default()).await;
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

on_each_store! {
    stores: sqlite, postgres, postgres_row_lock, mysql;
    #[tokio::test]
    keys_that_need_quoting_are_claimed_intact,
    #[tokio::test]
    responses_are_replayed_byte_for_byte,
    #[tokio::test]
    the_cache_answers_repeats_of_what_this_process_completed,
    #[tokio::test]
    the_cache_honours_the_records_expiry,
}
