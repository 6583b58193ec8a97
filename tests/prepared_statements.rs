//! The Postgres fresh path's prepared statements: idem's pools prepare them
//! as connections open; a connection without them still claims every key
//! exactly once (the full way, which prepares them), says so once per
//! process, and takes the fresh path from then on. Its own test binary: the
//! warning is said once per process.

use idem_runtime::{Engine, IdemError, Policy, Via};
use idem_test_support::{charge, operation, Harness};

/// The prepared statements of a connection's session, by name.
async fn prepared_on(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'idem\\_v1\\_%'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// How many times this session executed its prepared statement `name`.
async fn executions(conn: &mut sqlx::PgConnection, name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(generic_plans + custom_plans), 0)::int8 \
         FROM pg_prepared_statements WHERE name = $1",
    )
    .bind(name)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A pool built without idem's options opens connections without the
/// prepared statements: the fresh message is refused before anything runs,
/// the key is claimed the full way (which prepares them), and the next key on
/// that connection takes the fresh path; so does a connection that lost them.
#[tokio::test]
async fn a_connection_without_the_prepared_statements_claims_the_full_way() {
    let h = idem_test_support::stores::postgres(Policy::default()).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(h.db.url())
        .await
        .unwrap();
    assert_eq!(prepared_on(&mut pool.acquire().await.unwrap()).await, 0);
    let plain = Harness {
        engine: Engine::new(pool.clone()),
        db: h.db,
    };
    let op = operation("acme", "k-unprepared", 10);
    let logs = idem_test_support::Captured::default();
    {
        let _guard = tracing::subscriber::set_default(logs.subscriber());
        assert_eq!(charge(&plain, &op).await.unwrap(), Via::Executed);
    }
    assert!(
        logs.text().contains("lacks idem's prepared statements"),
        "{}",
        logs.text()
    );
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(prepared_on(&mut conn).await, 3);
    // The full way wrote its record with the statement itself.
    assert_eq!(executions(&mut conn, "idem_v1_insert_completed").await, 0);
    drop(conn);
    assert_eq!(charge(&plain, &op).await.unwrap(), Via::Replayed);
    assert!(matches!(
        charge(&plain, &operation("acme", "k-unprepared", 11)).await,
        Err(IdemError::Mismatch)
    ));
    let op = operation("acme", "k-prepared", 10);
    assert_eq!(charge(&plain, &op).await.unwrap(), Via::Executed);
    assert_eq!(charge(&plain, &op).await.unwrap(), Via::Replayed);
    let mut conn = pool.acquire().await.unwrap();
    // The fresh path: the replay, the mismatch, this key and its replay.
    assert_eq!(executions(&mut conn, "idem_v1_check").await, 4);
    assert_eq!(executions(&mut conn, "idem_v1_insert_completed").await, 1);
    drop(conn);

    sqlx::query("DEALLOCATE idem_v1_check")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(prepared_on(&mut pool.acquire().await.unwrap()).await, 2);
    let op = operation("acme", "k-deallocated", 10);
    assert_eq!(charge(&plain, &op).await.unwrap(), Via::Executed);
    assert_eq!(charge(&plain, &op).await.unwrap(), Via::Replayed);
    assert_eq!(prepared_on(&mut pool.acquire().await.unwrap()).await, 3);
    assert_eq!(plain.payments().await, 3, "one payment per key");
    assert_eq!(plain.records().await, 3);
}

/// idem's pools prepare the statements as each connection opens, the
/// connection that ran the migrations included.
#[tokio::test]
async fn idem_pools_open_connections_prepared() {
    let h = idem_test_support::stores::postgres(Policy::default()).await;
    assert_eq!(
        prepared_on(&mut h.engine.pool().acquire().await.unwrap()).await,
        3
    );
    let more = idem_runtime::store::postgres::connect(h.db.url(), &Policy::default(), 1)
        .await
        .unwrap();
    assert_eq!(prepared_on(&mut more.acquire().await.unwrap()).await, 3);
}
