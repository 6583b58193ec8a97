//! Stores sharded by tenant, on three real Postgres servers: each tenant's
//! key records and business rows on its own shard, duplicates executed once
//! per key across the shards, replays from the tenant's shard, and a
//! directory that routes a listed tenant and fails closed when it cannot;
//! a tenant moved between shards: its completed keys replayed from the
//! new shard, a claim in flight during the move refused and its retry run
//! once, its outbox messages delivered once by a relay per shard, and the
//! other tenants of its shard served meanwhile; and one call starting a
//! relay per shard, each message delivered once by its tenant's shard.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::outbox::{self, Delivered, InProcessSink, Message, RelayHandle};
use idem_runtime::shard::{
    DirectoryEntry, DirectoryRouter, HashRouter, MoveError, Moved, Router, Shards, TenantMove,
};
use idem_runtime::{Engine, IdemError, IdempotencyKey, Operation, Problem, Scope, Step, Via};
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
    pay_enqueuing(shards, op, executed, None).await
}

/// [`pay`], the work also enqueuing `message` when there is one.
async fn pay_enqueuing<R: Router>(
    shards: &Shards<Postgres, R>,
    op: &Operation,
    executed: &AtomicUsize,
    message: Option<Message>,
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
            if let Some(message) = &message {
                outbox::enqueue(&mut *tx, message)
                    .await
                    .map_err(|e| Problem::new(500, "enqueue failed").with_detail(e.to_string()))?;
            }
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
    assert_eq!(directory.entry("acme").await.unwrap(), None);
    let elsewhere = (HashRouter::index("acme", SHARDS) + 1) % SHARDS;
    directory.assign("acme", elsewhere).await.unwrap();
    assert_eq!(shards.index(&scope).await.unwrap(), elsewhere);
    assert_eq!(
        directory.entry("acme").await.unwrap(),
        Some(DirectoryEntry {
            shard: elsewhere,
            moving_to: None,
            moved_from: None
        })
    );
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

// ---------------------------------------------------------------------------
// Moving a tenant between shards (TenantMove).

const NOTIFY: Step = Step::new("notify.v1");

/// Three shards routed by a directory kept on shard 0's database, with
/// `tenants` listed on shard 0.
async fn directory_shards(tenants: &[&str]) -> (Vec<PgServer>, Shards<Postgres, DirectoryRouter>) {
    let (servers, engines) = three_shards().await;
    let directory = DirectoryRouter::new(engines[0].pool().clone());
    directory.create_table().await.unwrap();
    let shards = Shards::new(engines, directory.clone());
    shards.migrate().await.unwrap();
    for tenant in tenants {
        directory.assign(tenant, 0).await.unwrap();
    }
    (servers, shards)
}

/// [`pay`], the work also enqueuing one message (scoped to the tenant) for
/// the in-process sink `events`.
async fn pay_and_notify<R: Router>(
    shards: &Shards<Postgres, R>,
    op: &Operation,
    executed: &AtomicUsize,
) -> Result<(String, Via), IdemError> {
    let message = Message::to("events", "ledger")
        .body("text/plain", op.key().as_str().as_bytes().to_vec())
        .for_step(op.key(), NOTIFY)
        .scope(op.scope());
    pay_enqueuing(shards, op, executed, Some(message)).await
}

/// The tenant's rows on each shard: (key records, outbox messages not sent,
/// outbox messages sent).
async fn rows_by_shard<R: Router>(
    shards: &Shards<Postgres, R>,
    tenant: &str,
) -> Vec<(i64, i64, i64)> {
    let scope = Scope::tenant(tenant);
    let mut rows = Vec::new();
    for engine in shards.engines() {
        let pool = engine.pool();
        rows.push((
            count(
                pool,
                "SELECT count(*) FROM idempotency_keys WHERE scope = $1",
                scope.as_stored(),
            )
            .await,
            count(
                pool,
                "SELECT count(*) FROM idem_outbox WHERE scope = $1 AND state <> 'sent'",
                scope.as_stored(),
            )
            .await,
            count(
                pool,
                "SELECT count(*) FROM idem_outbox WHERE scope = $1 AND state = 'sent'",
                scope.as_stored(),
            )
            .await,
        ));
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tenant_replays_from_its_new_shard() {
    let (_servers, shards) = directory_shards(&["acme", "globex"]).await;
    let executed = AtomicUsize::new(0);
    let keys: Vec<String> = (0..5).map(|i| format!("k-{i}")).collect();
    for key in &keys {
        pay_and_notify(&shards, &charge("acme", key), &executed)
            .await
            .unwrap();
    }
    pay(&shards, &charge("globex", "k-0"), &executed)
        .await
        .unwrap();
    let bodies_before: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT response_body FROM idempotency_keys WHERE scope = $1 ORDER BY key",
    )
    .bind(Scope::tenant("acme").as_stored())
    .fetch_all(shards.engines()[0].pool())
    .await
    .unwrap();

    let moved = TenantMove::new("acme", 2).run(&shards).await.unwrap();
    assert_eq!(
        moved,
        Moved {
            from: 0,
            to: 2,
            keys: 5,
            messages: 5,
            already_there: false
        }
    );
    assert_eq!(shards.index(&Scope::tenant("acme")).await.unwrap(), 2);
    assert_eq!(
        rows_by_shard(&shards, "acme").await,
        vec![(0, 0, 0), (0, 0, 0), (5, 5, 0)]
    );
    let bodies_after: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT response_body FROM idempotency_keys WHERE scope = $1 ORDER BY key",
    )
    .bind(Scope::tenant("acme").as_stored())
    .fetch_all(shards.engines()[2].pool())
    .await
    .unwrap();
    assert_eq!(
        bodies_after, bodies_before,
        "the stored responses byte for byte"
    );

    // Retries replay from the target; nothing runs again.
    for key in &keys {
        let (answer, via) = pay_and_notify(&shards, &charge("acme", key), &executed)
            .await
            .unwrap();
        assert_eq!((answer.as_str(), via), ("acme", Via::Replayed));
    }
    assert_eq!(executed.load(Ordering::SeqCst), 6);
    // A new key runs on the target; globex stays on shard 0, served.
    pay(&shards, &charge("acme", "k-new"), &executed)
        .await
        .unwrap();
    let (_, via) = pay(&shards, &charge("globex", "k-0"), &executed)
        .await
        .unwrap();
    assert_eq!(via, Via::Replayed);
    assert_eq!(
        count(
            shards.engines()[2].pool(),
            "SELECT count(*) FROM payments WHERE tenant = $1",
            "acme"
        )
        .await,
        1
    );

    // Running the move again does nothing; a shard out of range is refused.
    let again = TenantMove::new("acme", 2).run(&shards).await.unwrap();
    assert!(again.already_there);
    assert!(matches!(
        TenantMove::new("acme", 3).run(&shards).await,
        Err(MoveError::ShardOutOfRange {
            shard: 3,
            shards: 3
        })
    ));
    assert!(matches!(
        TenantMove::new("nobody", 1).run(&shards).await,
        Err(MoveError::UnknownTenant(_))
    ));

    // A late request that routed to the old shard before the flip is
    // refused there by the fence, not run.
    let late = shards.engines()[0]
        .run(&charge("acme", "k-late"), async |_tx| Ok::<_, Problem>(1))
        .await;
    match late {
        Err(error @ IdemError::Unavailable { .. }) => assert_eq!(error.http_status(), 503),
        other => panic!("expected a 503 from the old shard, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_claim_during_a_move_is_refused_and_its_retry_runs_once() {
    let (_servers, shards) = directory_shards(&["acme", "globex"]).await;
    let shards = Arc::new(shards);
    let executed = Arc::new(AtomicUsize::new(0));
    pay(&shards, &charge("acme", "before"), &executed)
        .await
        .unwrap();
    // A message of the tenant a relay holds a lease on for 2 s more: the
    // move waits for that lease to end before it copies, which keeps the
    // tenant fenced long enough to be seen so.
    pay_and_notify(&shards, &charge("acme", "leased"), &executed)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE idem_outbox SET lease_until = now() + interval '2 seconds', \
         lease_owner = 'another-relay', lease_token = lease_token + 1 WHERE scope = $1",
    )
    .bind(Scope::tenant("acme").as_stored())
    .execute(shards.engines()[0].pool())
    .await
    .unwrap();

    // A claim routed to shard 0 whose work is still running when the move starts.
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let in_flight = {
        let (shards, executed, release, started) = (
            shards.clone(),
            executed.clone(),
            release.clone(),
            started.clone(),
        );
        tokio::spawn(async move {
            let engine = shards.engine(&Scope::tenant("acme")).await.unwrap();
            engine
                .run(&charge("acme", "in-flight"), async |tx| {
                    executed.fetch_add(1, Ordering::SeqCst);
                    sqlx::query("INSERT INTO payments (tenant, amount) VALUES ('acme', 2500)")
                        .execute(&mut *tx)
                        .await?;
                    started.notify_one();
                    release.notified().await;
                    Ok::<_, Problem>(1)
                })
                .await
        })
    };
    started.notified().await;
    let mover = {
        let shards = shards.clone();
        tokio::spawn(async move { TenantMove::new("acme", 1).run(&shards).await })
    };
    // While it moves, the tenant is a 503; globex on the same shard is served.
    loop {
        let moving: Option<i32> =
            sqlx::query_scalar("SELECT moving_to FROM idem_tenant_shards WHERE tenant = 'acme'")
                .fetch_one(shards.router().pool())
                .await
                .unwrap();
        if moving == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match pay(&shards, &charge("acme", "during"), &executed).await {
        Err(error @ IdemError::Unavailable { .. }) => assert_eq!(error.http_status(), 503),
        other => panic!("a claim ran while its tenant was moving: {other:?}"),
    }
    for i in 0..5 {
        let (_, via) = pay(&shards, &charge("globex", &format!("g-{i}")), &executed)
            .await
            .unwrap();
        assert_eq!(via, Via::Executed);
    }
    // The source's fence is in place before the in-flight work ends: its
    // record is refused there (one that committed before the fence would
    // have been copied instead).
    loop {
        let source = shards.engines()[0].pool();
        let fences: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('idem_tenant_fences')::text")
                .fetch_one(source)
                .await
                .unwrap();
        if fences.is_some()
            && count(
                source,
                "SELECT count(*) FROM idem_tenant_fences WHERE tenant = $1",
                "acme",
            )
            .await
                == 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    release.notify_one();
    match in_flight.await.unwrap() {
        Err(error @ IdemError::Unavailable { .. }) => assert_eq!(error.http_status(), 503),
        other => panic!("the in-flight claim committed on the old shard: {other:?}"),
    }
    let moved = mover.await.unwrap().unwrap();
    assert_eq!(
        (moved.from, moved.to, moved.keys, moved.messages),
        (0, 1, 2, 1)
    );

    // The retry runs once, on the new shard; the next replays.
    let before = executed.load(Ordering::SeqCst);
    let (_, via) = pay(&shards, &charge("acme", "in-flight"), &executed)
        .await
        .unwrap();
    assert_eq!(via, Via::Executed);
    let (_, via) = pay(&shards, &charge("acme", "in-flight"), &executed)
        .await
        .unwrap();
    assert_eq!(via, Via::Replayed);
    assert_eq!(executed.load(Ordering::SeqCst), before + 1);
    let payments = |index: usize| {
        count(
            shards.engines()[index].pool(),
            "SELECT count(*) FROM payments WHERE tenant = $1",
            "acme",
        )
    };
    // Shard 0 keeps the business rows of the keys completed before the move
    // (business rows are the service's to move); the refused claim left none.
    assert_eq!((payments(0).await, payments(1).await), (2, 1));
}

/// A relay per shard started by [`Shards::spawn_relays`], delivering to an
/// in-process sink `events` that counts each message's deliveries (after
/// `pause`, a slow sink).
async fn spawn_counting_relays<R: Router>(
    shards: &Shards<Postgres, R>,
    deliveries: &Arc<Mutex<HashMap<String, usize>>>,
    pause: Duration,
) -> Vec<RelayHandle> {
    shards
        .spawn_relays(|relay| {
            let deliveries = deliveries.clone();
            let sink = InProcessSink::new("events", move |message| {
                let deliveries = deliveries.clone();
                async move {
                    tokio::time::sleep(pause).await;
                    *deliveries.lock().unwrap().entry(message.id).or_default() += 1;
                    Ok(Delivered::Published { receipt: None })
                }
            });
            relay.sink(sink).poll_interval(Duration::from_millis(50))
        })
        .await
        .expect("a relay per shard")
}

/// Waits until `expected` distinct messages were delivered (30 s at most),
/// then a little longer, so a second delivery of one would be seen.
async fn await_deliveries(deliveries: &Mutex<HashMap<String, usize>>, expected: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while deliveries.lock().unwrap().len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "messages still undelivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_starts_a_relay_per_shard_and_each_message_is_delivered_once() {
    let (_servers, engines) = three_shards().await;
    let shards = Shards::new(engines, HashRouter);
    shards.migrate().await.expect("migrate every shard");
    let executed = AtomicUsize::new(0);
    let tenants: Vec<String> = (0..12).map(|i| format!("tenant-{i}")).collect();
    for tenant in &tenants {
        // Message ids derive from the key and the step: keys unique across tenants.
        for key in ["k-1", "k-2"] {
            let key = format!("{tenant}-{key}");
            pay_and_notify(&shards, &charge(tenant, &key), &executed)
                .await
                .unwrap();
        }
        // A retry replays: no second message.
        let retry = charge(tenant, &format!("{tenant}-k-1"));
        let (_, via) = pay_and_notify(&shards, &retry, &executed).await.unwrap();
        assert_eq!(via, Via::Replayed);
    }
    let messages = tenants.len() * 2;
    assert_eq!(executed.load(Ordering::SeqCst), messages);

    let deliveries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let relays = spawn_counting_relays(&shards, &deliveries, Duration::ZERO).await;
    assert_eq!(relays.len(), SHARDS);
    await_deliveries(&deliveries, messages).await;
    let mut published = Vec::new();
    for relay in relays {
        published.push(relay.shutdown().await.published);
    }
    let deliveries = deliveries.lock().unwrap().clone();
    assert_eq!(deliveries.len(), messages);
    assert!(
        deliveries.values().all(|&n| n == 1),
        "a message delivered twice: {deliveries:?}"
    );
    // Each shard's relay delivered its own tenants' messages, and only those.
    let mut expected = vec![0u64; SHARDS];
    for tenant in &tenants {
        expected[HashRouter::index(tenant, SHARDS)] += 2;
    }
    assert_eq!(published, expected);
    assert!(expected.iter().all(|&n| n > 0), "{expected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_messages_are_delivered_once_across_a_move() {
    let (_servers, shards) = directory_shards(&["acme"]).await;
    let executed = AtomicUsize::new(0);
    const MESSAGES: usize = 40;
    for i in 0..MESSAGES {
        pay_and_notify(&shards, &charge("acme", &format!("m-{i}")), &executed)
            .await
            .unwrap();
    }
    // A relay per shard, delivering slowly, so the move meets messages
    // that are leased, delivered and pending.
    let deliveries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let relays = spawn_counting_relays(&shards, &deliveries, Duration::from_millis(15)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let moved = TenantMove::new("acme", 2).run(&shards).await.unwrap();
    assert_eq!((moved.from, moved.to), (0, 2));
    await_deliveries(&deliveries, MESSAGES).await;
    for relay in relays {
        relay.shutdown().await;
    }
    let deliveries = deliveries.lock().unwrap().clone();
    assert_eq!(deliveries.len(), MESSAGES);
    assert!(
        deliveries.values().all(|&n| n == 1),
        "a message delivered twice: {deliveries:?}"
    );
    let rows = rows_by_shard(&shards, "acme").await;
    // Sent before the move: kept on shard 0 until purged; the rest sent from shard 2.
    assert_eq!((rows[0].1, rows[1], rows[2].1), (0, (0, 0, 0), 0));
    assert_eq!(rows[0].2 + rows[2].2, MESSAGES as i64, "{rows:?}");
    assert_eq!(rows[2].0, MESSAGES as i64);
    assert_eq!(
        moved.messages as i64, rows[2].2,
        "every copied message sent once, from the target"
    );
}

/// A recorded series: its name, its labels and its count (the counter's
/// value, the histogram's samples).
type Series = (String, Vec<(String, String)>, u64);

/// The `shard` label of each series named `name` recorded by `step`
/// (or with no `step` label when `step` is `None`), summed per label value
/// (`None`: the series carry no `shard` label).
fn counts_by_shard(
    snapshot: &[Series],
    name: &str,
    step: Option<&str>,
) -> HashMap<Option<String>, u64> {
    let mut counts = HashMap::new();
    for (series, labels, count) in snapshot {
        let label = |wanted: &str| {
            labels
                .iter()
                .find(|(key, _)| key == wanted)
                .map(|(_, value)| value.clone())
        };
        if series == name && label("step").as_deref() == step {
            *counts.entry(label("shard")).or_default() += count;
        }
    }
    counts
}

#[test]
fn a_sharded_engines_series_carry_its_shard_label() {
    use idem_runtime::metrics::{CLAIMS, CLAIM_WAIT, OUTBOX_PUBLISHED};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    // A recorder of this test's own: a current-thread runtime under
    // `with_local_recorder`, so every task it polls records here.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tenants: Vec<String> = (0..9).map(|i| format!("tenant-{i}")).collect();
    let _servers = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let (servers, engines) = three_shards().await;
            let unsharded = engines[0].clone();
            let shards = Shards::new(engines, HashRouter);
            shards.migrate().await.unwrap();
            assert_eq!(unsharded.shard(), None);
            let indexes: Vec<_> = shards.engines().iter().map(Engine::shard).collect();
            assert_eq!(indexes, [Some(0), Some(1), Some(2)]);

            let executed = AtomicUsize::new(0);
            for tenant in &tenants {
                let op = charge(tenant, &format!("{tenant}-k"));
                pay_and_notify(&shards, &op, &executed).await.unwrap();
                pay_and_notify(&shards, &op, &executed).await.unwrap();
            }
            let bare = Operation::new(
                Scope::tenant("acme"),
                IdempotencyKey::new("bare-k").unwrap(),
                "bare.v1",
                &1,
            );
            unsharded
                .run(&bare, async |_tx| Ok::<_, Problem>(1))
                .await
                .unwrap();

            let deliveries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
            let relays = spawn_counting_relays(&shards, &deliveries, Duration::ZERO).await;
            await_deliveries(&deliveries, tenants.len()).await;
            for relay in relays {
                relay.shutdown().await;
            }
            servers
        })
    });

    let snapshot: Vec<Series> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let count = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(values) => values.len() as u64,
                DebugValue::Gauge(_) => 1,
            };
            (key.name().to_owned(), labels, count)
        })
        .collect();
    let mut per_shard: HashMap<Option<String>, u64> = HashMap::new();
    for tenant in &tenants {
        let shard = HashRouter::index(tenant, SHARDS).to_string();
        *per_shard.entry(Some(shard)).or_default() += 1;
    }
    let twice: HashMap<_, _> = per_shard.iter().map(|(k, n)| (k.clone(), n * 2)).collect();
    // Each tenant's claim and its replay, on its own shard's label.
    assert_eq!(counts_by_shard(&snapshot, CLAIMS, Some("charge.v1")), twice);
    assert_eq!(
        counts_by_shard(&snapshot, CLAIM_WAIT, Some("charge.v1")),
        twice
    );
    // Each tenant's message, delivered by its shard's relay.
    assert_eq!(
        counts_by_shard(&snapshot, OUTBOX_PUBLISHED, None),
        per_shard
    );
    // The engine outside `Shards` records no `shard` label.
    assert_eq!(
        counts_by_shard(&snapshot, CLAIMS, Some("bare.v1")),
        HashMap::from([(None, 1)])
    );
}

// ---------------------------------------------------------------------------
// A tenant moved under load, the service killed at random (shards_scenario).

mod shards_scenario;

/// The bounded run: 6 tenants, 240 keys by 4 clients over 6 s, one move,
/// the service's two replicas killed at random; the chaos example's
/// processes (`cargo test` builds it; alone, `cargo build --example chaos`
/// first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_moved_under_load_with_kills_loses_and_duplicates_nothing() {
    let plan = shards_scenario::Plan {
        tenants: 6,
        keys: 240,
        clients: 4,
        moves: 1,
        spread: Duration::from_secs(6),
        seed: fastrand::u64(..),
    };
    let figures = shards_scenario::run(&idem_test_support::example_binary("chaos"), plan)
        .await
        .expect("the run");
    eprintln!("{figures}");
    assert!(
        figures.passed(),
        "lost, duplicated or inconsistent: {figures}"
    );
    assert!(figures.sigkills + figures.sigterms >= 3, "{figures}");
    assert!(figures.retries > 0, "{figures}");
    assert_eq!(figures.moves.len(), 1, "{figures}");
    let moved = &figures.moves[0];
    // The moved tenant's keys were answered on either side of the flip.
    assert!(moved.answered_by_source > 0, "{figures}");
    assert!(moved.answered_by_target > 0, "{figures}");
    assert_eq!(
        moved.answered_by_source + moved.answered_by_target,
        plan.keys / plan.tenants,
        "{figures}"
    );
    assert!(
        moved.runs >= 2,
        "the first run stops at the fence: {figures}"
    );
}
