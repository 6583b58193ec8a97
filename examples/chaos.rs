//! Random kills across the checkout flow, with traffic flowing.
//!
//! ```text
//! cargo run --release --example chaos -- [--backend sqlite|postgres|mysql|all]
//!     [--checkouts N] [--seconds N] [--clients N] [--seed N]
//! cargo run --release --example chaos -- --failover [--keys N] [--clients N]
//! cargo run --release --example chaos -- --failover --cluster-url URL \
//!     --standby-url URL --kill-cmd CMD --replication synchronous|asynchronous
//!     [--keys N] [--clients N]
//! cargo run --release --example chaos -- --shards [--tenants N] [--keys N]
//!     [--clients N] [--moves N] [--seconds N] [--seed N]
//! ```
//!
//! With `--failover`, instead: a Postgres primary failover under load, once
//! with synchronous and once with asynchronous replication (the scenario of
//! `tests/failover.rs`, at `--keys` keys, default 2000, and `--clients`
//! clients, default 8; the primary is killed once three eighths of the keys
//! are answered). The load is retrying clients over HTTP: each client sends
//! its keys to the scenario's charge service (an `#[idempotent(http)]`
//! handler served on a loopback socket, whose engine and pool live through
//! the failover) with idem-client, which retries 503s, 409s and lost
//! connections with the same `Idempotency-Key`, honouring `Retry-After`,
//! until a 201. It prints each run's figures (answers lost, re-executions,
//! the clients' retries, 503s, 409s, those without `Retry-After`, other
//! 5xx, replays byte-identical to the first answer, the receiver's
//! deliveries, those answered from its inbox's record, effects run twice,
//! the time without a primary) and exits non-zero if an effect ran twice at
//! the receiver, a synchronous run lost an answer, an asynchronous run
//! re-executed a key whose answer was not lost, a key was still held (409)
//! when every key was sent once more after the failover, or over HTTP a
//! 5xx other than 503 came back, a 503 or 409 came without `Retry-After`,
//! or a replay differed from the first answer.
//!
//! With `--cluster-url`, the failover runs once, on a cluster managed by
//! other software (`examples/patroni/run.sh` starts Patroni, etcd and
//! HAProxy and runs this): `--cluster-url` is the server's URL through the
//! address that follows the leader (no database: the run creates its own),
//! `--standby-url` the standby's own, `--replication` what the cluster was
//! set up with (checked before the load). The primary is killed by running
//! `--kill-cmd` with `sh -c`; the standby has taken over once a connection
//! through `--cluster-url` reaches a server that is not in recovery.
//!
//! With `--shards`, instead: tenants moved between three Postgres shards
//! while the service's two replicas are killed at random (the scenario of
//! `tests/shards.rs`, at `--tenants` tenants, default 12, `--keys` keys,
//! default 3000, `--clients` clients, default 8, `--moves` moves, default 2,
//! the keys spread over `--seconds`, default 60). It prints the figures
//! (ops, tenants, moves, kills, retries, the 503s of the moving tenants,
//! lost, duplicates, inconsistencies, elapsed; each move's runs and first
//! answers from either side of its flip) and exits non-zero if any of the
//! last three is not zero.
//!
//! The checkout demo's services run as separate processes (this program,
//! re-executed with `--role`): the order service with its outbox relay, the
//! payments service (its gRPC `Charge` and its HTTP API, from one store), and
//! the notifications service. The order service charges over gRPC, through
//! idem-client's retry layer. On `sqlite` each service has its own SQLite
//! file; on `postgres` each has its own database on one Postgres server (a
//! throwaway cluster, or the server `IDEM_TEST_DATABASE_URL` names), and
//! payments runs as two replicas on one database, which the order service
//! calls in turn (each attempt of a charge goes to the next replica). On
//! `mysql` the same, on one MariaDB/MySQL server (a throwaway server, or the
//! one `IDEM_TEST_MYSQL_URL` names). `all` (the default) runs the three in
//! turn.
//!
//! Concurrent clients (`--clients`, default 8) run `--checkouts` logical
//! checkouts (default 1000, starting evenly spread over `--seconds`, default
//! 120), each with its own `Idempotency-Key`, retried
//! (with `idem-client`) until a definitive answer, then sent once more to
//! get the replay. Meanwhile a chaos task, every 0.3 to 1.5 s, sends a
//! service SIGKILL (one time in five SIGTERM, a graceful stop) and restarts
//! it 0.1 to 1 s later: the first kills visit every service once, in a
//! random order, then each victim is drawn at random. When the checkouts are done the chaos stops, the outbox is
//! drained, every checkout is replayed once more, and the stores are read:
//!
//! - **lost**: a checkout without a definitive answer, or a 201 without its
//!   order, its charge or its notification;
//! - **duplicates**: a second charge or notification for one order;
//! - **inconsistencies**: a replay that differs in any byte from the first
//!   answer, an answer other than 201, an order whose payment is not the
//!   charge's, or an order, charge or notification no 201 announced.
//!
//! It prints one line per backend (ops, kills with the kills per service,
//! retries, lost, duplicates, inconsistencies, elapsed) and exits non-zero if any of the last three is
//! not zero. Every service process is killed when the run ends, and exits on
//! its own if this program dies (its stdin closes).

#[path = "../tests/failover_scenario/mod.rs"]
mod failover_scenario;
#[path = "services/notifications.rs"]
mod notifications;
#[path = "services/orders.rs"]
mod orders;
#[path = "services/payments.rs"]
mod payments;
#[path = "services/payments_grpc.rs"]
mod payments_grpc;
#[path = "../tests/shards_scenario/mod.rs"]
mod shards_scenario;

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::outbox::{self, Backoff};
use idem::{Engine, IdempotencyKey, Policy};
use idem_client::reqwest_middleware::ClientWithMiddleware;
use idem_client::{ClientError, RequestBuilderExt, ResponseExt, RetryPolicy};
use idem_test_support::free_port;
use notifications::NotificationLog;
use orders::{OrderBook, Orders};
use payments::Ledger;
use sqlx::{MySql, Postgres, Sqlite};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::Mutex;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The tenant every checkout is made for.
const TENANT: &str = "chaos-shop";
/// How long one logical checkout may take, retries included, before it
/// counts as lost.
const CHECKOUT_DEADLINE: Duration = Duration::from_secs(120);
/// How long a service may take to start (migrations included).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a service may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the outbox may take to drain once the chaos stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// The services, each in a process of its own
// ---------------------------------------------------------------------------

/// A backend the checkout flow's three services run on.
trait FlowBackend: OrderBook + NotificationLog + Ledger {
    /// An engine on the store `url` names.
    fn connect(
        url: &str,
    ) -> impl std::future::Future<Output = Result<Engine<Self>, BoxError>> + Send;
}

impl FlowBackend for Sqlite {
    async fn connect(url: &str) -> Result<Engine<Self>, BoxError> {
        let pool = idem::store::sqlite::connect(url, &Policy::default(), 8).await?;
        Ok(Engine::new(pool))
    }
}

impl FlowBackend for Postgres {
    async fn connect(url: &str) -> Result<Engine<Self>, BoxError> {
        let pool = idem::store::postgres::connect(url, &Policy::default(), 8).await?;
        Ok(Engine::new(pool))
    }
}

impl FlowBackend for MySql {
    async fn connect(url: &str) -> Result<Engine<Self>, BoxError> {
        let pool = idem::store::mysql::connect(url, &Policy::default(), 8).await?;
        Ok(Engine::new(pool))
    }
}

/// `chaos --role orders|payments|notifications --listen ADDR --store URL
/// [--grpc-listen ADDR] [--payments URL,URL...] [--notifications URL]`: one
/// service, until SIGTERM (a graceful stop) or until its stdin closes (the
/// run ended). Payments serves gRPC on `--grpc-listen`; `--payments` names
/// its replicas' gRPC URLs.
async fn serve_role(args: &HashMap<String, String>) -> Result<(), BoxError> {
    // The run holds this process's stdin: when the run is gone, so is this.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    let arg = |name: &str| {
        args.get(name)
            .cloned()
            .ok_or_else(|| format!("--{name} is required"))
    };
    let store = arg("store")?;
    let listener = tokio::net::TcpListener::bind(arg("listen")?).await?;
    let postgres = store.starts_with("postgres://");
    let mysql = store.starts_with("mysql://");
    match arg("role")?.as_str() {
        "payments" => {
            let store = payments::Store::open(Some(&store)).await?;
            let grpc = tokio::net::TcpListener::bind(arg("grpc-listen")?).await?;
            serve_payments(listener, grpc, &store).await
        }
        "orders" if postgres => serve_orders::<Postgres>(listener, &store, args).await,
        "orders" if mysql => serve_orders::<MySql>(listener, &store, args).await,
        "orders" => serve_orders::<Sqlite>(listener, &store, args).await,
        "notifications" if postgres => serve_notifications::<Postgres>(listener, &store).await,
        "notifications" if mysql => serve_notifications::<MySql>(listener, &store).await,
        "notifications" => serve_notifications::<Sqlite>(listener, &store).await,
        other => Err(format!("unknown role {other:?}").into()),
    }
}

async fn serve_orders<DB: FlowBackend>(
    listener: tokio::net::TcpListener,
    store: &str,
    args: &HashMap<String, String>,
) -> Result<(), BoxError> {
    let engine = DB::connect(store).await?;
    orders::prepare(&engine).await?;
    let replicas: Vec<String> = args
        .get("payments")
        .ok_or("--payments is required")?
        .split(',')
        .map(str::to_owned)
        .collect();
    // Each attempt of a charge goes to the next replica, over gRPC; the
    // whole call stays well inside the order's 2 s claim lock.
    let policy = RetryPolicy::default()
        .max_attempts(4)
        .deadline(Duration::from_millis(1500))
        .attempt_timeout(Duration::from_secs(1))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .retry_after_cap(Duration::from_millis(300));
    let app = orders::router(Orders {
        engine: engine.clone(),
        payments: orders::payments_client(orders::RoundRobin::new(&replicas)?, policy),
        notifications_url: args
            .get("notifications")
            .cloned()
            .ok_or("--notifications is required")?,
    });
    let relay = orders::relay(
        &engine,
        "chaos-relay",
        notifications::WEBHOOK_SECRET,
        Duration::from_secs(1),
        Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        },
    )?
    .spawn()
    .await?;
    serve(listener, app, Some(relay)).await
}

async fn serve_notifications<DB: FlowBackend>(
    listener: tokio::net::TcpListener,
    store: &str,
) -> Result<(), BoxError> {
    let engine = DB::connect(store).await?;
    let app = notifications::service(&engine).await?;
    serve(listener, app, None).await
}

/// Serves `app` until SIGTERM, then stops `relay`.
async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    relay: Option<outbox::RelayHandle>,
) -> Result<(), BoxError> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            terminate.recv().await;
        })
        .await?;
    if let Some(relay) = relay {
        relay.shutdown().await;
    }
    Ok(())
}

/// Serves payments' HTTP API on `http` and its gRPC `Charge` on `grpc`, from
/// `store`, until SIGTERM stops both.
async fn serve_payments(
    http: tokio::net::TcpListener,
    grpc: tokio::net::TcpListener,
    store: &payments::Store,
) -> Result<(), BoxError> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    println!(
        "listening on http://{} (gRPC on http://{})",
        http.local_addr()?,
        grpc.local_addr()?
    );
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let http = axum::serve(http, store.router(payments::Config::default()))
        .with_graceful_shutdown(until_stopped(stopped.clone()));
    let grpc = tonic::transport::Server::builder()
        .add_routes(payments_grpc::routes(store))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc),
            until_stopped(stopped),
        );
    let signal = async move {
        terminate.recv().await;
        let _ = stop.send(true);
    };
    let (http, grpc, ()) = tokio::join!(async { http.await }, grpc, signal);
    http?;
    grpc?;
    Ok(())
}

/// A service process of the run: started, killed and restarted on the same
/// port with the same arguments. Killed when dropped.
struct Service {
    name: String,
    args: Vec<String>,
    child: Option<(Child, ChildStdout)>,
}

impl Service {
    fn new(name: &str, role: &str, port: u16, store: &str, extra: &[(&str, String)]) -> Self {
        let mut args = vec![
            "--role".to_owned(),
            role.to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--store".to_owned(),
            store.to_owned(),
        ];
        for (name, value) in extra {
            args.push(format!("--{name}"));
            args.push(value.clone());
        }
        Self {
            name: name.to_owned(),
            args,
            child: None,
        }
    }

    /// Starts the process and waits until it listens.
    async fn start(&mut self) -> Result<(), BoxError> {
        let started = Instant::now();
        loop {
            match self.try_start().await {
                Ok(()) => return Ok(()),
                // A port still held by the killed process, a store still
                // locked: try again for a while.
                Err(error) if started.elapsed() < START_TIMEOUT => {
                    note(&format!("{} did not start ({error}); again", self.name));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(format!("{} did not start: {error}", self.name).into()),
            }
        }
    }

    async fn try_start(&mut self) -> Result<(), BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        let read = tokio::time::timeout(START_TIMEOUT, lines.read_line(&mut line)).await;
        match read {
            Ok(Ok(n)) if n > 0 && line.starts_with("listening on ") => {
                self.child = Some((child, lines.into_inner()));
                Ok(())
            }
            _ => {
                let _ = child.kill().await;
                Err(format!("no `listening on` line (got {line:?})").into())
            }
        }
    }

    /// Stops the process: SIGKILL, or SIGTERM and a graceful stop (SIGKILL
    /// if it takes longer than [`STOP_TIMEOUT`]).
    async fn stop(&mut self, graceful: bool) -> Result<(), BoxError> {
        let Some((mut child, _stdout)) = self.child.take() else {
            return Ok(());
        };
        if graceful {
            if let Some(pid) = child.id() {
                std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()?;
                if tokio::time::timeout(STOP_TIMEOUT, child.wait())
                    .await
                    .is_ok()
                {
                    return Ok(());
                }
            }
        }
        child.kill().await?;
        Ok(())
    }
}

/// A line on stderr about the run itself (not a result).
fn note(note: &str) {
    eprintln!("chaos: {note}");
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

/// What the run counts.
#[derive(Default)]
struct Counters {
    /// HTTP attempts the clients sent.
    ops: AtomicU64,
    /// Attempts past the first of each logical call.
    retries: AtomicU64,
    sigkills: AtomicU64,
    sigterms: AtomicU64,
    /// Kills per service, by name.
    kills_by_service: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

/// A definitive answer: its status and every byte of its body.
#[derive(Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
    replayed: bool,
}

/// One logical checkout.
struct Checkout {
    key: String,
    order_ref: String,
    body: String,
}

impl Checkout {
    fn new(run: &str, i: usize) -> Self {
        let order_ref = format!("ord-{run}-{i}");
        let body = serde_json::json!({
            "order_ref": order_ref,
            "amount_cents": 100 + i as i64,
            "currency": "EUR",
        })
        .to_string();
        Self {
            key: format!("chaos-{run}-{i}"),
            order_ref,
            body,
        }
    }
}

/// Whether an answer ends a logical call: anything but a 5xx or a 409/429
/// (come back later).
fn definitive(status: u16) -> bool {
    status < 500 && status != 409 && status != 429
}

/// Sends `checkout` with its key until a definitive answer, or `None` after
/// [`CHECKOUT_DEADLINE`].
async fn call(
    http: &ClientWithMiddleware,
    url: &str,
    checkout: &Checkout,
    counters: &Counters,
) -> Option<Answer> {
    let started = Instant::now();
    let key = IdempotencyKey::new(checkout.key.clone()).ok()?;
    let mut first = true;
    while started.elapsed() < CHECKOUT_DEADLINE {
        if !first {
            counters.retries.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        let sent = http
            .post(format!("{url}/checkout"))
            .idempotency_key(key.clone())
            .header("x-tenant-id", TENANT)
            .header("content-type", "application/json")
            .body(checkout.body.clone())
            .send()
            .await;
        let attempts = match &sent {
            Ok(response) => response.attempts(),
            Err(error) => ClientError::of(error).map_or(1, ClientError::attempts),
        };
        counters
            .ops
            .fetch_add(u64::from(attempts), Ordering::Relaxed);
        counters
            .retries
            .fetch_add(u64::from(attempts.saturating_sub(1)), Ordering::Relaxed);
        let Ok(response) = sent else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let status = response.status().as_u16();
        if !definitive(status) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let replayed = response.replayed();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        // A body cut off by a kill is no answer: ask again.
        if let Ok(body) = response.bytes().await {
            return Some(Answer {
                status,
                content_type,
                body: body.to_vec(),
                replayed,
            });
        }
    }
    None
}

/// What the clients got for one checkout.
struct Outcome {
    first: Option<Answer>,
    /// Replays that differed from the first answer (or did not say they
    /// were replays).
    mismatches: u64,
}

/// The checkout's first definitive answer, and a replay compared with it.
async fn checkout_and_replay(
    http: &ClientWithMiddleware,
    url: &str,
    checkout: &Checkout,
    counters: &Counters,
) -> Outcome {
    let Some(first) = call(http, url, checkout, counters).await else {
        return Outcome {
            first: None,
            mismatches: 0,
        };
    };
    let mismatches = match call(http, url, checkout, counters).await {
        Some(replay) => u64::from(!same_answer(&first, &replay)),
        // A replay that never came is not the first answer.
        None => 1,
    };
    Outcome {
        first: Some(first),
        mismatches,
    }
}

/// A replay is byte-identical to the first answer (status, content type,
/// body) and says it is a replay.
fn same_answer(first: &Answer, replay: &Answer) -> bool {
    replay.replayed
        && first.status == replay.status
        && first.content_type == replay.content_type
        && first.body == replay.body
}

/// The figures of one backend's run.
#[derive(Debug, Default)]
struct Report {
    checkouts: usize,
    created: usize,
    ops: u64,
    kills: u64,
    sigkills: u64,
    sigterms: u64,
    /// `name count`, per service.
    kills_by_service: String,
    retries: u64,
    lost: u64,
    duplicates: u64,
    inconsistencies: u64,
    elapsed: Duration,
}

impl Report {
    fn passed(&self) -> bool {
        self.lost == 0 && self.duplicates == 0 && self.inconsistencies == 0
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checkouts {} (201: {}) | ops {} | kills {} (SIGKILL {}, SIGTERM {}; {}) | retries {} | lost {} | duplicates {} | inconsistencies {} | elapsed {:.1} s",
            self.checkouts,
            self.created,
            self.ops,
            self.kills,
            self.sigkills,
            self.sigterms,
            self.kills_by_service,
            self.retries,
            self.lost,
            self.duplicates,
            self.inconsistencies,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Where one backend's three services keep their data.
struct Stores {
    orders: String,
    payments: String,
    notifications: String,
    /// How many payments replicas share the payments store.
    payments_replicas: usize,
    /// SQLite files live here for the run.
    _dir: Option<tempfile::TempDir>,
}

impl Stores {
    fn sqlite() -> Result<Self, BoxError> {
        let dir = tempfile::Builder::new().prefix("idem-chaos-").tempdir()?;
        let file = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
        Ok(Self {
            orders: file("orders.db"),
            payments: file("payments.db"),
            notifications: file("notifications.db"),
            payments_replicas: 1,
            _dir: Some(dir),
        })
    }

    async fn postgres() -> Self {
        let server = idem_test_support::postgres();
        Self {
            orders: server.fresh_database().await,
            payments: server.fresh_database().await,
            notifications: server.fresh_database().await,
            payments_replicas: 2,
            _dir: None,
        }
    }

    async fn mysql() -> Self {
        let server = idem_test_support::mysql();
        Self {
            orders: server.fresh_database().await,
            payments: server.fresh_database().await,
            notifications: server.fresh_database().await,
            payments_replicas: 2,
            _dir: None,
        }
    }
}

struct Options {
    checkouts: usize,
    clients: usize,
    /// Checkouts start evenly spread over this time, so the kills land
    /// while traffic flows.
    spread: Duration,
    seed: u64,
}

async fn run_backend<DB: FlowBackend>(
    name: &str,
    stores: Stores,
    options: &Options,
) -> Result<Report, BoxError> {
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(options.seed);
    let run = format!("{:08x}", rng.u32(..));

    // Start the services: notifications, payments (one or two replicas), orders.
    let notifications_port = free_port()?;
    let notifications_url = format!("http://127.0.0.1:{notifications_port}");
    let mut services = vec![Service::new(
        "notifications",
        "notifications",
        notifications_port,
        &stores.notifications,
        &[],
    )];
    let mut replicas = Vec::new();
    for n in 0..stores.payments_replicas {
        let (port, grpc_port) = (free_port()?, free_port()?);
        replicas.push(format!("http://127.0.0.1:{grpc_port}"));
        services.push(Service::new(
            &format!("payments-{}", n + 1),
            "payments",
            port,
            &stores.payments,
            &[("grpc-listen", format!("127.0.0.1:{grpc_port}"))],
        ));
    }
    let orders_port = free_port()?;
    let orders_url = format!("http://127.0.0.1:{orders_port}");
    services.push(Service::new(
        "orders",
        "orders",
        orders_port,
        &stores.orders,
        &[
            ("payments", replicas.join(",")),
            ("notifications", notifications_url.clone()),
        ],
    ));
    // Payments replicas migrate one store: start them one after another.
    for service in &mut services {
        service.start().await?;
    }
    println!(
        "{name}: {} over {} ({}), {} checkouts by {} clients over {:?}, a random service killed every 0.3-1.5 s",
        services
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        match name {
            "sqlite" => "SQLite files",
            "postgres" => "one Postgres server",
            _ => "one MySQL server",
        },
        if replicas.len() > 1 { "payments replicas charged over gRPC in turn" } else { "one payments process, charged over gRPC" },
        options.checkouts,
        options.clients,
        options.spread
    );

    let services = Arc::new(Mutex::new(services));
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));

    // The chaos task: kill a service, restart it, wait, again. Every service
    // once first, in a random order, so that each is killed at least once;
    // then at random.
    let chaos = {
        let services = services.clone();
        let counters = counters.clone();
        let stop = stop.clone();
        let mut rng = fastrand::Rng::with_seed(options.seed ^ 0x5eed);
        tokio::spawn(async move {
            let mut first_round: Vec<usize> = (0..services.lock().await.len()).collect();
            rng.shuffle(&mut first_round);
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(rng.u64(300..=1500))).await;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let mut services = services.lock().await;
                let victim = first_round
                    .pop()
                    .unwrap_or_else(|| rng.usize(..services.len()));
                *counters
                    .kills_by_service
                    .lock()
                    .unwrap()
                    .entry(services[victim].name.clone())
                    .or_default() += 1;
                let graceful = rng.u8(..5) == 0;
                services[victim].stop(graceful).await?;
                let counter = if graceful {
                    &counters.sigterms
                } else {
                    &counters.sigkills
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // Down for a while, as a real restart is.
                tokio::time::sleep(Duration::from_millis(rng.u64(100..=1000))).await;
                services[victim].start().await?;
            }
            Ok::<(), BoxError>(())
        })
    };

    // The clients.
    let http = idem_client::client(
        reqwest::Client::new(),
        RetryPolicy::default()
            .max_attempts(6)
            .deadline(Duration::from_secs(20))
            .attempt_timeout(Duration::from_secs(10))
            .backoff(Duration::from_millis(50), Duration::from_secs(1))
            .retry_after_cap(Duration::from_secs(3)),
    );
    let checkouts: Arc<Vec<Checkout>> = Arc::new(
        (0..options.checkouts)
            .map(|i| Checkout::new(&run, i))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let traffic_start = tokio::time::Instant::now();
    let pace = options.spread / options.checkouts.max(1) as u32;
    let mut workers = Vec::new();
    for _ in 0..options.clients {
        let (http, url, checkouts, next, counters) = (
            http.clone(),
            orders_url.clone(),
            checkouts.clone(),
            next.clone(),
            counters.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(checkout) = checkouts.get(i) else {
                    break;
                };
                tokio::time::sleep_until(traffic_start + pace * i as u32).await;
                outcomes.push((
                    i,
                    checkout_and_replay(&http, &url, checkout, &counters).await,
                ));
            }
            outcomes
        }));
    }
    let mut outcomes: Vec<Option<Outcome>> = (0..options.checkouts).map(|_| None).collect();
    for worker in workers {
        for (i, outcome) in worker.await? {
            outcomes[i] = Some(outcome);
        }
    }

    // Stop the chaos; every service is running again when it returns.
    stop.store(true, Ordering::SeqCst);
    chaos.await??;

    // Drain the outbox.
    let orders_engine = DB::connect(&stores.orders).await?;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let backlog = outbox::backlog(orders_engine.pool()).await?;
        if backlog.pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            note(&format!(
                "{} notifications still undelivered after {DRAIN_TIMEOUT:?}",
                backlog.pending
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every answered checkout, replayed once more with nothing killed.
    let mut report = Report {
        checkouts: options.checkouts,
        ..Report::default()
    };
    let mut created: HashMap<String, String> = HashMap::new();
    for (checkout, outcome) in checkouts.iter().zip(&outcomes) {
        let Some(Outcome {
            first: Some(first),
            mismatches,
        }) = outcome
        else {
            report.lost += 1;
            continue;
        };
        report.inconsistencies += mismatches;
        match call(&http, &orders_url, checkout, &counters).await {
            Some(replay) if same_answer(first, &replay) => {}
            _ => report.inconsistencies += 1,
        }
        if first.status != 201 {
            report.inconsistencies += 1;
            continue;
        }
        let answered: serde_json::Value = serde_json::from_slice(&first.body).unwrap_or_default();
        match answered["payment_id"].as_str() {
            Some(payment_id) if answered["order_id"] == checkout.order_ref.as_str() => {
                created.insert(checkout.order_ref.clone(), payment_id.to_owned());
            }
            _ => report.inconsistencies += 1,
        }
    }
    report.created = created.len();

    // The stores.
    let placed = <DB as OrderBook>::all(orders_engine.pool()).await?;
    let payments_engine = DB::connect(&stores.payments).await?;
    let charges = <DB as Ledger>::list(payments_engine.pool(), TENANT).await?;
    let notifications_engine = DB::connect(&stores.notifications).await?;
    let notified = <DB as NotificationLog>::all(notifications_engine.pool()).await?;
    let orders_by_ref: HashMap<&str, &str> = placed
        .iter()
        .map(|(order, payment)| (order.as_str(), payment.as_str()))
        .collect();
    let mut charges_by_ref: HashMap<&str, Vec<&str>> = HashMap::new();
    for charge in &charges {
        let order = charge.destination.strip_prefix("merchant/").unwrap_or("");
        charges_by_ref
            .entry(order)
            .or_default()
            .push(charge.payment_id.as_str());
    }
    let mut notified_by_ref: HashMap<&str, usize> = HashMap::new();
    for (_, order) in &notified {
        *notified_by_ref.entry(order.as_str()).or_default() += 1;
    }
    for (order_ref, payment_id) in &created {
        let order = orders_by_ref.get(order_ref.as_str());
        let charged = charges_by_ref
            .get(order_ref.as_str())
            .map_or(&[][..], Vec::as_slice);
        let notifications = notified_by_ref
            .get(order_ref.as_str())
            .copied()
            .unwrap_or(0);
        if order.is_none() || charged.is_empty() || notifications == 0 {
            report.lost += 1;
        }
        report.duplicates +=
            (charged.len().saturating_sub(1) + notifications.saturating_sub(1)) as u64;
        if order.is_some_and(|order| order != payment_id)
            || charged.first().is_some_and(|charge| charge != payment_id)
        {
            report.inconsistencies += 1;
        }
    }
    // Effects no 201 announced.
    let announced: HashSet<&str> = created.keys().map(String::as_str).collect();
    report.inconsistencies += orders_by_ref
        .keys()
        .filter(|o| !announced.contains(*o))
        .count() as u64;
    report.inconsistencies += charges_by_ref
        .keys()
        .filter(|o| !announced.contains(*o))
        .count() as u64;
    report.inconsistencies += notified_by_ref
        .keys()
        .filter(|o| !announced.contains(*o))
        .count() as u64;

    report.ops = counters.ops.load(Ordering::Relaxed);
    report.retries = counters.retries.load(Ordering::Relaxed);
    report.sigkills = counters.sigkills.load(Ordering::Relaxed);
    report.sigterms = counters.sigterms.load(Ordering::Relaxed);
    report.kills = report.sigkills + report.sigterms;
    report.kills_by_service = counters
        .kills_by_service
        .lock()
        .unwrap()
        .iter()
        .map(|(name, kills)| format!("{name} {kills}"))
        .collect::<Vec<_>>()
        .join(", ");
    report.elapsed = started.elapsed();
    // The services stop here (killed on drop), before their stores go.
    drop(services);
    Ok(report)
}

fn parse_args() -> Result<HashMap<String, String>, String> {
    let mut args = HashMap::new();
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let Some(name) = flag.strip_prefix("--") else {
            return Err(format!("unexpected argument {flag:?}"));
        };
        if name == "failover" || name == "shards" {
            args.insert(name.to_owned(), String::new());
            continue;
        }
        let value = iter.next().ok_or(format!("{flag} needs a value"))?;
        args.insert(name.to_owned(), value);
    }
    Ok(args)
}

const USAGE: &str =
    "usage: chaos [--backend sqlite|postgres|mysql|all] [--checkouts N] [--seconds N] [--clients N] [--seed N]
       chaos --failover [--keys N] [--clients N]
       chaos --shards [--tenants N] [--keys N] [--clients N] [--moves N] [--seconds N] [--seed N]
       chaos --failover --cluster-url URL --standby-url URL --kill-cmd CMD
             --replication synchronous|asynchronous [--keys N] [--clients N]";

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args
        .get("role")
        .is_some_and(|role| role.starts_with("shards-"))
    {
        return shards_scenario::role(&args).await;
    }
    if args.contains_key("shards") {
        return shards_run(&args).await;
    }
    if args.contains_key("role") {
        return match serve_role(&args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("chaos {}: {error}", args["role"]);
                ExitCode::FAILURE
            }
        };
    }
    if args.contains_key("failover") {
        return match failover_runs(&args).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(error) => {
                eprintln!("chaos --failover: {error}");
                ExitCode::from(2)
            }
        };
    }
    match coordinate(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("chaos run failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `--shards`: one run of the shards scenario at the arguments' size.
async fn shards_run(args: &HashMap<String, String>) -> ExitCode {
    let number = |name: &str, default: u64| -> Result<u64, String> {
        args.get(name).map_or(Ok(default), |value| {
            value.parse().map_err(|e| format!("--{name}: {e}"))
        })
    };
    let plan = (|| {
        Ok::<_, String>(shards_scenario::Plan {
            tenants: number("tenants", 12)? as usize,
            keys: number("keys", 3000)? as usize,
            clients: number("clients", 8)? as usize,
            moves: number("moves", 2)? as usize,
            spread: Duration::from_secs(number("seconds", 60)?),
            seed: number("seed", fastrand::u64(..))?,
        })
    })();
    let figures = match plan {
        Ok(plan) => match std::env::current_exe() {
            Ok(exe) => shards_scenario::run(&exe, plan).await,
            Err(error) => Err(error.into()),
        },
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match figures {
        Ok(figures) => {
            println!("{figures}");
            if figures.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("chaos --shards: {error}");
            ExitCode::from(2)
        }
    }
}

/// `--failover`: the synchronous and the asynchronous run on the suite's
/// cluster, or one run on `--cluster-url`'s; whether every figure that
/// must be zero was.
async fn failover_runs(args: &HashMap<String, String>) -> Result<bool, BoxError> {
    let number = |name: &str, default: usize| -> Result<usize, BoxError> {
        match args.get(name) {
            Some(value) => Ok(value.parse().map_err(|e| format!("--{name}: {e}"))?),
            None => Ok(default),
        }
    };
    let keys = number("keys", 2000)?.max(8);
    let plan = failover_scenario::Plan {
        keys,
        clients: number("clients", 8)?.max(1),
        kill_after: (keys * 3 / 8) as u64,
    };
    let external = match args.get("cluster-url") {
        None => None,
        Some(url) => {
            let required = |name: &str| {
                args.get(name)
                    .cloned()
                    .ok_or_else(|| format!("--cluster-url needs --{name}"))
            };
            let synchronous = match required("replication")?.as_str() {
                "synchronous" => true,
                "asynchronous" => false,
                other => {
                    return Err(
                        format!("--replication {other:?}: synchronous or asynchronous").into(),
                    )
                }
            };
            Some((
                External {
                    url: url.trim_end_matches('/').to_owned(),
                    standby_url: required("standby-url")?.trim_end_matches('/').to_owned(),
                    kill: required("kill-cmd")?,
                },
                synchronous,
            ))
        }
    };
    let modes: &[bool] = match &external {
        Some((_, synchronous)) => std::slice::from_ref(synchronous),
        None => &[true, false],
    };
    let mut good = true;
    for &synchronous in modes {
        let started = Instant::now();
        // The scenario prints its figures' line itself.
        let figures = match &external {
            Some((cluster, _)) => {
                failover_scenario::failover_on(&mut cluster.clone(), synchronous, plan).await
            }
            None => failover_scenario::failover(synchronous, plan).await,
        };
        println!(
            "  ({} replication, {} keys, {} clients: {:.1} s)",
            if synchronous {
                "synchronous"
            } else {
                "asynchronous"
            },
            plan.keys,
            plan.clients,
            started.elapsed().as_secs_f64()
        );
        good &= figures.receiver_duplicates == 0
            && figures.reexecuted == figures.lost
            && figures.in_progress_after == 0
            && figures.server_errors == 0
            && figures.without_retry_after == 0
            && figures.replays_differing == 0
            && (!synchronous || figures.lost == 0);
    }
    Ok(good)
}

/// A cluster managed by other software (`--cluster-url`): the scenario's
/// primary is whatever server `url` reaches, killed by the shell command
/// `kill`.
#[derive(Clone)]
struct External {
    url: String,
    standby_url: String,
    kill: String,
}

/// How long the cluster may take to reach a new primary after the kill.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(120);

impl failover_scenario::Cluster for External {
    fn url(&self, database: &str) -> String {
        format!("{}/{database}", self.url)
    }

    fn standby_url(&self, database: &str) -> String {
        format!("{}/{database}", self.standby_url)
    }

    async fn kill_primary(&mut self) {
        let status = Command::new("sh")
            .args(["-c", &self.kill])
            .status()
            .await
            .expect("--kill-cmd could not be run");
        assert!(status.success(), "--kill-cmd failed: {status}");
    }

    async fn take_over(&mut self) {
        use sqlx::Connection;
        let started = Instant::now();
        loop {
            if let Ok(mut conn) = sqlx::PgConnection::connect(&self.url("postgres")).await {
                let recovering: Result<bool, _> = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                    .fetch_one(&mut conn)
                    .await;
                let _ = conn.close().await;
                if let Ok(false) = recovering {
                    return;
                }
            }
            assert!(
                started.elapsed() < TAKEOVER_TIMEOUT,
                "no primary through --cluster-url {TAKEOVER_TIMEOUT:?} after the kill"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn coordinate(args: &HashMap<String, String>) -> Result<bool, BoxError> {
    let number = |name: &str, default: u64| -> Result<u64, BoxError> {
        match args.get(name) {
            Some(value) => Ok(value.parse().map_err(|e| format!("--{name}: {e}"))?),
            None => Ok(default),
        }
    };
    let options = Options {
        checkouts: number("checkouts", 1000)? as usize,
        clients: number("clients", 8)?.max(1) as usize,
        spread: Duration::from_secs(number("seconds", 120)?),
        seed: number("seed", fastrand::u64(..))?,
    };
    let backends: &[&str] = match args.get("backend").map(String::as_str) {
        None | Some("all") => &["sqlite", "postgres", "mysql"],
        Some("sqlite") => &["sqlite"],
        Some("postgres") => &["postgres"],
        Some("mysql") => &["mysql"],
        Some(other) => return Err(format!("unknown backend {other:?}\n{USAGE}").into()),
    };
    println!("seed {}", options.seed);
    let mut passed = true;
    for backend in backends {
        let report = match *backend {
            "sqlite" => run_backend::<Sqlite>(backend, Stores::sqlite()?, &options).await?,
            "postgres" => {
                run_backend::<Postgres>(backend, Stores::postgres().await, &options).await?
            }
            _ => run_backend::<MySql>(backend, Stores::mysql().await, &options).await?,
        };
        println!(
            "{backend}: {report}  [{}]",
            if report.passed() { "ok" } else { "FAILED" }
        );
        passed &= report.passed();
    }
    Ok(passed)
}
