//! Orders → NATS JetStream → a billing consumer, each side with its own
//! idem store, against a running `nats-server` with JetStream.
//!
//! ```text
//! apt-get install -y nats-server          # Debian/Ubuntu package
//! nats-server -js -sd /tmp/idem-nats &    # JetStream on 127.0.0.1:4222
//! cargo run --example billing_nats -- [--nats nats://127.0.0.1:4222] [--orders 5] [--dir DIR]
//! ```
//!
//! 1. The orders service places each order with an `#[idempotent]` handler,
//!    then publishes `orders.created` through the JetStream sink with the
//!    message id `child_key(order key, "order-created.v1")`. A client retry
//!    of the first order is replayed, and the re-publish of its event (what
//!    a relay does after a crash) is answered `duplicate: true` by JetStream.
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
use idem::inbox::nats::NatsInbox;
use idem::inbox::{Consumer, Inbox, Message};
use idem::outbox::nats::NatsSink;
use idem::outbox::{Delivered, OutgoingMessage, Sink};
use idem::sqlx::{self, Sqlite, SqliteConnection};
use idem::{idempotent, Engine, Fingerprint, IdempotencyKey, Problem, Via};
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
    Ok(OrderCreated {
        order_id,
        customer: order.customer,
        amount_cents: order.amount_cents,
    })
}

#[idempotent(scope = "consumer", step = BILL_ORDER)]
async fn bill_order(
    tx: &mut SqliteConnection,
    consumer: Consumer,
    key: IdempotencyKey,
    #[fingerprint] message: Message,
) -> Result<i64, Problem> {
    let event: OrderCreated = message
        .json()
        .map_err(|error| Problem::new(422, "not an order event").with_detail(error.to_string()))?;
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

    // The orders side: the sink refuses to start if the stream would forget
    // ids sooner than we may retry.
    let sink = NatsSink::new(js.clone(), "ORDERS");
    sink.check(Duration::from_secs(60)).await?;
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
        let message = OutgoingMessage {
            id: key.child(ORDER_CREATED).as_str().to_owned(),
            step: ORDER_CREATED.name().to_owned(),
            destination: "orders.created".to_owned(),
            ordering_key: None,
            headers: Vec::new(),
            content_type: "application/json".to_owned(),
            payload: serde_json::to_vec(&event)?,
            attempt: 1,
        };
        let delivered = sink.publish(&message).await?;
        println!(
            "order {} placed; event {} {:?}",
            event.order_id,
            &message.id[..12],
            delivered
        );
        if n == 1 {
            // A client retry: replayed, no second order.
            let retried = place_order(&orders, "shop".into(), key, request).await?;
            assert_eq!(retried.via, Via::Replayed);
            // A relay re-publish after a crash: JetStream drops it.
            let again = sink.publish(&message).await?;
            println!(
                "  retried order: {}; re-published event: {again:?}",
                retried.via
            );
            assert!(matches!(again, Delivered::Duplicate { .. }));
            first_event = Some(message);
        }
    }

    // The billing side.
    let inbox = Inbox::new(billing.clone(), "billing", BILL_ORDER.name())?;
    let runner = NatsInbox::new(inbox, js.clone(), consumer)
        .batch(16)
        .expires(Duration::from_millis(500));
    let handler = async |inbox: &Inbox<Sqlite>, message: &Message| {
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
        let publish = jetstream::message::PublishMessage::build()
            .payload(first.payload.clone().into())
            .header("Idem-Msg-Id", first.id.as_str());
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
