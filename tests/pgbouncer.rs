//! Postgres behind a real PgBouncer (the system's `pgbouncer`, 1.18), as
//! production runs it. In transaction mode, with the engines set to
//! `Pooler::Transaction`: concurrent duplicates run once, a crashed claim is
//! taken over, a completed key replays and a reused key is refused; two
//! relays (`FOR UPDATE SKIP LOCKED` leases, polling, `listen` ignored)
//! deliver each message over signed webhooks to an inbox that runs its
//! effect once and answers a redelivery from its record; durable claims, a
//! response over 64 KiB and both purges work; and the server's log gains no
//! `ERROR` line. In session mode the default settings (the statements
//! prepared per connection) do the same.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::outbox::{self, Delivered, InProcessSink, Message, Relay};
use idem::store::postgres::{self, Pooler};
use idem::{
    Claim, Engine, IdemError, IdempotencyKey, KeyLock, Operation, Policy, Problem, Scope, Via,
    WaitBound,
};
use idem_test_support::{PgBouncer, PgServer, PoolMode, FAST_SETTINGS};
use sqlx::Postgres;

idem::steps! {
    const CHARGE = "charge.v1";
    const NOTIFY = "notify.v1";
    const RECORD = "record-notification.v1";
}

/// A cluster of its own (so its log holds only this test's statements) and
/// a PgBouncer in `mode` in front of it.
fn server_and_bouncer(mode: PoolMode) -> (PgServer, PgBouncer) {
    let server = PgServer::start(FAST_SETTINGS).expect("postgres");
    // Transaction mode: few server connections for many clients. Session
    // mode holds one per client connection, so it needs as many as the
    // pools have.
    let size = match mode {
        PoolMode::Transaction => 4,
        PoolMode::Session => 40,
    };
    let bouncer = PgBouncer::start(&server, mode, size).expect("pgbouncer");
    (server, bouncer)
}

/// A migrated database with a `payments` table, reached through `bouncer`.
async fn engine_through(
    server: &PgServer,
    bouncer: &PgBouncer,
    pooler: Pooler,
    policy: Policy,
) -> Engine<Postgres> {
    let direct = server.fresh_database().await;
    let name = direct.rsplit('/').next().unwrap().to_owned();
    // Migrations take idem's session-level advisory lock: run them on a
    // direct connection, as a deploy step would.
    Engine::<Postgres>::new(sqlx::PgPool::connect(&direct).await.unwrap())
        .migrate()
        .await
        .unwrap();
    let pool = postgres::pool_options_for(&policy, 16, pooler)
        .connect(&bouncer.url(&name))
        .await
        .expect("connect through pgbouncer");
    let engine = Engine::new(pool).with_policy(policy).with_pooler(pooler);
    sqlx::raw_sql("CREATE TABLE payments (key text NOT NULL, amount bigint NOT NULL)")
        .execute(engine.pool())
        .await
        .unwrap();
    engine
}

fn op(key: &str, amount: i64) -> Operation {
    Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new(key).unwrap(),
        CHARGE.name(),
        &amount,
    )
}

/// The charge: one business row, its statement unnamed (as the claim's
/// own are) so it runs behind a transaction pooler.
async fn charge(engine: &Engine<Postgres>, key: &str, amount: i64) -> Result<Via, IdemError> {
    let key_text = key.to_owned();
    engine
        .run(&op(key, amount), async |tx| {
            sqlx::query("INSERT INTO payments VALUES ($1, $2)")
                .persistent(false)
                .bind(&key_text)
                .bind(amount)
                .execute(&mut *tx)
                .await?;
            Ok::<_, Problem>(amount)
        })
        .await
        .map(|answer| answer.via)
}

async fn count(engine: &Engine<Postgres>, sql: &str) -> i64 {
    sqlx::raw_sql(sql)
        .fetch_one(engine.pool())
        .await
        .map(|row| sqlx::Row::get::<i64, _>(&row, 0))
        .unwrap()
}

/// `ERROR` lines in the server's log.
fn errors_in(server: &PgServer) -> Vec<String> {
    std::fs::read_to_string(server.log_file().unwrap())
        .unwrap()
        .lines()
        .filter(|line| line.contains("ERROR:"))
        .map(str::to_owned)
        .collect()
}

/// The claims' guarantees, each through `engine`.
async fn claims_hold(engine: &Engine<Postgres>) {
    // Fresh keys, many clients over few server connections.
    let mut runs = Vec::new();
    for k in 0..40 {
        runs.push(charge(
            engine,
            Box::leak(format!("fresh-{k}").into_boxed_str()),
            10,
        ));
    }
    for via in futures::future::join_all(runs).await {
        assert_eq!(via.unwrap(), Via::Executed);
    }
    // Concurrent duplicates: 16 clients, one key; exactly one runs.
    let duplicates = (0..16).map(|_| charge(engine, "dup", 10));
    let answers = futures::future::join_all(duplicates).await;
    let executed = answers
        .iter()
        .filter(|a| matches!(a, Ok(Via::Executed)))
        .count();
    assert_eq!(executed, 1, "{answers:?}");
    for answer in &answers {
        assert!(
            matches!(
                answer,
                Ok(Via::Executed | Via::Replayed) | Err(IdemError::InProgress { .. })
            ),
            "{answer:?}"
        );
    }
    assert_eq!(charge(engine, "dup", 10).await.unwrap(), Via::Replayed);
    // Replay and reuse.
    assert_eq!(charge(engine, "fresh-1", 10).await.unwrap(), Via::Replayed);
    assert!(matches!(
        charge(engine, "fresh-1", 11).await,
        Err(IdemError::Mismatch)
    ));
    // A crashed durable claim: an in-progress row whose lock has expired.
    sqlx::raw_sql(
        "INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, claim_token, created_at, locked_until, expires_at) \
         SELECT scope, 'crashed', step, fingerprint, 'in_progress', 7, now(), now() - interval '1 second', now() + interval '1 day' \
         FROM idempotency_keys WHERE key = 'fresh-2'",
    )
    .execute(engine.pool())
    .await
    .unwrap();
    // Same fingerprint as fresh-2's (amount 10): taken over, run once.
    assert_eq!(charge(engine, "crashed", 10).await.unwrap(), Via::TookOver);
    assert_eq!(charge(engine, "crashed", 10).await.unwrap(), Via::Replayed);
    assert_eq!(count(engine, "SELECT count(*) FROM payments").await, 42);
    assert_eq!(
        count(
            engine,
            "SELECT count(*) FROM payments GROUP BY key ORDER BY 1 DESC LIMIT 1"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_claims_hold_and_log_no_errors() {
    let (server, bouncer) = server_and_bouncer(PoolMode::Transaction);
    let engine = engine_through(&server, &bouncer, Pooler::Transaction, Policy::default()).await;
    let before = errors_in(&server);
    claims_hold(&engine).await;
    let after = errors_in(&server);
    assert_eq!(
        after.len(),
        before.len(),
        "server errors: {:?}",
        &after[before.len()..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_claims_hold_with_prepared_statements() {
    let (server, bouncer) = server_and_bouncer(PoolMode::Session);
    let engine = engine_through(&server, &bouncer, Pooler::Session, Policy::default()).await;
    let before = errors_in(&server);
    claims_hold(&engine).await;
    let after = errors_in(&server);
    assert_eq!(
        after.len(),
        before.len(),
        "server errors: {:?}",
        &after[before.len()..]
    );
}

/// The row path with `SET LOCAL` bounds (`WaitBound::SetLocal`, as on
/// Citus) behind a transaction pooler: the claims hold, a duplicate of a
/// held key is answered 409 at the bound, and no server connection keeps a
/// bound afterwards (`SET LOCAL` ends with the transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_set_local_bounds_hold_and_leave_no_state() {
    let (server, bouncer) = server_and_bouncer(PoolMode::Transaction);
    let policy = Policy::default().with_wait_timeout(Duration::from_millis(300));
    let engine = engine_through(&server, &bouncer, Pooler::Transaction, policy)
        .await
        .with_key_lock(KeyLock::Row)
        .with_wait_bound(WaitBound::SetLocal);
    let before = errors_in(&server);
    claims_hold(&engine).await;
    let after = errors_in(&server);
    assert_eq!(
        after.len(),
        before.len(),
        "server errors: {:?}",
        &after[before.len()..]
    );
    let Claim::Execute(held) = engine.claim(&op("held", 10)).await.unwrap() else {
        panic!("a fresh key executes")
    };
    let started = Instant::now();
    let waiter = charge(&engine, "held", 10).await;
    assert!(
        matches!(waiter, Err(IdemError::InProgress { .. })),
        "{waiter:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(held);
    // More transactions at once than the pooler has server connections:
    // each of them is seen with the session's default.
    let shows = (0..8).map(|_| async {
        let mut tx = engine.pool().begin().await.unwrap();
        let timeout: String = sqlx::raw_sql("SHOW lock_timeout")
            .fetch_one(&mut *tx)
            .await
            .map(|row| sqlx::Row::get(&row, 0))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.commit().await.unwrap();
        timeout
    });
    for timeout in futures::future::join_all(shows).await {
        assert_eq!(timeout, "0");
    }
}

/// Two relays share the outbox behind PgBouncer (their leases are `FOR
/// UPDATE SKIP LOCKED`), wake by polling only (`listen(false)`, as behind
/// a transaction pooler, where `LISTEN` does not survive), and deliver to
/// an inbox on the same pooler that records each message once; then the
/// purge deletes the expired records. Session mode: the relay's, the
/// inbox's and the purge's own statements are sqlx's named prepared
/// statements, which transaction pooling does not keep (see
/// `transaction_pooling_breaks_named_statements`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_outbox_inbox_and_purge() {
    let (server, bouncer) = server_and_bouncer(PoolMode::Session);
    let engine = engine_through(&server, &bouncer, Pooler::Session, Policy::default()).await;
    let inbox_engine = engine_through(&server, &bouncer, Pooler::Session, Policy::default()).await;
    let inbox =
        Arc::new(idem::inbox::Inbox::new(inbox_engine.clone(), "ledger", RECORD.name()).unwrap());
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = {
        let inbox = inbox.clone();
        let seen = seen.clone();
        InProcessSink::new("events", move |message| {
            let inbox = inbox.clone();
            let seen = seen.clone();
            async move {
                let incoming =
                    idem::inbox::Incoming::new(message.id.clone(), message.payload.clone());
                let verdict = inbox
                    .handle(&incoming, async |tx, incoming| {
                        sqlx::query("INSERT INTO payments VALUES ($1, 0)")
                            .persistent(false)
                            .bind(&incoming.id)
                            .execute(&mut *tx)
                            .await?;
                        Ok::<_, Problem>(())
                    })
                    .await;
                seen.lock()
                    .unwrap()
                    .push(format!("{}:{}", message.id, verdict.as_str()));
                Ok(Delivered::Published { receipt: None })
            }
        })
    };
    let relays: Vec<_> = futures::future::join_all((0..2).map(|i| {
        Relay::new(&engine)
            .shared_sink(Arc::new(sink.clone()))
            .owner(format!("relay-{i}"))
            .listen(false)
            .poll_interval(Duration::from_millis(50))
            .batch(4)
            .spawn()
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let scope = Scope::tenant("acme");
    let mut ids = HashSet::new();
    for k in 0..30 {
        let parent = IdempotencyKey::new(format!("order-{k}")).unwrap();
        let message = Message::to("events", "ledger")
            .json(&k)
            .unwrap()
            .for_step(&parent, NOTIFY)
            .scope(&scope);
        ids.insert(message.id().unwrap().to_owned());
        let op = Operation::new(scope.clone(), parent, CHARGE.name(), &k);
        let done = engine
            .run(&op, async |tx| {
                outbox::enqueue(&mut *tx, &message).await?;
                Ok::<_, Problem>(k)
            })
            .await
            .unwrap();
        assert_eq!(done.via, Via::Executed);
    }
    let start = Instant::now();
    while outbox::backlog(engine.pool()).await.unwrap().pending > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the relays did not drain the outbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for relay in relays {
        relay.shutdown().await;
    }
    let seen = seen.lock().unwrap().clone();
    let processed: HashSet<_> = seen
        .iter()
        .filter_map(|s| s.strip_suffix(":processed"))
        .map(str::to_owned)
        .collect();
    assert_eq!(processed, ids, "{seen:?}");
    assert_eq!(
        count(&inbox_engine, "SELECT count(*) FROM payments").await,
        30
    );
    // The purge, through the pooler.
    sqlx::raw_sql("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
        .execute(engine.pool())
        .await
        .unwrap();
    assert_eq!(engine.purge_expired(7).await.unwrap(), 30);
    assert_eq!(
        count(&engine, "SELECT count(*) FROM idempotency_keys").await,
        0
    );
}

/// What transaction pooling does to sqlx's default statements, and so why
/// `Pooler::Transaction` runs the claim's statements unnamed inside its
/// transaction: named statements prepared by one client meet another
/// client's of the same name on a shared server connection (`42P05`), or a
/// server connection that never saw them (`26000`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_breaks_named_statements() {
    let (server, bouncer) = server_and_bouncer(PoolMode::Transaction);
    let engine = engine_through(&server, &bouncer, Pooler::Transaction, Policy::default()).await;
    let named = (0..16).map(|i| {
        let pool = engine.pool().clone();
        async move {
            let mut failures = 0;
            for _ in 0..20 {
                let result = sqlx::query_scalar::<_, i64>("SELECT $1::int8 + 0")
                    .bind(i)
                    .fetch_one(&pool)
                    .await;
                match result {
                    Ok(value) => assert_eq!(value, i),
                    Err(sqlx::Error::Database(db))
                        if matches!(db.code().as_deref(), Some("42P05") | Some("26000")) =>
                    {
                        failures += 1
                    }
                    Err(error) => panic!("{error}"),
                }
            }
            failures
        }
    });
    let failures: u32 = futures::future::join_all(named).await.into_iter().sum();
    assert!(
        failures > 0,
        "named statements all survived transaction pooling"
    );
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A webhook receiver with an inbox on `engine`: each message's effect is
/// one `payments` row keyed by its id. Served on a loopback port; its URL.
async fn serve_receiver(engine: &Engine<Postgres>) -> String {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::HeaderMap;
    use idem::inbox::webhook::WebhookReceiver;
    use idem::signature::SigningSecret;

    type Receiver = Arc<WebhookReceiver<Postgres>>;
    async fn hook(
        State(receiver): State<Receiver>,
        headers: HeaderMap,
        body: Bytes,
    ) -> axum::response::Response {
        receiver
            .receive(&headers, &body, async |tx, message| {
                sqlx::query("INSERT INTO payments VALUES ($1, 1)")
                    .persistent(false)
                    .bind(&message.id)
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, Problem>(serde_json::json!({ "received": message.id }))
            })
            .await
    }
    let inbox = idem::inbox::Inbox::new(engine.clone(), "ledger", RECORD.name()).unwrap();
    let receiver = WebhookReceiver::new(inbox, SigningSecret::new(SECRET).unwrap());
    let app = axum::Router::new()
        .route("/hooks", axum::routing::post(hook))
        .with_state(Arc::new(receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Waits (at most 30 s) until nothing is pending in `engine`'s outbox.
async fn drained(engine: &Engine<Postgres>) {
    let start = Instant::now();
    while outbox::backlog(engine.pool()).await.unwrap().pending > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the relays did not drain the outbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything beyond the claim, behind PgBouncer in transaction mode with
/// the engines set to `Pooler::Transaction`: two relays lease with `FOR
/// UPDATE SKIP LOCKED` and deliver over real HTTP (signed webhooks) to a
/// receiver whose inbox sits on the same pooler; asked to `listen`, they
/// poll instead, and still deliver. A message delivered again (put back to
/// pending by hand, as a lost mark-sent would leave it) is answered from the
/// inbox's record: the relay counts a duplicate, no effect runs twice. A
/// durable claim commits its in-progress row, completes and replays; a
/// response over 64 KiB (bound to an insert instead of travelling as a
/// literal) is stored and replayed whole; the purges of sent messages and of
/// expired records delete through the pooler. The server's log gains no
/// `ERROR` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_outbox_inbox_durable_large_and_purge() {
    use idem::outbox::WebhookSink;
    use idem::signature::SigningSecret;
    use idem::ClaimMode;

    let (server, bouncer) = server_and_bouncer(PoolMode::Transaction);
    let engine = engine_through(&server, &bouncer, Pooler::Transaction, Policy::default()).await;
    let receiver = engine_through(&server, &bouncer, Pooler::Transaction, Policy::default()).await;
    let before = errors_in(&server);
    let url = serve_receiver(&receiver).await;

    let relays: Vec<_> = futures::future::join_all((0..2).map(|i| {
        Relay::new(&engine)
            .sink(WebhookSink::new(SigningSecret::new(SECRET).unwrap()))
            .owner(format!("relay-{i}"))
            // Ignored behind a transaction pooler: the relays poll.
            .listen(true)
            .poll_interval(Duration::from_millis(50))
            .batch(4)
            .spawn()
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();

    let scope = Scope::tenant("acme");
    let mut ids = HashSet::new();
    let enqueues = (0..30).map(|k| {
        let parent = IdempotencyKey::new(format!("order-{k}")).unwrap();
        let message = Message::webhook(&url)
            .json(&k)
            .unwrap()
            .for_step(&parent, NOTIFY)
            .scope(&scope);
        ids.insert(message.id().unwrap().to_owned());
        let op = Operation::new(scope.clone(), parent, CHARGE.name(), &k);
        let engine = &engine;
        async move {
            engine
                .run(&op, async |tx| {
                    outbox::enqueue(&mut *tx, &message).await?;
                    Ok::<_, Problem>(k)
                })
                .await
                .unwrap()
                .via
        }
    });
    for via in futures::future::join_all(enqueues).await {
        assert_eq!(via, Via::Executed);
    }
    drained(&engine).await;
    // Each message's effect ran once, under its own id.
    let effects: Vec<(String, i64)> =
        sqlx::raw_sql("SELECT key, count(*) FROM payments GROUP BY key")
            .fetch_all(receiver.pool())
            .await
            .unwrap()
            .iter()
            .map(|row| (sqlx::Row::get(row, 0), sqlx::Row::get(row, 1)))
            .collect();
    assert_eq!(effects.len(), 30, "{effects:?}");
    assert!(effects.iter().all(|(id, n)| *n == 1 && ids.contains(id)));

    // A delivery again: answered from the inbox's record.
    let again = ids.iter().next().unwrap().clone();
    let mut tx = engine.pool().begin().await.unwrap();
    sqlx::query(
        "UPDATE idem_outbox SET state = 'pending', available_at = now(), sent_at = NULL \
         WHERE message_id = $1",
    )
    .persistent(false)
    .bind(&again)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    drained(&engine).await;
    let mut stats = idem::outbox::RelayStats::default();
    for relay in relays {
        let last = relay.shutdown().await;
        stats.published += last.published;
        stats.duplicates += last.duplicates;
        stats.fenced += last.fenced;
    }
    assert_eq!((stats.published, stats.duplicates), (30, 1), "{stats:?}");
    assert_eq!(count(&receiver, "SELECT count(*) FROM payments").await, 30);
    // The sent messages' purge, in batches of 7.
    let mut purged = 0;
    loop {
        let batch = outbox::purge_sent(engine.pool(), Duration::ZERO, 7)
            .await
            .unwrap();
        purged += batch;
        if batch == 0 {
            break;
        }
    }
    assert_eq!(purged, 30);
    assert_eq!(count(&engine, "SELECT count(*) FROM idem_outbox").await, 0);

    // A durable claim: its in-progress row commits first, then the work's
    // transaction completes it under the claim token.
    let durable = Policy::default().with_claim_mode(ClaimMode::Durable);
    let op_durable = op("durable-1", 5).with_policy(durable);
    for expected in [Via::Executed, Via::Replayed] {
        let done = engine
            .run(&op_durable, async |tx| {
                sqlx::query("INSERT INTO payments VALUES ('durable-1', 5)")
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, Problem>(5i64)
            })
            .await
            .unwrap();
        assert_eq!((done.via, done.value.unwrap()), (expected, 5));
    }
    // A durable claim whose work fails releases its row at once.
    let failed = engine
        .run(&op("durable-2", 5).with_policy(durable), async |_tx| {
            Err::<i64, _>(Problem::new(503, "downstream unavailable"))
        })
        .await
        .unwrap();
    assert!(failed.value.is_err());
    assert_eq!(
        count(
            &engine,
            "SELECT count(*) FROM idempotency_keys WHERE key = 'durable-2'"
        )
        .await,
        0
    );

    // A response over 64 KiB, stored by the bound insert, replayed whole.
    let large: String = (0..100_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let op_large = op("large-1", 7);
    for expected in [Via::Executed, Via::Replayed] {
        let body = large.clone();
        let done = engine
            .run(&op_large, async |_tx| Ok::<_, Problem>(body))
            .await
            .unwrap();
        assert_eq!(done.via, expected);
        assert_eq!(done.value.unwrap(), large);
    }

    // The records' purge, through the pooler.
    sqlx::raw_sql("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
        .execute(engine.pool())
        .await
        .unwrap();
    assert_eq!(engine.purge_expired(7).await.unwrap(), 30 + 2);
    assert_eq!(
        count(&engine, "SELECT count(*) FROM idempotency_keys").await,
        0
    );
    let after = errors_in(&server);
    assert_eq!(
        after.len(),
        before.len(),
        "server errors: {:?}",
        &after[before.len()..]
    );
}
