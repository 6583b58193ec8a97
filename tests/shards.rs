//! Stores sharded by tenant, on three real Postgres servers: each tenant's
//! key records and business rows on its own shard, duplicates executed once
//! per key across the shards, replays from the tenant's shard, and a
//! directory that routes a listed tenant and fails closed when it cannot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_runtime::shard::{DirectoryRouter, HashRouter, Router, Shards};
use idem_runtime::{Engine, IdemError, IdempotencyKey, Operation, Problem, Scope, Via};
use idem_test_support::{PgServer, FAST_SETTINGS};
use sqlx::{PgPool, Postgres};

const SHARDS: usize = 3;

/// Three servers, a database on each with idem's tables and `payments`.
async fn three_shards() -> (Vec<PgServer>, Vec<Engine<Postgres>>) {
    let mut servers = Vec::new();
    let mut engines = Vec::new();
    for _ in 0..SHARDS {
        let server = PgServer::start(FAST_SETTINGS).expect("start a Postgres server");
        let engine = Engine::<Postgres>::connect_postgres(&server.fresh_database().await)
            .await
            .expect("connect");
        sqlx::query("CREATE TABLE payments (tenant text NOT NULL, amount bigint NOT NULL)")
            .execute(engine.pool())
            .await
            .expect("payments");
        servers.push(server);
        engines.push(engine);
    }
    (servers, engines)
}

fn charge(tenant: &str, key: &str) -> Operation {
    Operation::new(
        Scope::tenant(tenant),
        IdempotencyKey::new(key).unwrap(),
        "charge.v1",
        &2500,
    )
}

/// Runs `op` on its tenant's shard: one payment row, answered with its tenant.
async fn pay<R: Router>(
    shards: &Shards<Postgres, R>,
    op: &Operation,
    executed: &AtomicUsize,
) -> Result<(String, Via), IdemError> {
    let engine = shards.engine(op.scope()).await?;
    let tenant = op.scope().first_part().to_owned();
    let done = engine
        .run(op, async |tx| {
            executed.fetch_add(1, Ordering::SeqCst);
            sqlx::query("INSERT INTO payments (tenant, amount) VALUES ($1, 2500)")
                .bind(&tenant)
                .execute(&mut *tx)
                .await?;
            Ok::<_, Problem>(tenant.clone())
        })
        .await?;
    Ok((done.value.expect("the payment"), done.via))
}

async fn count(pool: &PgPool, sql: &str, tenant: &str) -> i64 {
    sqlx::query_scalar(sql)
        .bind(tenant)
        .fetch_one(pool)
        .await
        .expect(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_lives_on_its_hash_shard() {
    let (_servers, engines) = three_shards().await;
    let shards = Shards::new(engines, HashRouter);
    shards.migrate().await.expect("migrate every shard");
    let executed = AtomicUsize::new(0);
    let tenants: Vec<String> = (0..24).map(|i| format!("tenant-{i}")).collect();

    for tenant in &tenants {
        for key in ["k-1", "k-2"] {
            let (answer, via) = pay(&shards, &charge(tenant, key), &executed).await.unwrap();
            assert_eq!((answer.as_str(), via), (tenant.as_str(), Via::Executed));
        }
        // A retry replays from the tenant's shard.
        let (_, via) = pay(&shards, &charge(tenant, "k-1"), &executed)
            .await
            .unwrap();
        assert_eq!(via, Via::Replayed);
    }
    assert_eq!(executed.load(Ordering::SeqCst), tenants.len() * 2);

    let mut used = [0usize; SHARDS];
    for tenant in &tenants {
        let home = HashRouter::index(tenant, SHARDS);
        used[home] += 1;
        assert_eq!(shards.index(&Scope::tenant(tenant)).await.unwrap(), home);
        for (index, engine) in shards.engines().iter().enumerate() {
            let expected = if index == home { 2 } else { 0 };
            let keys = count(
                engine.pool(),
                "SELECT count(*) FROM idempotency_keys WHERE scope = $1",
                Scope::tenant(tenant).as_stored(),
            )
            .await;
            let payments = count(
                engine.pool(),
                "SELECT count(*) FROM payments WHERE tenant = $1",
                tenant,
            )
            .await;
            assert_eq!(
                (keys, payments),
                (expected, expected),
                "{tenant} on shard {index}"
            );
        }
    }
    assert!(
        used.iter().all(|&n| n > 0),
        "24 tenants spread over the 3 shards: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_across_shards_execute_once_per_key() {
    let (_servers, engines) = three_shards().await;
    let shards = Arc::new(Shards::new(engines, HashRouter));
    shards.migrate().await.expect("migrate every shard");
    let executed = Arc::new(AtomicUsize::new(0));
    let mut attempts = Vec::new();
    for tenant in ["acme", "globex", "initech", "umbrella"] {
        for _ in 0..16 {
            let (shards, executed) = (shards.clone(), executed.clone());
            attempts.push(tokio::spawn(async move {
                loop {
                    match pay(&shards, &charge(tenant, "dup"), &executed).await {
                        Ok((answer, via)) => return (answer, via),
                        Err(IdemError::InProgress { .. }) => {
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await
                        }
                        Err(error) => panic!("{error}"),
                    }
                }
            }));
        }
    }
    let mut executed_answers = 0;
    for attempt in attempts {
        let (_, via) = attempt.await.unwrap();
        executed_answers += usize::from(via == Via::Executed);
    }
    assert_eq!(executed.load(Ordering::SeqCst), 4, "one execution per key");
    assert_eq!(executed_answers, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_routes_listed_tenants_and_fails_closed() {
    let (_servers, engines) = three_shards().await;
    // The directory lives on shard 0's database.
    let directory = DirectoryRouter::new(engines[0].pool().clone());
    directory.create_table().await.unwrap();
    let shards = Shards::new(engines, directory.clone());
    shards.migrate().await.unwrap();

    // Unlisted: where the hash puts it. Listed: where the directory says.
    let scope = Scope::tenant("acme");
    assert_eq!(
        shards.index(&scope).await.unwrap(),
        HashRouter::index("acme", SHARDS)
    );
    let elsewhere = (HashRouter::index("acme", SHARDS) + 1) % SHARDS;
    directory.assign("acme", elsewhere).await.unwrap();
    assert_eq!(shards.index(&scope).await.unwrap(), elsewhere);
    let executed = AtomicUsize::new(0);
    pay(&shards, &charge("acme", "k-1"), &executed)
        .await
        .unwrap();
    let keys = count(
        shards.engines()[elsewhere].pool(),
        "SELECT count(*) FROM idempotency_keys WHERE scope = $1",
        scope.as_stored(),
    )
    .await;
    assert_eq!(keys, 1);

    // A route to a shard that does not exist: 503, nothing runs.
    directory.assign("acme", 7).await.unwrap();
    match pay(&shards, &charge("acme", "k-2"), &executed).await {
        Err(error @ IdemError::Unavailable { .. }) => assert_eq!(error.http_status(), 503),
        other => panic!("expected a 503, got {other:?}"),
    }
    // The directory down: 503 as well.
    shards.engines()[0].pool().close().await;
    assert!(matches!(
        pay(&shards, &charge("globex", "k-1"), &executed).await,
        Err(IdemError::Unavailable { .. })
    ));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}
