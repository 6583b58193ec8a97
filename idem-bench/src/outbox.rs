//! The outbox scenarios: what enqueueing a message costs an idem handler,
//! how fast relays drain the outbox into NATS JetStream against a plain
//! publisher, and how long a message takes from its handler to the stream at
//! a fixed offered rate.
//!
//! The JetStream scenarios start their own `nats-server` (JetStream on a free
//! loopback port, a temporary store) and are skipped, with the reason in the
//! report, when `nats-server` is not installed.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use idem::outbox::{self, nats::NatsSink, Backoff, Message, Relay};
use idem::Backend;
use idem::{steps, Engine, IdemError, IdempotencyKey, Operation, Problem, Scope, Via};
use serde::Serialize;

use crate::batches::{self, BatchSizes};
use crate::charge::{Business, Charge, CHARGE_CARD};
use crate::measure::percentile;
use crate::target::BenchError;

steps! {
    /// The message the enqueueing handler sends.
    pub const CHARGE_NOTICE = "charge-notice.v1";
}

/// The payload every benchmark message carries (about the size of a small
/// JSON event).
const PAYLOAD: &[u8] =
    br#"{"event":"charge.created","amount_cents":2500,"currency":"EUR","tenant":"t"}"#;

/// Enqueue cost on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct EnqueueCost {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Operations per second of the handler alone (median of the rounds).
    pub plain_ops_s: f64,
    /// Operations per second of the handler that also enqueues one message.
    pub enqueue_ops_s: f64,
    /// `enqueue_ops_s / plain_ops_s`.
    pub ratio: f64,
    /// Claims per group commit without and with the enqueue (SQLite).
    pub claims_per_commit: Option<(f64, f64)>,
}

/// Relay throughput into JetStream.
#[derive(Debug, Clone, Serialize)]
pub struct RelayThroughput {
    /// Messages per measurement.
    pub messages: u64,
    /// One `async-nats` publisher awaiting each ack (messages/s, median).
    pub raw_msgs_s: f64,
    /// (relays, messages/s, ratio to raw), median of the rounds.
    pub relays: Vec<(usize, f64, f64)>,
}

/// Enqueue-to-publish latency at a fixed offered rate.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Messages offered per second.
    pub rate: u64,
    /// Messages measured.
    pub messages: u64,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
}

/// Everything the outbox scenarios measured.
#[derive(Debug, Clone, Serialize, Default)]
pub struct OutboxResult {
    /// Per backend.
    pub enqueue: Vec<EnqueueCost>,
    /// Relays into JetStream (Postgres outbox), if nats-server was found.
    pub relay: Option<RelayThroughput>,
    /// Enqueue to publish (Postgres outbox), if nats-server was found.
    pub latency: Option<Latency>,
    /// Why the JetStream scenarios did not run.
    pub skipped: Option<String>,
}

/// The targets the ratios are held to.
pub const ENQUEUE_TARGET: f64 = 0.85;
/// Relay throughput ÷ raw publish-with-ack.
pub const RELAY_TARGET: f64 = 0.5;
/// Enqueue-to-publish median, milliseconds.
pub const LATENCY_P50_TARGET_MS: f64 = 10.0;

/// The idem handler plus one enqueued message, through [`Engine::run`].
async fn keyed_with_message<DB>(
    engine: &Engine<DB>,
    key: String,
    tenant: String,
) -> Result<Via, IdemError>
where
    DB: Business + Backend,
{
    let key = IdempotencyKey::new(key).expect("valid key");
    let scope = Scope::tenant(&tenant);
    let message = Message::to("nats", "bench.charges")
        .body("application/json", PAYLOAD)
        .for_step(&key, CHARGE_NOTICE)
        .scope(&scope);
    let op = Operation::new(scope, key, CHARGE_CARD.name(), &Charge::new());
    let done = engine
        .run(&op, async move |tx| {
            let id = DB::business(tx, &tenant).await?;
            outbox::enqueue(&mut *tx, &message).await?;
            Ok::<_, Problem>(id)
        })
        .await?;
    match done.value {
        Ok(_) => Ok(done.via),
        Err(problem) => panic!("business insert failed: {problem}"),
    }
}

/// Operations per second of `ops` calls by `clients` tasks.
async fn ops_per_second<DB, F, Fut>(
    engine: &Engine<DB>,
    clients: usize,
    ops: u64,
    label: &str,
    call: F,
) -> Result<f64, BenchError>
where
    DB: Business,
    F: Fn(Engine<DB>, String, String) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<Via, IdemError>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (engine, next, label) = (engine.clone(), next.clone(), label.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    return Ok::<_, BenchError>(());
                }
                let via = call(engine.clone(), format!("{label}-{i}"), format!("t{client}"))
                    .await
                    .map_err(|e| format!("{label}: {e}"))?;
                if via != Via::Executed {
                    return Err(format!("{label}: operation {i} was {via}").into());
                }
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| format!("{label}: {e}"))??;
    }
    Ok(ops as f64 / started.elapsed().as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Enqueue cost: the handler with and without one message, interleaved
/// round by round.
pub async fn enqueue_cost<DB>(
    backend: &str,
    engine: &Engine<DB>,
    clients: usize,
    ops: u64,
    rounds: usize,
    run_id: &str,
) -> Result<EnqueueCost, BenchError>
where
    DB: Business + Backend,
{
    let (mut plain, mut with) = (Vec::new(), Vec::new());
    let (mut plain_batches, mut with_batches) = (BatchSizes::default(), BatchSizes::default());
    for round in 0..rounds {
        let (rate, sizes) = batches::recorded(ops_per_second(
            engine,
            clients,
            ops,
            &format!("{run_id}-plain-{round}"),
            |engine, key, tenant| async move { crate::charge::keyed(&engine, key, tenant).await },
        ))
        .await;
        plain.push(rate?);
        plain_batches.add(&sizes);
        let (rate, sizes) = batches::recorded(ops_per_second(
            engine,
            clients,
            ops,
            &format!("{run_id}-enqueue-{round}"),
            |engine, key, tenant| async move { keyed_with_message(&engine, key, tenant).await },
        ))
        .await;
        with.push(rate?);
        with_batches.add(&sizes);
    }
    let (plain_ops_s, enqueue_ops_s) = (median(plain), median(with));
    let cost = EnqueueCost {
        backend: backend.to_owned(),
        clients,
        plain_ops_s,
        enqueue_ops_s,
        ratio: enqueue_ops_s / plain_ops_s,
        claims_per_commit: (plain_batches.commits > 0)
            .then(|| (plain_batches.mean(), with_batches.mean())),
    };
    eprintln!(
        "  outbox enqueue ({backend}, {clients} clients): {:.0} ops/s with, {:.0} without, ratio {:.2} (target >= {ENQUEUE_TARGET})",
        cost.enqueue_ops_s, cost.plain_ops_s, cost.ratio
    );
    Ok(cost)
}

/// A nats-server with JetStream on a free loopback port, killed on drop.
pub struct NatsServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts `nats-server` (or `$IDEM_NATS_SERVER`); `Err` with the reason
    /// if it cannot be started.
    pub fn start() -> Result<Self, String> {
        let binary = std::env::var("IDEM_NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned());
        let dir = tempfile::Builder::new()
            .prefix("idem-bench-nats-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| e.to_string())?;
        let child = Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("js"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("`{binary}` could not be started ({e}); install it (Debian: apt-get install -y nats-server)")
            })?;
        let mut server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline || server.child.try_wait().ok().flatten().is_some() {
                return Err(format!("`{binary}` did not listen on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A relay into `sink` with a retry horizon inside the stream's default
/// two-minute duplicate window.
fn relay<DB: Backend>(engine: &Engine<DB>, sink: &NatsSink, owner: String) -> Relay<DB> {
    Relay::new(engine)
        .sink(sink.clone())
        .owner(owner)
        .batch(64)
        .lease(Duration::from_secs(5))
        .publish_timeout(Duration::from_secs(4))
        .max_attempts(3)
        .backoff(Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        })
        .poll_interval(Duration::from_millis(200))
}

/// Relay throughput with 1 and 4 relays against one publisher awaiting each
/// ack, on the same server, messages and payload.
pub async fn relay_throughput<DB>(
    engine: &Engine<DB>,
    js: &jetstream::Context,
    messages: u64,
    rounds: usize,
    run_id: &str,
) -> Result<RelayThroughput, BenchError>
where
    DB: Backend,
{
    let mut bench = js
        .get_or_create_stream(stream::Config {
            name: "BENCH".into(),
            subjects: vec!["bench.>".into()],
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream: {e}"))?;
    let sink = NatsSink::new(js.clone(), "BENCH");
    let mut raw = Vec::new();
    let mut per_relays: Vec<(usize, Vec<f64>)> = vec![(1, Vec::new()), (4, Vec::new())];
    for round in 0..rounds {
        // One publisher, each publish awaited until JetStream acknowledges it.
        let started = Instant::now();
        for i in 0..messages {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("{run_id}-raw-{round}-{i}").as_str());
            js.publish_with_headers("bench.raw", headers, PAYLOAD.into())
                .await
                .map_err(|e| format!("publish: {e}"))?
                .await
                .map_err(|e| format!("ack: {e}"))?;
        }
        raw.push(messages as f64 / started.elapsed().as_secs_f64());

        for (relays, figures) in &mut per_relays {
            let mut tx = engine.pool().begin().await?;
            for i in 0..messages {
                let message = Message::to("nats", "bench.relay")
                    .body("application/json", PAYLOAD)
                    .with_id(format!("{run_id}-r{relays}-{round}-{i}"), CHARGE_NOTICE);
                outbox::enqueue(&mut *tx, &message).await?;
            }
            tx.commit().await?;
            let before = bench
                .info()
                .await
                .map_err(|e| format!("info: {e}"))?
                .state
                .messages;
            let started = Instant::now();
            let mut handles = Vec::new();
            for n in 0..*relays {
                handles.push(
                    relay(engine, &sink, format!("bench-{n}"))
                        .spawn()
                        .await
                        .map_err(|e| format!("relay: {e}"))?,
                );
            }
            // Drained when the relays have marked every message sent (their
            // counters, read without a query that would compete with them);
            // the backlog is checked once afterwards.
            let deadline = Instant::now() + Duration::from_secs(600);
            while handles.iter().map(|h| h.stats().published).sum::<u64>() < messages {
                if Instant::now() > deadline {
                    return Err("the relays did not drain the outbox in 10 minutes".into());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let elapsed = started.elapsed();
            let left = outbox::backlog(engine.pool()).await?.pending;
            if left > 0 {
                return Err(format!("{relays} relays: {left} messages still pending").into());
            }
            let mut published = 0;
            for handle in handles {
                published += handle.shutdown().await.published;
            }
            let stored = bench
                .info()
                .await
                .map_err(|e| format!("info: {e}"))?
                .state
                .messages
                - before;
            if published != messages || stored != messages {
                return Err(format!(
                    "{relays} relays: {published} published, {stored} stored in the stream, {messages} enqueued"
                )
                .into());
            }
            figures.push(messages as f64 / elapsed.as_secs_f64());
        }
    }
    let raw_msgs_s = median(raw);
    let relays: Vec<(usize, f64, f64)> = per_relays
        .into_iter()
        .map(|(n, figures)| {
            let rate = median(figures);
            (n, rate, rate / raw_msgs_s)
        })
        .collect();
    for (n, rate, ratio) in &relays {
        eprintln!(
            "  outbox relay -> JetStream, {n} relay(s): {rate:.0} msg/s, raw publish-with-ack {raw_msgs_s:.0} msg/s, ratio {ratio:.2} (target >= {RELAY_TARGET})"
        );
    }
    Ok(RelayThroughput {
        messages,
        raw_msgs_s,
        relays,
    })
}

/// Enqueue-to-publish latency: `messages` idem handlers, each enqueueing one
/// message, started at `rate` per second; one relay; a subscriber on the
/// subject notes when each message reaches the server's subscribers. The
/// time runs from the handler's start to that arrival.
pub async fn latency<DB>(
    engine: &Engine<DB>,
    client: &async_nats::Client,
    js: &jetstream::Context,
    rate: u64,
    messages: u64,
    run_id: &str,
) -> Result<Latency, BenchError>
where
    DB: Business + Backend,
{
    let sink = NatsSink::new(js.clone(), "BENCH");
    let relay = relay(engine, &sink, "bench-latency".to_owned())
        .spawn()
        .await
        .map_err(|e| format!("relay: {e}"))?;
    let mut subscriber = client
        .subscribe("bench.latency")
        .await
        .map_err(|e| format!("subscribe: {e}"))?;
    let started: Arc<Mutex<Vec<Option<Instant>>>> =
        Arc::new(Mutex::new(vec![None; messages as usize]));
    let arrivals = tokio::spawn(async move {
        let mut arrived = Vec::new();
        while arrived.len() < messages as usize {
            match tokio::time::timeout(Duration::from_secs(30), subscriber.next()).await {
                Ok(Some(message)) => {
                    let index: usize = std::str::from_utf8(&message.payload)
                        .ok()
                        .and_then(|text| text.parse().ok())
                        .unwrap_or(usize::MAX);
                    arrived.push((index, Instant::now()));
                }
                _ => break,
            }
        }
        arrived
    });
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    for i in 0..messages {
        ticker.tick().await;
        let (engine, started) = (engine.clone(), started.clone());
        let key = format!("{run_id}-latency-{i}");
        tasks.push(tokio::spawn(async move {
            let key = IdempotencyKey::new(key).expect("valid key");
            let scope = Scope::tenant("latency");
            let message = Message::to("nats", "bench.latency")
                .body("text/plain", i.to_string())
                .for_step(&key, CHARGE_NOTICE)
                .scope(&scope);
            let op = Operation::new(scope, key, CHARGE_CARD.name(), &Charge::new());
            started.lock().expect("lock")[i as usize] = Some(Instant::now());
            engine
                .run(&op, async move |tx| {
                    let id = DB::business(tx, "latency").await?;
                    outbox::enqueue(&mut *tx, &message).await?;
                    Ok::<_, Problem>(id)
                })
                .await
                .map(|_| ())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| format!("latency: {e}"))?
            .map_err(|e| format!("latency: {e}"))?;
    }
    let arrived = arrivals.await.map_err(|e| format!("latency: {e}"))?;
    relay.shutdown().await;
    let started = started.lock().expect("lock").clone();
    let mut waits: Vec<Duration> = arrived
        .iter()
        .filter_map(|(index, at)| {
            started
                .get(*index)
                .copied()
                .flatten()
                .map(|from| at.duration_since(from))
        })
        .collect();
    if waits.len() as u64 != messages {
        return Err(format!(
            "latency: {} of {messages} messages reached the subscriber",
            waits.len()
        )
        .into());
    }
    waits.sort();
    // `percentile` answers in microseconds.
    let result = Latency {
        rate,
        messages,
        p50_ms: percentile(&waits, 0.50) / 1000.0,
        p99_ms: percentile(&waits, 0.99) / 1000.0,
    };
    eprintln!(
        "  outbox enqueue -> publish at {rate}/s: p50 {:.1} ms, p99 {:.1} ms (target p50 <= {LATENCY_P50_TARGET_MS} ms)",
        result.p50_ms, result.p99_ms
    );
    Ok(result)
}
