//! A tenant moved between Postgres shards under load, with the service
//! killed at random: the scenario run by `tests/shards.rs` (bounded) and by
//! `cargo run --example chaos -- --shards` (any size).
//!
//! Three throwaway Postgres servers, one shard database on each; the
//! directory (`idem_tenant_shards`) and the receiver's database on the
//! first server. [`Plan::tenants`] tenants are listed in the directory,
//! spread over the shards in turn. The service runs as two replicas, each
//! a process of its own (the chaos example re-executed with `--role
//! shards-service`) over `Shards<Postgres, DirectoryRouter>`: `POST
//! /charges` picks the tenant's engine with [`Shards::engine`] and, in that
//! shard's claim transaction, writes one `charges` row and enqueues one
//! notification (id `child_key(key, notify)`, scoped to the tenant), which a
//! relay per shard in each replica ([`Shards::spawn_relays`]) delivers over
//! signed webhooks to a receiver with an inbox, in the run's own process.
//!
//! Retrying clients (idem-client's `IdempotentRetry`, each round of a key on
//! the next replica) send every key until a definitive answer, then once
//! more for its replay. Meanwhile a replica is killed every 0.3 to 1.5 s
//! (SIGKILL; one time in five SIGTERM) and restarted 0.1 to 1 s later, and
//! [`Plan::moves`] times, once that share of the keys is answered, a tenant
//! is moved to another shard by a process of its own (`--role shards-move`,
//! which runs [`TenantMove`]): a first run stops at
//! `tenant-move-after-fence` (the tenant fenced, its claims on the source
//! committed or refused), the tenant's `charges` rows are copied to the
//! target, a second run is killed at a random later fault point (or not),
//! and the move is run again until it is done; then the source's `charges`
//! rows of the tenant are deleted.
//!
//! When the keys are done the kills stop, every shard's outbox is drained,
//! every key is replayed once more, and every shard is read:
//!
//! - **lost**: a key without a definitive answer, or a 201 whose `charges`
//!   row or notification effect is missing;
//! - **duplicates**: a key's `charges` row or notification effect more than
//!   once, across all the shards (a row on two shards counts);
//! - **inconsistencies**: a replay differing from the first answer in any
//!   byte, an answer other than 201, a charge whose id is not the answer's,
//!   a row no 201 announced, a `charges` row or key record on a shard that
//!   is not its tenant's (a moved tenant's rows left on its old shard), a
//!   directory row with a move unfinished.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idem::faults::FaultPoint;
use idem::outbox::{self, Backoff, Message, WebhookSink};
use idem::shard::{DirectoryRouter, MoveError, Shards, TenantMove};
use idem::signature::SigningSecret;
use idem::{Engine, IdempotencyKey, Operation, Policy, Problem, Scope};
use idem_client::reqwest_middleware::{self, ClientWithMiddleware, Middleware, Next};
use idem_client::{ClientError, IdempotentRetry, RequestBuilderExt, ResponseExt, RetryPolicy};
use idem_test_support::{free_port, PgServer, FAST_SETTINGS};
use sqlx::{PgPool, Postgres};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

idem::steps! {
    const CHARGE = "tenant-charge.v1";
    const NOTIFY = "notify-charge.v1";
    const RECORD = "record-charge.v1";
}

const SECRET: &str = "whsec_ShardsMovedUnderLoad0123456789ab";
const SHARDS: usize = 3;
const REPLICAS: usize = 2;
/// How long one key may take, retries included, before it counts as lost.
const KEY_DEADLINE: Duration = Duration::from_secs(120);
/// How long a replica may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the outboxes may take to drain once the kills stop.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The business table, on every shard.
const CHARGES: &str =
    "CREATE TABLE charges (charge_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
     tenant text NOT NULL, key text NOT NULL, amount bigint NOT NULL)";

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Tenants, listed in the directory, spread over the three shards.
    pub tenants: usize,
    /// Keys, each charged once (key `i` for tenant `i % tenants`).
    pub keys: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Tenants moved during the traffic, one after another.
    pub moves: usize,
    /// The keys start evenly spread over this time.
    pub spread: Duration,
    /// Seeds the kills, the moved tenants, their targets and fault points.
    pub seed: u64,
}

/// One tenant's move: where from and to, how it went, and the first
/// answers its keys got from each side of the flip.
#[derive(Debug, Clone)]
pub struct TenantMoved {
    pub tenant: String,
    pub from: usize,
    pub to: usize,
    /// The second run's fault point (`None`: it ran to its end).
    pub fault: Option<FaultPoint>,
    /// Runs of the move process, the killed ones included.
    pub runs: usize,
    /// The tenant's keys first answered by the source, then by the target.
    pub answered_by_source: usize,
    pub answered_by_target: usize,
    /// From the fence to the end of the move.
    pub took: Duration,
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Figures {
    pub keys: usize,
    pub tenants: usize,
    /// HTTP attempts the clients sent, and those past each call's first.
    pub ops: u64,
    pub retries: u64,
    pub sigkills: u64,
    pub sigterms: u64,
    pub moves: Vec<TenantMoved>,
    /// 503s the clients met for a tenant while it was moving.
    pub unavailable_during_moves: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub inconsistencies: u64,
    pub elapsed: Duration,
}

impl Figures {
    /// No key lost, nothing twice, nothing inconsistent.
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.duplicates == 0 && self.inconsistencies == 0
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shards: keys {} | ops {} | tenants {} | moves {} | kills {} (SIGKILL {}, SIGTERM {}) | retries {} | \
             503s during the moves {} | lost {} | duplicates {} | inconsistencies {} | elapsed {:.1} s",
            self.keys,
            self.ops,
            self.tenants,
            self.moves.len(),
            self.sigkills + self.sigterms,
            self.sigkills,
            self.sigterms,
            self.retries,
            self.unavailable_during_moves,
            self.lost,
            self.duplicates,
            self.inconsistencies,
            self.elapsed.as_secs_f64()
        )?;
        for moved in &self.moves {
            write!(
                f,
                "\n  moved {} from shard {} to {} in {:.1} s, {} runs (second killed at {}); \
                 first answers: {} by the source, {} by the target",
                moved.tenant,
                moved.from,
                moved.to,
                moved.took.as_secs_f64(),
                moved.runs,
                moved
                    .fault
                    .map_or("no fault point".to_owned(), |p| p.to_string()),
                moved.answered_by_source,
                moved.answered_by_target
            )?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The processes: the service's replicas and the move

/// `--role shards-service` (`--listen ADDR --directory URL --shard-urls
/// URL,URL,URL`) serves the charges until SIGTERM; `--role shards-move`
/// (`--directory URL --shard-urls ... --tenant T --to N [--fault POINT]`)
/// runs one tenant move, exiting 0 when it is done and 1 when it must be
/// run again.
// Run by the chaos example's processes; a test runs them from there.
#[cfg_attr(test, allow(dead_code))]
pub async fn role(args: &HashMap<String, String>) -> ExitCode {
    let role = args.get("role").map(String::as_str).unwrap_or_default();
    let done = match role {
        "shards-service" => serve(args).await.map(|()| ExitCode::SUCCESS),
        "shards-move" => move_once(args).await,
        other => Err(format!("unknown role {other:?}").into()),
    };
    done.unwrap_or_else(|error| {
        eprintln!("chaos {role}: {error}");
        ExitCode::from(2)
    })
}

fn arg<'a>(args: &'a HashMap<String, String>, name: &str) -> Result<&'a str, BoxError> {
    Ok(args
        .get(name)
        .ok_or_else(|| format!("--{name} is required"))?)
}

/// The shards named by `--shard-urls`, routed by the directory at
/// `--directory`, each pool `connections` wide.
async fn connect(
    args: &HashMap<String, String>,
    policy: Policy,
    connections: u32,
) -> Result<Shards<Postgres, DirectoryRouter>, BoxError> {
    let mut engines = Vec::new();
    for url in arg(args, "shard-urls")?.split(',') {
        let pool = idem::store::postgres::connect(url, &policy, connections).await?;
        engines.push(Engine::new(pool).with_policy(policy));
    }
    let directory = PgPool::connect(arg(args, "directory")?).await?;
    Ok(Shards::new(engines, DirectoryRouter::new(directory)))
}

type Service = Arc<Shards<Postgres, DirectoryRouter>>;

/// The service, until SIGTERM, or until its stdin closes (the run ended).
async fn serve(args: &HashMap<String, String>) -> Result<(), BoxError> {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    let listener = tokio::net::TcpListener::bind(arg(args, "listen")?).await?;
    let policy = Policy::default().with_wait_timeout(Duration::from_secs(1));
    let shards = Arc::new(connect(args, policy, 8).await?);
    let relays = shards
        .spawn_relays(|relay| {
            relay
                .sink(WebhookSink::new(SigningSecret::new(SECRET).unwrap()))
                .lease(Duration::from_secs(2))
                .publish_timeout(Duration::from_secs(1))
                .poll_interval(Duration::from_millis(50))
                .backoff(Backoff {
                    base: Duration::from_millis(100),
                    cap: Duration::from_millis(500),
                })
                .batch(16)
        })
        .await?;
    let app = axum::Router::new()
        .route("/charges", axum::routing::post(charge))
        .with_state(shards);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            terminate.recv().await;
        })
        .await?;
    for relay in relays {
        relay.shutdown().await;
    }
    Ok(())
}

/// A charge's request body.
#[derive(serde::Deserialize)]
struct ChargeRequest {
    tenant: String,
    amount: i64,
    /// Where the notification goes.
    hook: String,
}

/// `POST /charges`: on the tenant's shard, in the claim's transaction, one
/// `charges` row and one notification; answered 201 with the charge, the
/// key and the shard that ran it.
async fn charge(State(shards): State<Service>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| idem::http::parse_header_value(value).ok());
    let (Some(key), Ok(request)) = (key, serde_json::from_slice::<ChargeRequest>(&body)) else {
        return Problem::new(400, "an Idempotency-Key and a charge are required").into_response();
    };
    let scope = Scope::tenant(&request.tenant);
    let shard = match shards.index(&scope).await {
        Ok(shard) => shard,
        Err(error) => return error.into_response(),
    };
    let message = Message::webhook(&request.hook)
        .json(&serde_json::json!({ "key": key.as_str() }))
        .expect("a JSON payload")
        .for_step(&key, NOTIFY)
        .scope(&scope);
    let op = Operation::new(scope, key.clone(), CHARGE.name(), &request.amount);
    let result = shards.engines()[shard]
        .run(&op, async |tx| {
            let written: Result<String, Problem> = async {
                let charge_id = sqlx::query_scalar(
                    "INSERT INTO charges (tenant, key, amount) VALUES ($1, $2, $3) \
                     RETURNING charge_id::text",
                )
                .bind(&request.tenant)
                .bind(key.as_str())
                .bind(request.amount)
                .fetch_one(&mut *tx)
                .await?;
                outbox::enqueue(&mut *tx, &message)
                    .await
                    .map_err(|e| Problem::new(503, "enqueue failed").with_detail(e.to_string()))?;
                Ok(charge_id)
            }
            .await;
            let response = match written {
                Ok(charge_id) => (
                    StatusCode::CREATED,
                    axum::Json(serde_json::json!({
                        "charge_id": charge_id,
                        "key": key.as_str(),
                        "tenant": request.tenant,
                        "shard": shard,
                    })),
                )
                    .into_response(),
                // A 5xx is not stored: rolled back, the retry runs.
                Err(problem) => problem.into_response(),
            };
            idem::http::into_stored(response).await
        })
        .await;
    idem::http::respond(result)
}

async fn move_once(args: &HashMap<String, String>) -> Result<ExitCode, BoxError> {
    let shards = connect(args, Policy::default(), 2).await?;
    let fault = match args.get("fault") {
        Some(point) => Some(point.parse::<FaultPoint>()?),
        None => None,
    };
    let moved = TenantMove::new(arg(args, "tenant")?, arg(args, "to")?.parse()?)
        .lease_wait(Duration::from_secs(10))
        .fault(fault)
        .run(&shards)
        .await;
    match moved {
        Ok(moved) => {
            println!("moved {moved:?}");
            Ok(ExitCode::SUCCESS)
        }
        Err(error @ (MoveError::MoveRunning(_) | MoveError::LeasesHeld { .. })) => {
            eprintln!("chaos shards-move: {error}; run it again");
            Ok(ExitCode::FAILURE)
        }
        Err(error) => Err(error.into()),
    }
}

/// The run's arguments for a process of `role`.
fn role_args(role: &str, directory: &str, shard_urls: &[String]) -> Vec<String> {
    vec![
        "--role".into(),
        role.into(),
        "--directory".into(),
        directory.into(),
        "--shard-urls".into(),
        shard_urls.join(","),
    ]
}

/// A replica of the service: started, killed and restarted on the same
/// port. Killed when dropped.
struct Replica {
    exe: PathBuf,
    args: Vec<String>,
    url: String,
    child: Option<(Child, ChildStdout)>,
}

impl Replica {
    fn new(exe: &Path, directory: &str, shard_urls: &[String]) -> Result<Self, BoxError> {
        let port = free_port()?;
        let mut args = role_args("shards-service", directory, shard_urls);
        args.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
        Ok(Self {
            exe: exe.to_owned(),
            args,
            url: format!("http://127.0.0.1:{port}"),
            child: None,
        })
    }

    /// Starts the process and waits until it listens (again while its port
    /// is still held by the killed one).
    async fn start(&mut self) -> Result<(), BoxError> {
        let started = Instant::now();
        loop {
            let mut child = Command::new(&self.exe)
                .args(&self.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()?;
            let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
            let mut line = String::new();
            let read = tokio::time::timeout(START_TIMEOUT, stdout.read_line(&mut line)).await;
            if matches!(read, Ok(Ok(n)) if n > 0) && line.starts_with("listening on ") {
                self.child = Some((child, stdout.into_inner()));
                return Ok(());
            }
            let _ = child.kill().await;
            if started.elapsed() > START_TIMEOUT {
                return Err(format!("{} did not start: {line:?}", self.url).into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL, or SIGTERM and a graceful stop (SIGKILL after 5 s).
    async fn stop(&mut self, graceful: bool) -> Result<(), BoxError> {
        let Some((mut child, _stdout)) = self.child.take() else {
            return Ok(());
        };
        if let (true, Some(pid)) = (graceful, child.id()) {
            std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()?;
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        child.kill().await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The receiver

/// The receiver: a webhook endpoint whose inbox (consumer `ledger`) runs
/// each notification's effect, one `effects` row, on `url`. Returns its URL.
async fn receiver(url: &str) -> Result<(String, PgPool), BoxError> {
    use idem::inbox::webhook::WebhookReceiver;

    let pool = PgPool::connect(url).await?;
    let engine = Engine::<Postgres>::new(pool.clone());
    engine.migrate().await?;
    sqlx::raw_sql("CREATE TABLE effects (message_id text NOT NULL, key text NOT NULL)")
        .execute(&pool)
        .await?;
    let inbox = idem::inbox::Inbox::new(engine, "ledger", RECORD.name())?;
    let webhooks = Arc::new(WebhookReceiver::new(inbox, SigningSecret::new(SECRET)?));
    async fn hook(
        State(webhooks): State<Arc<WebhookReceiver<Postgres>>>,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        webhooks
            .receive(&headers, &body, async |tx, message| {
                let payload: serde_json::Value =
                    serde_json::from_slice(&message.payload).unwrap_or_default();
                sqlx::query("INSERT INTO effects VALUES ($1, $2)")
                    .bind(&message.id)
                    .bind(payload["key"].as_str().unwrap_or_default())
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, Problem>(serde_json::json!({ "recorded": message.id }))
            })
            .await
    }
    let app = axum::Router::new()
        .route("/hooks/charges", axum::routing::post(hook))
        .with_state(webhooks);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook_url = format!("http://{}/hooks/charges", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((hook_url, pool))
}

// ---------------------------------------------------------------------------
// The clients

/// What the clients count.
#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    retries: AtomicU64,
    unavailable_during_moves: AtomicU64,
    /// Tenants being moved right now.
    moving: Mutex<HashSet<String>>,
}

/// Counts every attempt answered 503 for a tenant (its `x-tenant-id`) that
/// is being moved. Placed inside `IdempotentRetry`, it sees each attempt.
struct CountMoving503s(Arc<Counters>);

#[async_trait::async_trait]
impl Middleware for CountMoving503s {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut axum::http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let tenant = request
            .headers()
            .get("x-tenant-id")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let response = next.run(request, extensions).await;
        if matches!(&response, Ok(r) if r.status() == 503)
            && self.0.moving.lock().unwrap().contains(&tenant)
        {
            self.0
                .unavailable_during_moves
                .fetch_add(1, Ordering::Relaxed);
        }
        response
    }
}

/// A definitive answer: its status, every byte of its body, and whether it
/// said it was a replay.
#[derive(Clone)]
struct Answer {
    status: u16,
    body: Vec<u8>,
    replayed: bool,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// One key's charge.
struct Key {
    key: String,
    tenant: String,
    body: String,
}

/// Sends `key` until a definitive answer (anything but a 5xx, a 409 or a
/// 429), each round on the next replica from `first_replica` on, or `None`
/// after [`KEY_DEADLINE`].
async fn call(
    http: &ClientWithMiddleware,
    replicas: &[String],
    first_replica: usize,
    key: &Key,
    counters: &Counters,
) -> Option<Answer> {
    let started = Instant::now();
    let idempotency_key = IdempotencyKey::new(key.key.clone()).ok()?;
    for round in first_replica.. {
        if started.elapsed() > KEY_DEADLINE {
            break;
        }
        if round > first_replica {
            counters.retries.fetch_add(1, Ordering::Relaxed);
        }
        let sent = http
            .post(format!("{}/charges", replicas[round % replicas.len()]))
            .idempotency_key(idempotency_key.clone())
            .header("x-tenant-id", &key.tenant)
            .header("content-type", "application/json")
            .body(key.body.clone())
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
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            let replayed = response.replayed();
            if status < 500 && status != 409 && status != 429 {
                // A body cut off by a kill is no answer: ask again.
                if let Ok(body) = response.bytes().await {
                    return Some(Answer {
                        status,
                        body: body.to_vec(),
                        replayed,
                    });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A replay is byte-identical to the first answer and says it is a replay.
fn same_answer(first: &Answer, replay: &Answer) -> bool {
    replay.replayed && first.status == replay.status && first.body == replay.body
}

// ---------------------------------------------------------------------------
// The run

/// The process of one move run, with `fault` armed; whether it finished.
async fn move_run(
    exe: &Path,
    directory: &str,
    shard_urls: &[String],
    tenant: &str,
    to: usize,
    fault: Option<FaultPoint>,
) -> Result<bool, BoxError> {
    let mut args = role_args("shards-move", directory, shard_urls);
    args.extend([
        "--tenant".into(),
        tenant.into(),
        "--to".into(),
        to.to_string(),
    ]);
    if let Some(point) = fault {
        args.extend(["--fault".into(), point.to_string()]);
    }
    let out = Command::new(exe)
        .args(&args)
        .kill_on_drop(true)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match (out.status.code(), fault) {
        (Some(0), _) => Ok(true),
        (Some(1), _) => Ok(false),
        (_, Some(point)) if stderr.contains(&format!("aborting {point}")) => Ok(false),
        _ => Err(format!("the move of {tenant} failed ({}): {stderr}", out.status).into()),
    }
}

/// Copies `tenant`'s `charges` rows from `source` to `target` in one
/// transaction (rows already there kept), or deletes them from `source`
/// when `target` is `None`.
async fn move_charges(
    source: &PgPool,
    target: Option<&PgPool>,
    tenant: &str,
) -> Result<(), sqlx::Error> {
    let Some(target) = target else {
        sqlx::query("DELETE FROM charges WHERE tenant = $1")
            .bind(tenant)
            .execute(source)
            .await?;
        return Ok(());
    };
    let rows: String = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(to_jsonb(c)), '[]')::text FROM charges c WHERE tenant = $1",
    )
    .bind(tenant)
    .fetch_one(source)
    .await?;
    sqlx::query(
        "INSERT INTO charges SELECT * FROM jsonb_populate_recordset(NULL::charges, $1::jsonb) \
         ON CONFLICT (charge_id) DO NOTHING",
    )
    .bind(&rows)
    .execute(target)
    .await?;
    Ok(())
}

/// Moves `tenant` to shard `to` while its traffic flows: a first run
/// stopped after the fence, the business rows copied, a second run killed
/// at `fault` (or not), runs until done, the source's business rows
/// deleted.
#[allow(clippy::too_many_arguments)]
async fn move_tenant(
    exe: &Path,
    directory: &str,
    shard_urls: &[String],
    pools: &[PgPool],
    tenant: &str,
    from: usize,
    to: usize,
    fault: Option<FaultPoint>,
) -> Result<(usize, Duration), BoxError> {
    let started = Instant::now();
    let mut runs = 1;
    // Fenced: the route answers 503, the source refuses the tenant's
    // claims, the claims that wrote before the fence have committed.
    let first = move_run(
        exe,
        directory,
        shard_urls,
        tenant,
        to,
        Some(FaultPoint::TenantMoveAfterFence),
    );
    if first.await? {
        return Err(format!("the move of {tenant} was not stopped at its fence").into());
    }
    move_charges(&pools[from], Some(&pools[to]), tenant).await?;
    let mut armed = fault;
    loop {
        runs += 1;
        if move_run(exe, directory, shard_urls, tenant, to, armed.take()).await? {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("the move of {tenant} did not finish").into());
        }
    }
    move_charges(&pools[from], None, tenant).await?;
    Ok((runs, started.elapsed()))
}

/// One run of `plan`'s size, the service's processes being `exe` (the
/// chaos example) re-executed with `--role`.
pub async fn run(exe: &Path, plan: Plan) -> Result<Figures, BoxError> {
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let run_id = format!("{:08x}", rng.u32(..));

    // Three servers, a shard on each; the directory and the receiver on the first.
    let starting: Vec<_> = (0..SHARDS)
        .map(|_| tokio::task::spawn_blocking(|| PgServer::start(FAST_SETTINGS)))
        .collect();
    let mut servers = Vec::new();
    let mut shard_urls = Vec::new();
    for server in starting {
        let server = server.await??;
        shard_urls.push(server.fresh_database().await);
        servers.push(server);
    }
    let directory_url = servers[0].fresh_database().await;
    let mut engines = Vec::new();
    for url in &shard_urls {
        let engine = Engine::<Postgres>::connect_postgres(url).await?;
        sqlx::raw_sql(CHARGES).execute(engine.pool()).await?;
        engines.push(engine);
    }
    let directory = DirectoryRouter::new(PgPool::connect(&directory_url).await?);
    directory.create_table().await?;
    let shards = Shards::new(engines, directory.clone());
    shards.migrate().await?;
    let pools: Vec<PgPool> = shards.engines().iter().map(|e| e.pool().clone()).collect();
    let tenants: Vec<String> = (0..plan.tenants.max(1))
        .map(|t| format!("tenant-{t}"))
        .collect();
    let mut home: Vec<usize> = (0..tenants.len()).map(|t| t % SHARDS).collect();
    for (tenant, shard) in tenants.iter().zip(&home) {
        directory.assign(tenant, *shard).await?;
    }
    let (hook, effects) = receiver(&servers[0].fresh_database().await).await?;

    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        let mut replica = Replica::new(exe, &directory_url, &shard_urls)?;
        replica.start().await?;
        replicas.push(replica);
    }
    let replica_urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    println!(
        "shards: {} tenants on 3 Postgres servers, {} service replicas, {} keys by {} clients over {:?}, \
         {} tenant moves, a replica killed every 0.3-1.5 s (seed {})",
        tenants.len(),
        REPLICAS,
        plan.keys,
        plan.clients,
        plan.spread,
        plan.moves,
        plan.seed
    );

    // The kills: one replica at a time, so the other serves meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let kills = {
        let stop = stop.clone();
        let mut rng = fastrand::Rng::with_seed(plan.seed ^ 0x5eed);
        tokio::spawn(async move {
            let (mut sigkills, mut sigterms) = (0u64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(rng.u64(300..=1500))).await;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let victim = &mut replicas[rng.usize(..REPLICAS)];
                let graceful = rng.u8(..5) == 0;
                victim.stop(graceful).await?;
                *if graceful {
                    &mut sigterms
                } else {
                    &mut sigkills
                } += 1;
                tokio::time::sleep(Duration::from_millis(rng.u64(100..=1000))).await;
                victim.start().await?;
            }
            Ok::<_, BoxError>((replicas, sigkills, sigterms))
        })
    };

    // The clients.
    let counters = Arc::new(Counters::default());
    // Two attempts on one replica, then the next round on the other.
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .deadline(Duration::from_secs(5))
        .attempt_timeout(Duration::from_secs(3))
        .backoff(Duration::from_millis(20), Duration::from_millis(300))
        .retry_after_cap(Duration::from_millis(300));
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(IdempotentRetry::new(policy))
        .with(CountMoving503s(counters.clone()))
        .build();
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..plan.keys)
            .map(|i| {
                let tenant = tenants[i % tenants.len()].clone();
                let body = serde_json::json!({ "tenant": tenant, "amount": 100 + i, "hook": hook })
                    .to_string();
                Key {
                    key: format!("shards-{run_id}-{i}"),
                    tenant,
                    body,
                }
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let traffic_start = tokio::time::Instant::now();
    let pace = plan.spread / plan.keys.max(1) as u32;
    let mut clients = Vec::new();
    for _ in 0..plan.clients.max(1) {
        let (http, urls, keys, next, answered, counters) = (
            http.clone(),
            replica_urls.clone(),
            keys.clone(),
            next.clone(),
            answered.clone(),
            counters.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(i) else { break };
                tokio::time::sleep_until(traffic_start + pace * i as u32).await;
                let first = call(&http, &urls, i, key, &counters).await;
                answered.fetch_add(1, Ordering::Relaxed);
                let replay = match &first {
                    Some(_) => call(&http, &urls, i + 1, key, &counters).await,
                    None => None,
                };
                outcomes.push((i, first, replay));
            }
            outcomes
        }));
    }

    // The moves, each once its share of the keys is answered, of a tenant
    // whose keys are flowing, to another shard.
    let mut moves = Vec::new();
    for m in 0..plan.moves {
        let due = plan.keys * (m + 1) / (plan.moves + 1);
        while answered.load(Ordering::Relaxed) < due {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = rng.usize(..tenants.len());
        let (tenant, from) = (tenants[t].clone(), home[t]);
        let to = (from + rng.usize(1..SHARDS)) % SHARDS;
        let fault = [
            None,
            Some(FaultPoint::TenantMoveAfterCopy),
            Some(FaultPoint::TenantMoveAfterFlip),
            Some(FaultPoint::TenantMoveAfterDelete),
        ][rng.usize(..4)];
        counters.moving.lock().unwrap().insert(tenant.clone());
        let moved = move_tenant(
            exe,
            &directory_url,
            &shard_urls,
            &pools,
            &tenant,
            from,
            to,
            fault,
        )
        .await;
        counters.moving.lock().unwrap().remove(&tenant);
        let (runs, took) = moved?;
        home[t] = to;
        moves.push(TenantMoved {
            tenant,
            from,
            to,
            fault,
            runs,
            answered_by_source: 0,
            answered_by_target: 0,
            took,
        });
    }
    let mut outcomes: Vec<(Option<Answer>, Option<Answer>)> =
        (0..plan.keys).map(|_| (None, None)).collect();
    for client in clients {
        for (i, first, replay) in client.await? {
            outcomes[i] = (first, replay);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (replicas, sigkills, sigterms) = kills.await??;

    // Every shard's outbox drained by the relays.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    for pool in &pools {
        while outbox::backlog(pool).await?.pending > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Each answered key once more, with nothing killed.
    let mut figures = Figures {
        keys: plan.keys,
        tenants: tenants.len(),
        sigkills,
        sigterms,
        ..Figures::default()
    };
    let mut announced: HashMap<String, String> = HashMap::new();
    for (key, (first, replay)) in keys.iter().zip(&outcomes) {
        let Some(first) = first else {
            figures.lost += 1;
            continue;
        };
        let again = call(&http, &replica_urls, 0, key, &counters).await;
        for replay in [replay, &again] {
            if !replay.as_ref().is_some_and(|r| same_answer(first, r)) {
                figures.inconsistencies += 1;
            }
        }
        let answer = first.json();
        match answer["charge_id"].as_str() {
            Some(charge_id) if first.status == 201 && answer["key"] == key.key.as_str() => {
                announced.insert(key.key.clone(), charge_id.to_owned());
            }
            _ => figures.inconsistencies += 1,
        }
        if let Some(moved) = moves.iter_mut().find(|m| m.tenant == key.tenant) {
            match answer["shard"].as_u64() {
                Some(shard) if shard == moved.from as u64 => moved.answered_by_source += 1,
                Some(shard) if shard == moved.to as u64 => moved.answered_by_target += 1,
                _ => {}
            }
        }
    }

    // Every shard read.
    let routes: HashMap<String, (i32, Option<i32>, Option<i32>)> =
        sqlx::query_as("SELECT tenant, shard, moving_to, moved_from FROM idem_tenant_shards")
            .fetch_all(directory.pool())
            .await?
            .into_iter()
            .map(|(tenant, shard, moving_to, moved_from)| (tenant, (shard, moving_to, moved_from)))
            .collect();
    for (tenant, home) in tenants.iter().zip(&home) {
        if routes.get(tenant) != Some(&(*home as i32, None, None)) {
            figures.inconsistencies += 1;
        }
    }
    let mut charged: HashMap<String, Vec<String>> = HashMap::new();
    for (index, pool) in pools.iter().enumerate() {
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT charge_id::text, tenant, key FROM charges")
                .fetch_all(pool)
                .await?;
        for (charge_id, tenant, key) in rows {
            if routes.get(&tenant).map(|r| r.0 as usize) != Some(index) {
                figures.inconsistencies += 1;
            }
            charged.entry(key).or_default().push(charge_id);
        }
        let scopes: Vec<String> = sqlx::query_scalar("SELECT scope FROM idempotency_keys")
            .fetch_all(pool)
            .await?;
        for scope in scopes {
            let listed = tenants
                .iter()
                .zip(&home)
                .find(|(tenant, _)| scope.as_str() == Scope::tenant(tenant.as_str()).as_stored());
            if listed.is_none_or(|(_, home)| *home != index) {
                figures.inconsistencies += 1;
            }
        }
    }
    let effects: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM effects GROUP BY key")
            .fetch_all(&effects)
            .await?;
    let effects: HashMap<String, i64> = effects.into_iter().collect();
    for (key, charge_id) in &announced {
        let rows = charged.get(key).map_or(&[][..], Vec::as_slice);
        let notified = effects.get(key).copied().unwrap_or(0);
        if rows.is_empty() || notified == 0 {
            figures.lost += 1;
        }
        figures.duplicates +=
            (rows.len().saturating_sub(1) + notified.saturating_sub(1) as usize) as u64;
        if rows.first().is_some_and(|row| row != charge_id) {
            figures.inconsistencies += 1;
        }
    }
    figures.inconsistencies += charged
        .keys()
        .filter(|k| !announced.contains_key(*k))
        .count() as u64;
    figures.inconsistencies += effects
        .keys()
        .filter(|k| !announced.contains_key(*k))
        .count() as u64;

    figures.ops = counters.ops.load(Ordering::Relaxed);
    figures.retries = counters.retries.load(Ordering::Relaxed);
    figures.unavailable_during_moves = counters.unavailable_during_moves.load(Ordering::Relaxed);
    figures.moves = moves;
    figures.elapsed = started.elapsed();
    // The replicas stop (killed on drop) before their servers go.
    drop(replicas);
    drop(servers);
    Ok(figures)
}
