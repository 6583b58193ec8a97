//! Orders → NATS JetStream → a billing consumer, each side with its own
//! idem store, against a running `nats-server` with JetStream.
//!
//! ```text
//! apt-get install -y nats-server          # Debian/Ubuntu package
//! nats-server -js -sd /tmp/idem-nats &    # JetStream on 127.0.0.1:4222
//! cargo run --example billing_nats -- [--nats nats://127.0.0.1:4222] [--orders 5] [--dir DIR]
//! ```
//!
//! 1. The orders service places each order with an `#[idempotent]` handler
//!    that enqueues its `orders.created` event in the outbox, in the claim's
//!    transaction, with the message id `child_key(order key,
//!    "order-created.v1")`. A client retry of the first order is replayed and
//!    enqueues nothing. Relays publish the outbox through the JetStream sink:
//!    relay A publishes the first event, then stalls past its lease before
//!    marking it sent (the `relay-stall-after-publish` fault); relay B
//!    publishes it again, JetStream answers `duplicate: true` (counted as
//!    delivered), and A's late mark-sent is fenced.
//! 2. The billing consumer pulls from the durable consumer `billing` and runs
//!    an `#[idempotent]` handler per message (scope `inbox/billing`, key the
//!    message id): one invoice per order, acknowledged after the commit.
//! 3. The same event sent again under a fresh stream sequence (a re-publish
//!    after the stream's duplicate window) is stored by JetStream but caught by
//!    the inbox: acknowledged as a duplicate, no second invoice.
//!
//! The stores are SQLite files in `--dir` (a fresh temporary directory by
//! default). It prints what happened and exits non-zero unless every order
//! has exactly one invoice. The stream `ORDERS` and consumer `billing` are
//! created if missing; the example purges the stream first so each run starts
//! clean.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use idem::faults::FaultPoint;
use idem::inbox::nats::NatsInbox;
use idem::inbox::{Consumer, Inbox, Incoming};
use idem::outbox::nats::NatsSink;
use idem::outbox::{self, Backoff, Relay};
use idem::sqlx::{self, Sqlite, SqliteConnection};
use idem::{idempotent, Engine, Fingerprint, IdempotencyKey, Problem, Scope, Via};
use serde::{Deserialize, Serialize};

idem::steps! {
    /// Placing an order.
    const PLACE_ORDER = "place-order.v1";
    /// The event an order publishes.
    const ORDER_CREATED = "order-created.v1";
    /// Billing an order, once per event.
    const BILL_ORDER = "bill-order.v1";
}

#[derive(Debug, Clone, Fingerprint, Serialize, Deserialize)]
struct OrderRequest {
    customer: String,
    amount_cents: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderCreated {
    order_id: i64,
    customer: String,
    amount_cents: i64,
}

#[idempotent(scope = "tenant", step = PLACE_ORDER)]
async fn place_order(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] order: OrderRequest,
) -> Result<OrderCreated, Problem> {
    let order_id: i64 = sqlx::query_scalar(
        "INSERT INTO orders (tenant, customer, amount_cents) VALUES (?1, ?2, ?3) RETURNING id",
    )
    .bind(&tenant)
    .bind(&order.customer)
    .bind(order.amount_cents)
    .fetch_one(&mut *tx)
    .await?;
    let event = OrderCreated {
        order_id,
        customer: order.customer,
        amount_cents: order.amount_cents,
    };
    // The event commits with the order, or not at all; its id is stable
    // across retries, so a retried attempt cannot enqueue a second copy.
    let message = outbox::Message::to("nats", "orders.created")
        .json(&event)
        .map_err(|error| {
            Problem::new(500, "Event not encodable")
                .with_detail(format!("The event could not be encoded: {error}."))
        })?
        .for_step(&key, ORDER_CREATED)
        .scope(&Scope::tenant(&tenant));
    outbox::enqueue(&mut *tx, &message).await?;
    Ok(event)
}

/// The orders side's relays: short leases and a retry horizon well inside
/// the stream's duplicate window (the sink checks it at start).
fn relay(orders: &Engine<Sqlite>, sink: &NatsSink) -> Relay<Sqlite> {
    Relay::new(orders)
        .sink(sink.clone())
        .lease(Duration::from_millis(500))
        .publish_timeout(Duration::from_millis(400))
        .max_attempts(5)
        .backoff(Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
        })
        .poll_interval(Duration::from_millis(50))
}

#[idempotent(scope = "consumer", step = BILL_ORDER)]
async fn bill_order(
    tx: &mut SqliteConnection,
    consumer: Consumer,
    key: IdempotencyKey,
    #[fingerprint] message: Incoming,
) -> Result<i64, Problem> {
    let event: OrderCreated = message.json().map_err(|error| {
        Problem::new(422, "Not an order event")
            .with_detail(format!("The message is not an order event: {error}."))
    })?;
    let invoice: i64 = sqlx::query_scalar(
        "INSERT INTO invoices (order_id, amount_cents, event_id) VALUES (?1, ?2, ?3) RETURNING id",
    )
    .bind(event.order_id)
    .bind(event.amount_cents)
    .bind(key.as_str())
    .fetch_one(&mut *tx)
    .await?;
    tracing::debug!(consumer = consumer.name(), invoice, "billed");
    Ok(invoice)
}

struct Args {
    nats: String,
    orders: i64,
    dir: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        nats: "nats://127.0.0.1:4222".to_owned(),
        orders: 5,
        dir: None,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut value = |name: &str| given.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--nats" => args.nats = value("--nats")?,
            "--orders" => {
                args.orders = value("--orders")?
                    .parse()
                    .map_err(|e| format!("--orders: {e}"))?
            }
            "--dir" => args.dir = Some(PathBuf::from(value("--dir")?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

async fn open(path: PathBuf, table: &str) -> Result<Engine<Sqlite>, Box<dyn std::error::Error>> {
    let engine = Engine::<Sqlite>::open_sqlite(&path).await?;
    engine.migrate().await?;
    sqlx::query(table).execute(engine.pool()).await?;
    Ok(engine)
}

async fn demo(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    let temp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&dir)?;
    let orders = open(
        dir.join("orders.db"),
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, \
         customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)",
    )
    .await?;
    let billing = open(
        dir.join("billing.db"),
        "CREATE TABLE IF NOT EXISTS invoices (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL, \
         amount_cents INTEGER NOT NULL, event_id TEXT NOT NULL)",
    )
    .await?;

    let client = async_nats::connect(&args.nats).await.map_err(|e| {
        format!(
            "cannot reach nats-server at {}: {e} (start one with `nats-server -js`)",
            args.nats
        )
    })?;
    let js = jetstream::new(client);
    let stream = js
        .get_or_create_stream(stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    stream.purge().await?;
    let consumer = stream
        .get_or_create_consumer(
            "billing",
            pull::Config {
                durable_name: Some("billing".into()),
                ack_wait: Duration::from_secs(10),
                max_deliver: 10,
                ..Default::default()
            },
        )
        .await?;

    // The orders side: each order and its event commit together.
    let run = format!("run-{}", std::process::id());
    let mut first_event = None;
    for n in 1..=args.orders {
        let key = IdempotencyKey::new(format!("{run}-order-{n}"))?;
        let request = OrderRequest {
            customer: format!("customer-{n}"),
            amount_cents: 1000 * n,
        };
        let placed = place_order(&orders, "shop".into(), key.clone(), request.clone()).await?;
        let event = placed.value?;
        let id = key.child(ORDER_CREATED);
        println!(
            "order {} placed; event {} enqueued",
            event.order_id,
            &id.as_str()[..12]
        );
        if n == 1 {
            // A client retry: replayed, no second order and no second event.
            let retried = place_order(&orders, "shop".into(), key, request).await?;
            assert_eq!(retried.via, Via::Replayed);
            println!("  retried order: {}", retried.via);
            first_event = Some(id);
        }
    }
    let backlog = outbox::backlog(orders.pool()).await?;
    if backlog.pending != args.orders as u64 {
        return Err(format!(
            "{} events enqueued for {} orders",
            backlog.pending, args.orders
        )
        .into());
    }

    // Relay A publishes the oldest event, then stalls past its lease before
    // marking it sent; relay B, started meanwhile, publishes the outbox.
    let sink = NatsSink::new(js.clone(), "ORDERS");
    let stalled = relay(&orders, &sink)
        .batch(1)
        .fault(Some(FaultPoint::RelayStallAfterPublish(
            Duration::from_millis(1500),
        )));
    let a = tokio::spawn(async move {
        stalled.run_once().await?;
        Ok::<_, idem::outbox::RelayError>(stalled.stats())
    });
    let mut published = stream.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while published.info().await?.state.messages == 0 {
        if Instant::now() > deadline {
            return Err("relay A published nothing".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B's start checks the stream keeps ids longer than B may retry.
    let b = relay(&orders, &sink).spawn().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while outbox::backlog(orders.pool()).await?.pending > 0 {
        if Instant::now() > deadline {
            return Err("the outbox was not published within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = a.await??;
    let b = b.shutdown().await;
    println!(
        "relay B: published {}, duplicates {}; relay A: published {}, fenced {}",
        b.published, b.duplicates, a.published, a.fenced
    );
    if b.duplicates != 1 || a.fenced != 1 {
        return Err("relay B's copy of the first event was not a JetStream duplicate".into());
    }
    println!(
        "  re-published event: Duplicate (JetStream dropped relay B's copy; A's mark-sent fenced)"
    );

    // The billing side.
    let inbox = Inbox::new(billing.clone(), "billing", BILL_ORDER.name())?;
    let runner = NatsInbox::new(inbox, js.clone(), consumer)
        .batch(16)
        .expires(Duration::from_millis(500));
    let handler = async |inbox: &Inbox<Sqlite>, message: &Incoming| {
        inbox
            .handle_idempotent(message, async |engine, consumer, key, message| {
                bill_order(engine, consumer, key, message).await
            })
            .await
    };
    let mut processed = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while processed < args.orders as u32 && Instant::now() < deadline {
        processed += runner.poll(&handler).await?.processed;
    }
    println!("billing processed {processed} events");

    // The first event again, under a new stream sequence (as after the
    // duplicate window): the stream stores it, the inbox catches it.
    if let Some(first) = first_event {
        let first = outbox::entry(orders.pool(), first.as_str())
            .await?
            .ok_or("order 1's event is not in the outbox")?;
        let publish = jetstream::message::PublishMessage::build()
            .payload(first.payload.clone().into())
            .header("Idem-Msg-Id", first.message_id.as_str());
        js.send_publish("orders.created", publish).await?.await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let report = runner.poll(&handler).await?;
            if report.duplicates > 0 {
                println!("the late copy of order 1's event: acknowledged as a duplicate");
                break;
            }
            if Instant::now() > deadline {
                return Err("the late copy never arrived".into());
            }
        }
    }

    let invoices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM invoices")
        .fetch_one(billing.pool())
        .await?;
    let distinct: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT order_id) FROM invoices")
        .fetch_one(billing.pool())
        .await?;
    let poisoned = runner.inbox().poisoned().await?.len();
    println!(
        "orders: {}, invoices: {invoices} ({distinct} distinct orders), poisoned: {poisoned}",
        args.orders
    );
    Ok(invoices == args.orders && distinct == args.orders && poisoned == 0)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("{error}\nusage: billing_nats [--nats URL] [--orders N] [--dir DIR]");
            return ExitCode::from(2);
        }
    };
    match demo(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("every order must have exactly one invoice");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("billing_nats: {error}");
            ExitCode::FAILURE
        }
    }
}
