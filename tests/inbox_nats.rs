//! The idempotent consumer behind a real JetStream pull consumer, on SQLite
//! and Postgres: a crash after the commit and before the ack, a crash before
//! the commit, two deliveries of one message at once, and poison (a
//! permanent error, and too many deliveries) through to requeue. Every test
//! counts the effects (rows in `payments`) per message id.

mod inbox_support;
mod nats_harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, consumer::PullConsumer, stream};
use idem::inbox::nats::{BatchReport, NatsInbox};
use idem::inbox::{Consumer, Inbox, Incoming, Verdict};
use idem::outbox::nats::NatsSink;
use idem::outbox::{Delivered, OutgoingMessage, Sink};
use idem::Backend;
use idem::{idempotent, IdempotencyKey, Policy, Problem};
use idem_test_support::{Harness, TestBackend};

idem::steps! {
    const BILL = "bill-order.v1";
}

const STREAM: &str = "ORDERS";

async fn stream_and_consumer(
    js: &jetstream::Context,
    ack_wait: Duration,
) -> (stream::Stream, PullConsumer) {
    stream_with_window(js, ack_wait, Duration::from_secs(120)).await
}

async fn stream_with_window(
    js: &jetstream::Context,
    ack_wait: Duration,
    duplicate_window: Duration,
) -> (stream::Stream, PullConsumer) {
    let stream = nats_harness::create_stream(
        js,
        stream::Config {
            name: STREAM.into(),
            subjects: vec!["orders.>".into()],
            duplicate_window,
            ..Default::default()
        },
    )
    .await;
    let consumer = stream
        .get_or_create_consumer(
            "billing",
            pull::Config {
                durable_name: Some("billing".into()),
                ack_wait,
                max_deliver: 20,
                ..Default::default()
            },
        )
        .await
        .expect("consumer");
    (stream, consumer)
}

fn outgoing(id: &str, payload: &str) -> OutgoingMessage {
    OutgoingMessage {
        id: id.to_owned(),
        step: "order-created.v1".to_owned(),
        destination: "orders.created".to_owned(),
        ordering_key: None,
        headers: Vec::new(),
        content_type: "application/json".to_owned(),
        payload: payload.as_bytes().to_vec(),
        attempt: 1,
    }
}

async fn publish(js: &jetstream::Context, id: &str, payload: &str) {
    let sink = NatsSink::new(js.clone(), STREAM);
    let delivered = sink.publish(&outgoing(id, payload)).await.expect("publish");
    assert!(matches!(delivered, Delivered::Published { .. }));
}

/// Payments made for one message id: its effects.
async fn effects<DB: TestBackend + inbox_support::Effects>(h: &Harness<DB>, id: &str) -> i64 {
    DB::effects(h.engine.pool(), id).await
}

/// The billing handler: one payment row per processed message.
async fn bill<DB: TestBackend + inbox_support::Effects>(
    inbox: &Inbox<DB>,
    message: &Incoming,
) -> Verdict {
    inbox
        .handle(message, async |tx, message| {
            DB::insert_payment(tx, &message.id, 1).await?;
            Ok::<_, Problem>(message.id.clone())
        })
        .await
}

/// Polls until `done` says the accumulated report is enough, or panics after `limit`.
async fn poll_until<DB, F>(
    runner: &NatsInbox<DB>,
    handler: &F,
    limit: Duration,
    done: impl Fn(&BatchReport) -> bool,
) -> BatchReport
where
    DB: Backend,
    F: AsyncFn(&Inbox<DB>, &Incoming) -> Verdict,
{
    let deadline = Instant::now() + limit;
    let mut total = BatchReport::default();
    while !done(&total) {
        assert!(
            Instant::now() < deadline,
            "gave up waiting; so far {total:?}"
        );
        let report = runner.poll(handler).await.expect("poll");
        total.processed += report.processed;
        total.duplicates += report.duplicates;
        total.busy += report.busy;
        total.retried += report.retried;
        total.poisoned += report.poisoned;
    }
    total
}

fn runner<DB: Backend>(
    inbox: Inbox<DB>,
    js: &jetstream::Context,
    consumer: PullConsumer,
) -> NatsInbox<DB> {
    NatsInbox::new(inbox, js.clone(), consumer)
        .batch(8)
        .expires(Duration::from_millis(500))
}

fn inbox<DB: TestBackend + inbox_support::Effects>(h: &Harness<DB>) -> Inbox<DB> {
    Inbox::new(h.engine.clone(), "billing", BILL.name()).expect("inbox")
}

async fn ack_pending(consumer: &mut PullConsumer) -> usize {
    consumer
        .info()
        .await
        .expect("consumer info")
        .num_ack_pending
}

/// The consumer's pending acks once the runner's acks have reached the
/// server (an ack is sent without waiting for the server's reply), or what
/// is still pending after 5 s.
async fn settled(consumer: &mut PullConsumer) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pending = ack_pending(consumer).await;
        if pending == 0 || Instant::now() >= deadline {
            return pending;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs this test binary's `child_consumer_entry` as a consumer process
/// that dies at `mode`, and returns whether it died abnormally.
fn run_child(mode: &str, backend: &str, store_url: &str, nats_url: &str) -> bool {
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_consumer_entry",
            "--include-ignored",
            "--nocapture",
        ])
        .env("IDEM_INBOX_CHILD", mode)
        .env("IDEM_INBOX_BACKEND", backend)
        .env("IDEM_INBOX_STORE", store_url)
        .env("IDEM_INBOX_NATS", nats_url)
        .status()
        .expect("spawn child");
    !status.success()
}

/// The child side of [`run_child`]: consumes once and aborts at the mode's point.
#[tokio::test]
#[ignore = "started as a child process by the crash tests"]
async fn child_consumer_entry() {
    let Ok(mode) = std::env::var("IDEM_INBOX_CHILD") else {
        return;
    };
    let store = std::env::var("IDEM_INBOX_STORE").expect("store");
    let nats = std::env::var("IDEM_INBOX_NATS").expect("nats");
    match std::env::var("IDEM_INBOX_BACKEND").as_deref() {
        Ok("sqlite") => child::<sqlx::Sqlite>(&mode, &store, &nats).await,
        Ok("mysql") => child::<sqlx::MySql>(&mode, &store, &nats).await,
        _ => child::<sqlx::Postgres>(&mode, &store, &nats).await,
    }
}

async fn child<DB: TestBackend + inbox_support::Effects>(mode: &str, store: &str, nats: &str) {
    use idem::faults::{abort_at, FaultPoint};
    let engine = idem::Engine::new(DB::pool(store, &Policy::default()).await);
    let inbox = Inbox::new(engine, "billing", BILL.name()).expect("inbox");
    let js = jetstream::new(nats_harness::connect(&[nats.to_owned()]).await);
    let stream = js.get_stream(STREAM).await.expect("stream");
    let consumer: PullConsumer = stream.get_consumer("billing").await.expect("consumer");
    let before_commit = mode == "before-commit";
    let runner = runner(inbox, &js, consumer).crash_at(if before_commit {
        None
    } else {
        Some(FaultPoint::AfterCommit)
    });
    let handler = async |inbox: &Inbox<DB>, message: &Incoming| {
        inbox
            .handle(message, async |tx, message| {
                DB::insert_payment(tx, &message.id, 1).await?;
                // The payment is written in the claim's transaction, not committed.
                abort_at(
                    before_commit.then_some(FaultPoint::AfterBusinessWrite),
                    FaultPoint::AfterBusinessWrite,
                );
                Ok::<_, Problem>(message.id.clone())
            })
            .await
    };
    for _ in 0..40 {
        runner.poll(&handler).await.expect("poll");
    }
    panic!("the child never received a message");
}

/// (7) Killed after the commit, before the ack: the redelivery is acked as a
/// duplicate, with no second effect.
async fn killed_after_commit<DB: TestBackend + inbox_support::Effects>(
    h: Harness<DB>,
    backend: &str,
) {
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    let (_stream, mut consumer) = stream_and_consumer(&js, Duration::from_secs(1)).await;
    publish(&js, "order-1", r#"{"order":1}"#).await;

    assert!(
        run_child("after-commit", backend, h.db.url(), &server.url()),
        "the child must die"
    );
    assert_eq!(
        effects(&h, "order-1").await,
        1,
        "committed before the crash"
    );

    let runner = runner(inbox(&h), &js, consumer.clone());
    let report = poll_until(&runner, &bill, Duration::from_secs(20), |r| {
        r.duplicates >= 1
    })
    .await;
    assert_eq!(report.processed, 0);
    assert_eq!(
        effects(&h, "order-1").await,
        1,
        "the redelivery did no work"
    );
    assert_eq!(settled(&mut consumer).await, 0, "the duplicate was acked");
}

/// (8) Killed before the commit: the redelivery processes it, once.
async fn killed_before_commit<DB: TestBackend + inbox_support::Effects>(
    h: Harness<DB>,
    backend: &str,
) {
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    let (_stream, mut consumer) = stream_and_consumer(&js, Duration::from_secs(1)).await;
    publish(&js, "order-2", r#"{"order":2}"#).await;

    assert!(
        run_child("before-commit", backend, h.db.url(), &server.url()),
        "the child must die"
    );
    assert_eq!(effects(&h, "order-2").await, 0, "nothing committed");

    let runner = runner(inbox(&h), &js, consumer.clone());
    let report = poll_until(&runner, &bill, Duration::from_secs(20), |r| {
        r.processed >= 1
    })
    .await;
    assert_eq!(report.duplicates, 0);
    assert_eq!(effects(&h, "order-2").await, 1);
    assert_eq!(settled(&mut consumer).await, 0);
    // Nothing comes back.
    let later = runner.poll(&bill).await.expect("poll");
    assert_eq!(later.total(), 0);
}

/// (9) The handler outlives `ack_wait`, so the server delivers the message
/// again while the first delivery still holds the claim: one effect, the
/// other delivery nak'd as busy.
async fn concurrent_deliveries<DB: TestBackend + inbox_support::Effects>(h: Harness<DB>) {
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    let (_stream, mut consumer) = stream_and_consumer(&js, Duration::from_secs(1)).await;
    publish(&js, "order-3", r#"{"order":3}"#).await;

    let slow = async |inbox: &Inbox<DB>, message: &Incoming| {
        inbox
            .handle(message, async |tx, message| {
                DB::insert_payment(tx, &message.id, 1).await?;
                tokio::time::sleep(Duration::from_millis(2500)).await;
                Ok::<_, Problem>(message.id.clone())
            })
            .await
    };
    let first = runner(inbox(&h), &js, consumer.clone());
    let second = runner(inbox(&h), &js, consumer.clone());
    let (a, b) = tokio::join!(
        poll_until(&first, &slow, Duration::from_secs(20), |r| r.total() >= 1),
        async {
            // Let the first delivery start, then wait for the redelivery.
            tokio::time::sleep(Duration::from_millis(300)).await;
            poll_until(&second, &slow, Duration::from_secs(20), |r| r.total() >= 1).await
        }
    );
    let all = [a, b];
    let processed: u32 = all.iter().map(|r| r.processed).sum();
    let busy: u32 = all.iter().map(|r| r.busy).sum();
    assert_eq!(processed, 1, "{all:?}");
    assert!(
        busy >= 1,
        "the overlapping delivery was nak'd as busy: {all:?}"
    );
    assert_eq!(effects(&h, "order-3").await, 1);
    // Whatever is redelivered after the nak is a duplicate.
    let deadline = Instant::now() + Duration::from_secs(15);
    while ack_pending(&mut consumer).await > 0 {
        assert!(Instant::now() < deadline, "messages left unacked");
        let report = first.poll(&slow).await.expect("poll");
        assert_eq!(report.processed, 0);
    }
    assert_eq!(effects(&h, "order-3").await, 1);
}

/// (10) A permanent error poisons the message: recorded, terminated (never
/// redelivered); requeued, it is processed once the handler accepts it.
/// Too many transient failures poison it too.
async fn poison_and_requeue<DB: TestBackend + inbox_support::Effects>(h: Harness<DB>) {
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    let (_stream, mut consumer) = stream_and_consumer(&js, Duration::from_secs(5)).await;
    publish(&js, "order-4", r#"{"order":4,"sku":"discontinued"}"#).await;
    publish(&js, "order-5", r#"{"order":5,"flaky":true}"#).await;

    let accept = Arc::new(AtomicBool::new(false));
    let handler = {
        let accept = accept.clone();
        async move |inbox: &Inbox<DB>, message: &Incoming| {
            let accept = accept.load(Ordering::SeqCst);
            inbox
                .handle(message, async |tx, message| {
                    let body: serde_json::Value = message
                        .json()
                        .map_err(|e| Problem::new(400, e.to_string()))?;
                    if !accept && body.get("sku").is_some() {
                        return Err(Problem::new(422, "unknown sku"));
                    }
                    if !accept && body.get("flaky").is_some() {
                        return Err(Problem::new(503, "pricing service unavailable"));
                    }
                    DB::insert_payment(tx, &message.id, 1).await?;
                    Ok(message.id.clone())
                })
                .await
        }
    };
    let inbox = inbox(&h)
        .max_deliveries(2)
        .backoff(Duration::from_millis(50), Duration::from_millis(100));
    let runner = runner(inbox.clone(), &js, consumer.clone());
    let report = poll_until(&runner, &handler, Duration::from_secs(20), |r| {
        r.poisoned >= 2
    })
    .await;
    assert_eq!(report.processed, 0);
    assert_eq!(
        report.retried, 1,
        "order-5 failed once transiently first: {report:?}"
    );
    assert_eq!(h.payments().await, 0);
    assert_eq!(settled(&mut consumer).await, 0, "terminated, not pending");

    let poisoned = inbox.poisoned().await.expect("poisoned");
    let ids: Vec<&str> = poisoned.iter().map(|p| p.message_id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{poisoned:?}");
    let four = poisoned
        .iter()
        .find(|p| p.message_id == "order-4")
        .expect("order-4");
    assert!(four.error.contains("unknown sku"), "{}", four.error);
    assert_eq!(four.source.as_deref(), Some("orders.created"));
    assert_eq!(four.payload, br#"{"order":4,"sku":"discontinued"}"#);
    let five = poisoned
        .iter()
        .find(|p| p.message_id == "order-5")
        .expect("order-5");
    assert!(
        five.error.contains("gave up after 2 deliveries"),
        "{}",
        five.error
    );
    assert_eq!(five.deliveries, 2);

    // Terminated: nothing is redelivered.
    assert_eq!(runner.poll(&handler).await.expect("poll").total(), 0);

    // Fixed; requeue both: each is processed exactly once.
    accept.store(true, Ordering::SeqCst);
    for id in ["order-4", "order-5"] {
        let row = runner.requeue(id).await.expect("requeue");
        assert_eq!(row.state, "requeued");
        assert_eq!(row.requeues, 1);
    }
    let report = poll_until(&runner, &handler, Duration::from_secs(20), |r| {
        r.processed >= 2
    })
    .await;
    assert_eq!(report.poisoned, 0);
    assert_eq!(h.payments().await, 2);
    assert!(inbox.poisoned().await.expect("poisoned").is_empty());
    assert_eq!(
        inbox
            .poison_entry("order-4")
            .await
            .expect("entry")
            .expect("kept")
            .state,
        "requeued"
    );
    // Requeueing a message that is not poisoned is a clear error.
    let error = inbox.requeue("order-6").await.expect_err("not poisoned");
    assert!(error.to_string().contains("no poisoned message"), "{error}");
    assert_eq!(settled(&mut consumer).await, 0);
}

/// Messages the inbox cannot key are never processed blind: one without
/// `Nats-Msg-Id`, one whose id is not a valid key, and one whose id was used
/// before with another payload are each terminated and kept as poison.
async fn unkeyable_messages_poisoned<DB: TestBackend + inbox_support::Effects>(h: Harness<DB>) {
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    let (_stream, mut consumer) =
        stream_with_window(&js, Duration::from_secs(5), Duration::from_secs(1)).await;
    js.publish("orders.created", r#"{"order":8}"#.into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    publish(&js, "order 9 with spaces", r#"{"order":9}"#).await;
    publish(&js, "order-10", r#"{"order":10}"#).await;
    let runner = runner(inbox(&h), &js, consumer.clone());
    let report = poll_until(&runner, &bill, Duration::from_secs(10), |r| r.total() >= 3).await;
    assert_eq!((report.poisoned, report.processed), (2, 1), "{report:?}");
    // The same id again with another payload, after the stream's window.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    publish(&js, "order-10", r#"{"order":10,"amount":1}"#).await;
    let report = poll_until(&runner, &bill, Duration::from_secs(10), |r| r.total() >= 1).await;
    assert_eq!(report.poisoned, 1, "{report:?}");
    assert_eq!(effects(&h, "order-10").await, 1);
    assert_eq!(h.payments().await, 1);
    assert_eq!(settled(&mut consumer).await, 0);

    let poisoned = runner.inbox().poisoned().await.expect("poisoned");
    let error_of = |id: &str| {
        poisoned
            .iter()
            .find(|p| p.message_id == id)
            .unwrap_or_else(|| panic!("{id} not poisoned: {poisoned:?}"))
            .error
            .clone()
    };
    assert!(error_of("stream-seq-1").contains("no Nats-Msg-Id"));
    assert!(error_of("order 9 with spaces").contains("not a valid key"));
    assert!(error_of("order-10").contains("different payload"));
}

/// An `#[idempotent]` function as the consumer's handler: scope is the
/// [`Consumer`], key the message id, fingerprint the message.
#[idempotent(scope = "consumer", step = BILL)]
async fn bill_idempotent<DB: TestBackend>(
    tx: &mut DB::Connection,
    consumer: Consumer,
    key: IdempotencyKey,
    #[fingerprint] message: Incoming,
) -> Result<String, Problem> {
    assert_eq!(consumer.name(), "billing");
    assert_eq!(key.as_str(), message.id);
    DB::insert_payment(tx, &message.id, 1).await?;
    Ok(format!("billed {}", message.id))
}

/// The same message twice through an `#[idempotent]` handler: one effect,
/// the second delivery a duplicate.
async fn idempotent_macro_handler<DB: TestBackend + inbox_support::Effects, F>(
    h: Harness<DB>,
    handler: F,
) where
    F: AsyncFn(&Inbox<DB>, &Incoming) -> Verdict,
{
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    let (mut stream, consumer) =
        stream_with_window(&js, Duration::from_secs(5), Duration::from_secs(1)).await;
    // Published twice, the second time after the stream's duplicate window
    // forgot the id: two stream messages, one message id.
    let stream_copy = async |id: &str| {
        let publish = jetstream::message::PublishMessage::build()
            .payload(r#"{"order":7}"#.into())
            .header("Nats-Msg-Id", id);
        js.send_publish("orders.created", publish)
            .await
            .expect("publish")
            .await
            .expect("ack");
    };
    stream_copy("order-7").await;
    let runner = runner(inbox(&h), &js, consumer);
    let report = poll_until(&runner, &handler, Duration::from_secs(10), |r| {
        r.processed >= 1
    })
    .await;
    assert_eq!(report.duplicates, 0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stream_copy("order-7").await;
    let report = poll_until(&runner, &handler, Duration::from_secs(10), |r| {
        r.duplicates >= 1
    })
    .await;
    assert_eq!(report.processed, 0);
    assert_eq!(effects(&h, "order-7").await, 1);
    let stored = stream.info().await.expect("stream info").state.messages;
    assert_eq!(
        stored, 2,
        "the stream kept both copies; the inbox caught the second"
    );
}

macro_rules! inbox_cases {
    ($module:ident, $db:ty) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_after_commit_then_duplicate() {
                killed_after_commit(
                    idem_test_support::stores::$module(Policy::default()).await,
                    stringify!($module),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_before_commit_then_processed_once() {
                killed_before_commit(
                    idem_test_support::stores::$module(Policy::default()).await,
                    stringify!($module),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_deliveries_one_effect() {
                concurrent_deliveries(idem_test_support::stores::$module(Policy::default()).await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn poison_terminated_recorded_requeued_processed() {
                poison_and_requeue(idem_test_support::stores::$module(Policy::default()).await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn unkeyable_messages_are_poisoned() {
                unkeyable_messages_poisoned(
                    idem_test_support::stores::$module(Policy::default()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn idempotent_function_as_handler() {
                idempotent_macro_handler(
                    idem_test_support::stores::$module(Policy::default()).await,
                    async |inbox: &Inbox<$db>, message: &Incoming| {
                        inbox
                            .handle_idempotent(message, async |engine, consumer, key, message| {
                                bill_idempotent::<$db>(engine, consumer, key, message).await
                            })
                            .await
                    },
                )
                .await;
            }
        }
    };
}

inbox_cases!(sqlite, sqlx::Sqlite);
inbox_cases!(postgres, sqlx::Postgres);
inbox_cases!(mysql, sqlx::MySql);
