//! The failover scenario, run by `tests/failover.rs` (bounded) and by
//! `cargo run --example chaos -- --failover` (any size): a primary failover
//! under load, with real Postgres 15 streaming
//! replication: a primary and a standby made with `pg_basebackup -R`, the
//! service reaching the primary through a loopback TCP forwarder (the
//! address that follows the leader, as a re-pointed PgBouncer or an
//! HAProxy would). The service is an axum one on a loopback socket: its
//! `POST /{tenant}/charges`, an `#[idempotent(http)]` handler, writes the
//! payment and enqueues its notification in the claim's transaction.
//! Retrying clients (idem-client's [`IdempotentRetry`], which retries 503s,
//! 409s and lost connections with the same `Idempotency-Key`, honouring
//! `Retry-After`) send their keys over HTTP, each until a 201, while the
//! primary is killed with SIGKILL; for a second the service has no primary
//! (every claim is a 503 with `Retry-After`, never a 500); then the standby
//! is promoted and the forwarder re-pointed, and the same engine and pool
//! go on without a restart. Afterwards every key is sent once more: each
//! answer is a replay byte-identical to the first, or (its record lost with
//! the primary) a run of its own. Every attempt is counted below the retry
//! loop: the 503s and 409s and whether they carried `Retry-After`, any other
//! 5xx, any attempt without an answer.
//!
//! How the primary dies and who takes over is a [`Cluster`]: [`ByHand`]
//! (the above, used by the suite) or a cluster managed by other software
//! (the chaos example's `--cluster-url`, which `examples/patroni/run.sh`
//! points at HAProxy in front of Patroni).
//!
//! - Synchronous replication (`synchronous_standby_names = '*'`,
//!   `synchronous_commit = remote_apply`): every answer given before the
//!   kill is found after it and replayed, byte for byte; nothing runs
//!   twice.
//! - Asynchronous replication: a commit not yet streamed is lost with the
//!   primary, the key record with the business write (one transaction),
//!   so the key's retry runs it again: counted, never doubled in the data.
//!
//! Each charge also enqueues a notification (id `child_key(key, step)`),
//! which a relay on the same engine delivers over signed webhooks to a
//! receiver with an inbox in a store of its own (a server that does not
//! fail over). A message delivered from the old primary and enqueued again
//! by a re-run, or left unsent by a lost mark-sent, reaches the receiver
//! again with the same id and is answered from its inbox's record: every
//! message's effect runs once at the receiver, in both runs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRef, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use idem::http::Json;
use idem::outbox::{self, Backoff, Message, Relay, WebhookSink};
use idem::signature::SigningSecret;
use idem::{idempotent, Engine, Fingerprint, IdempotencyKey, Policy, Problem, Scope};
use idem_client::reqwest_middleware::{self, ClientWithMiddleware};
use idem_client::{reqwest, IdempotentRetry, RequestBuilderExt, ResponseExt, RetryPolicy};
use idem_test_support::{free_port, is_root, postgres, postgres_tool as pg, run, PgServer};
use serde::Deserialize;
use sqlx::{PgConnection, PgPool, Postgres};

idem::steps! {
    const CHARGE = "charge.v1";
    const NOTIFY = "notify-payment.v1";
    const RECORD = "record-payment.v1";
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Keys charged, each once, by retrying clients.
    pub keys: usize,
    /// Concurrent clients, each taking every `clients`-th key.
    pub clients: usize,
    /// The primary is killed once this many keys are answered.
    pub kill_after: u64,
}

/// A standby of `primary_port` made with `pg_basebackup -R`, stopped and
/// removed when dropped.
struct Standby {
    dir: PathBuf,
    port: u16,
}

impl Standby {
    fn start(primary_port: u16) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idem-standby-")
            .tempdir()
            .unwrap()
            .keep();
        if is_root() {
            run(
                Command::new("chown").args(["postgres:postgres"]).arg(&dir),
                "chown",
            )
            .unwrap();
        }
        let data = dir.join("data");
        run(
            pg("pg_basebackup")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-X",
                    "stream",
                    "-R",
                    "-c",
                    "fast",
                    "-D",
                ])
                .arg(&data)
                .args(["-p", &primary_port.to_string()]),
            "pg_basebackup",
        )
        .unwrap();
        let port = free_port().unwrap();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c max_connections=300 -c fsync=off",
            dir.display()
        );
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("standby.log"))
                .args(["-o", &options, "-w", "-t", "60", "start"]),
            "pg_ctl start",
        )
        .unwrap();
        Self { dir, port }
    }

    fn promote(&self) {
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-w", "-t", "60", "promote"]),
            "pg_ctl promote",
        )
        .unwrap();
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = pg("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback TCP forwarder to whichever port `target` holds; re-pointing
/// it cuts the connections to the old target.
struct Forwarder {
    port: u16,
    target: Arc<AtomicU16>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Forwarder {
    async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let generation = Arc::new(generation);
        let (to, cut) = (target.clone(), generation.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                let mut cut = cut.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            port,
            target,
            generation,
        }
    }

    fn point_at(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
}

/// How the primary dies and who takes over: the part of a failover the
/// scenario leaves to the cluster it runs on.
pub trait Cluster {
    /// `database`'s URL through the address that follows the leader: the
    /// service's, and the one the scenario creates its database on.
    fn url(&self, database: &str) -> String;
    /// `database`'s URL on the standby itself (for the asynchronous run's
    /// hold of its WAL receiver).
    fn standby_url(&self, database: &str) -> String;
    /// Kills the primary with `SIGKILL`; returns once nothing answers on
    /// its behalf.
    async fn kill_primary(&mut self);
    /// Returns once the standby has taken over and [`Cluster::url`]
    /// reaches it.
    async fn take_over(&mut self);
}

/// The suite's cluster: the harness's Postgres as the primary, a
/// `pg_basebackup -R` standby, the service reaching the primary through a
/// [`Forwarder`]; the primary's postmaster is killed, the forwarder points
/// nowhere for 1 s, then the standby is promoted with `pg_ctl promote` and
/// the forwarder re-pointed at it.
pub struct ByHand {
    data_dir: String,
    standby: Standby,
    forwarder: Forwarder,
}

impl ByHand {
    /// The primary and its standby, streaming; with `synchronous`, every
    /// standby is synchronous (`synchronous_standby_names = '*'`).
    pub async fn start(synchronous: bool) -> Self {
        let primary = PgServer::start(&[
            ("fsync", "off"),
            ("full_page_writes", "off"),
            ("wal_level", "replica"),
            ("max_wal_senders", "5"),
        ])
        .unwrap();
        let standby = Standby::start(primary.port().unwrap());
        let direct = PgPool::connect(&primary.url("postgres")).await.unwrap();
        // After the base backup: a standby that copied the setting would
        // wait, once promoted, for a synchronous standby of its own.
        if synchronous {
            // One statement per message: ALTER SYSTEM runs outside any
            // transaction block.
            for sql in [
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
                "SELECT pg_reload_conf()",
            ] {
                sqlx::raw_sql(sql).execute(&direct).await.unwrap();
            }
        }
        let data_dir: String = sqlx::query_scalar("SHOW data_directory")
            .fetch_one(&direct)
            .await
            .unwrap();
        direct.close().await;
        let forwarder = Forwarder::start(primary.port().unwrap()).await;
        Self {
            data_dir,
            standby,
            forwarder,
        }
    }
}

impl Cluster for ByHand {
    fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.forwarder.port
        )
    }

    fn standby_url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.standby.port
        )
    }

    async fn kill_primary(&mut self) {
        // SIGKILL the postmaster: its backends and WAL sender go with it.
        let pid = std::fs::read_to_string(PathBuf::from(&self.data_dir).join("postmaster.pid"))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .trim()
            .to_owned();
        run(Command::new("kill").args(["-9", &pid]), "kill -9").unwrap();
        let _ = Command::new("pkill").args(["-9", "-P", &pid]).status();
        self.forwarder.point_at(0); // nothing answers while there is no primary
    }

    async fn take_over(&mut self) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.standby.promote();
        self.forwarder.point_at(self.standby.port);
    }
}

/// What the receiver saw: deliveries, and those answered from its inbox's
/// record (`Idempotent-Replayed: true`).
#[derive(Default)]
struct Seen {
    deliveries: AtomicU64,
    answered_from_record: AtomicU64,
}

/// The receiver: a webhook endpoint whose inbox (consumer `payments`) runs
/// each message's effect, one `effects` row, in a fresh database of the
/// harness's server. Returns its URL, its pool and what it saw.
async fn receiver() -> (String, PgPool, Arc<Seen>) {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::HeaderMap;
    use idem::inbox::webhook::WebhookReceiver;

    let url = postgres().fresh_database().await;
    let pool = PgPool::connect(&url).await.unwrap();
    let engine = Engine::<Postgres>::new(pool.clone());
    engine.migrate().await.unwrap();
    sqlx::raw_sql("CREATE TABLE effects (message_id text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let inbox = idem::inbox::Inbox::new(engine, "payments", RECORD.name()).unwrap();
    let webhooks = WebhookReceiver::new(inbox, SigningSecret::new(SECRET).unwrap());
    let seen = Arc::new(Seen::default());
    type Shared = (Arc<WebhookReceiver<Postgres>>, Arc<Seen>);
    async fn hook(
        State((webhooks, seen)): State<Shared>,
        headers: HeaderMap,
        body: Bytes,
    ) -> axum::response::Response {
        let response = webhooks
            .receive(&headers, &body, async |tx, message| {
                sqlx::query("INSERT INTO effects VALUES ($1)")
                    .bind(&message.id)
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, Problem>(serde_json::json!({ "recorded": message.id }))
            })
            .await;
        seen.deliveries.fetch_add(1, Ordering::SeqCst);
        if response.headers().get("idempotent-replayed").is_some() {
            seen.answered_from_record.fetch_add(1, Ordering::SeqCst);
        }
        response
    }
    let app = axum::Router::new()
        .route("/hooks/payments", axum::routing::post(hook))
        .with_state((Arc::new(webhooks), seen.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hooks/payments", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (hook_url, pool, seen)
}

/// `POST /{tenant}/charges` body.
#[derive(Debug, Deserialize, Fingerprint)]
struct ChargeRequest {
    amount_cents: i64,
}

/// The charge service's state: its engine, the one that lives through the
/// failover, and where its notifications go.
#[derive(Clone)]
struct Service {
    engine: Engine<Postgres>,
    hook: Arc<str>,
}

impl FromRef<Service> for Engine<Postgres> {
    fn from_ref(service: &Service) -> Self {
        service.engine.clone()
    }
}

/// `POST /{tenant}/charges`: a payment row and its notification in the
/// outbox (id `child_key(key, NOTIFY)`), in the claim's transaction; 201
/// with the payment's id. A statement that meets the lost connection is a
/// 503 with `Retry-After`, rolled back and not stored.
#[idempotent(http, scope = "tenant", step = CHARGE)]
async fn charge(
    tx: &mut PgConnection,
    State(service): State<Service>,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(request): Json<ChargeRequest>,
) -> Response {
    let message = Message::webhook(&*service.hook)
        .json(&serde_json::json!({ "payment": key.as_str() }))
        .unwrap()
        .for_step(&key, NOTIFY)
        .scope(&Scope::tenant(&tenant));
    let written = async {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO payments (key, amount_cents) VALUES ($1, $2) RETURNING id",
        )
        .bind(key.as_str())
        .bind(request.amount_cents)
        .fetch_one(&mut *tx)
        .await?;
        outbox::enqueue(&mut *tx, &message).await?;
        Ok::<_, Problem>(id)
    };
    match written.await {
        Ok(id) => (
            StatusCode::CREATED,
            axum::Json(serde_json::json!({ "payment": id, "key": key.as_str() })),
        )
            .into_response(),
        Err(problem) => ([(header::RETRY_AFTER, "1")], problem).into_response(),
    }
}

/// Serves the charge service on a loopback socket; returns its charges URL.
async fn serve(engine: Engine<Postgres>, hook: &str) -> String {
    let app = axum::Router::new()
        .route("/{tenant}/charges", axum::routing::post(charge))
        .with_state(Service {
            engine,
            hook: hook.into(),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/acme/charges", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// What the clients met, attempt by attempt (counted below idem-client's
/// retry loop, so the attempts it retried are seen too).
#[derive(Default)]
struct Sent {
    attempts: AtomicU64,
    /// Attempts beyond the first, from the answers' [`Attempts`](idem_client::Attempts).
    retries: AtomicU64,
    unavailable: AtomicU64,
    in_progress: AtomicU64,
    /// 503s and 409s without `Retry-After`.
    without_retry_after: AtomicU64,
    /// 5xx answers other than 503.
    server_errors: AtomicU64,
    /// Attempts that got no HTTP answer.
    transport_errors: AtomicU64,
}

/// Counts each attempt of a call in [`Sent`]; sits below
/// [`IdempotentRetry`] in the client's middleware.
struct CountAttempts(Arc<Sent>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for CountAttempts {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut axum::http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let sent = &self.0;
        sent.attempts.fetch_add(1, Ordering::SeqCst);
        let result = next.run(request, extensions).await;
        let Ok(response) = &result else {
            sent.transport_errors.fetch_add(1, Ordering::SeqCst);
            return result;
        };
        let counter = match response.status().as_u16() {
            503 => &sent.unavailable,
            409 => &sent.in_progress,
            500..=599 => &sent.server_errors,
            _ => return result,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        if matches!(response.status().as_u16(), 409 | 503)
            && !response.headers().contains_key(header::RETRY_AFTER)
        {
            sent.without_retry_after.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
}

/// A retrying client of the charge service: idem-client's
/// [`IdempotentRetry`], each key sent with the same `Idempotency-Key` until
/// a definitive answer, within 60 s.
struct ChargeClient {
    http: ClientWithMiddleware,
    url: String,
    sent: Arc<Sent>,
}

/// A charge's 201: its body, and whether it was answered from the record.
struct Charged {
    body: Vec<u8>,
    replayed: bool,
}

impl ChargeClient {
    fn new(url: &str, sent: Arc<Sent>) -> Self {
        let policy = RetryPolicy::default()
            .max_attempts(u32::MAX)
            .deadline(Duration::from_secs(60))
            .attempt_timeout(Duration::from_secs(10))
            .backoff(Duration::from_millis(50), Duration::from_millis(500))
            .retry_after_cap(Duration::from_secs(2));
        let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(IdempotentRetry::new(policy))
            .with(CountAttempts(sent.clone()))
            .build();
        Self {
            http,
            url: url.to_owned(),
            sent,
        }
    }

    /// Key `k-{k}`'s charge; panics unless its definitive answer is a 201.
    async fn charge(&self, k: usize) -> Charged {
        let response = self
            .http
            .post(&self.url)
            .idempotency_key(IdempotencyKey::new(format!("k-{k}")).unwrap())
            .header(header::CONTENT_TYPE, "application/json")
            .body(r#"{"amount_cents":10}"#)
            .send()
            .await
            .unwrap_or_else(|error| panic!("key {k}: no answer: {error}"));
        self.sent
            .retries
            .fetch_add(u64::from(response.attempts() - 1), Ordering::SeqCst);
        let (status, replayed) = (response.status(), response.replayed());
        let body = response.bytes().await.unwrap().to_vec();
        assert_eq!(
            status,
            StatusCode::CREATED,
            "key {k}: {}",
            String::from_utf8_lossy(&body)
        );
        Charged { body, replayed }
    }
}

/// A key's first answer: its 201's body, and whether it came before the
/// kill.
#[derive(Clone)]
struct FirstAnswer {
    body: Vec<u8>,
    before_kill: bool,
}

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    first: Mutex<Vec<Option<FirstAnswer>>>,
}

/// One retrying client: each of its keys once, until a 201.
async fn client(
    client: ChargeClient,
    keys: Vec<usize>,
    tally: Arc<Tally>,
    killed: Arc<AtomicBool>,
) {
    for k in keys {
        let body = client.charge(k).await.body;
        let before_kill = !killed.load(Ordering::SeqCst);
        tally.first.lock().unwrap()[k] = Some(FirstAnswer { body, before_kill });
        tally.answered.fetch_add(1, Ordering::SeqCst);
    }
}

/// What a run measured.
pub struct Figures {
    /// Keys whose first answer came before the kill.
    pub answered_before_kill: usize,
    /// Answers lost with the primary (the key ran again when sent once more).
    pub lost: usize,
    /// Keys whose work ran a second time.
    pub reexecuted: usize,
    /// Retries the clients' idem-client made during the load (attempts
    /// beyond the first, from each answer's `Attempts`).
    pub retries: u64,
    /// 503s the clients met (no primary, or a statement cut by the kill).
    pub unavailable: u64,
    /// 409s (in progress) the clients met.
    pub in_progress: u64,
    /// Attempts that got no HTTP answer.
    pub transport_errors: u64,
    /// 503s and 409s without `Retry-After`, in the load and after it.
    pub without_retry_after: u64,
    /// 5xx answers other than 503 (a 500 among them), in the load and
    /// after it.
    pub server_errors: u64,
    /// From the kill until the address that follows the leader reached the
    /// new primary.
    pub without_primary: Duration,
    /// 409s met when every key was sent once more after the failover (a
    /// claim stuck by the kill).
    pub in_progress_after: u64,
    /// Keys answered after the failover from their record, byte for byte
    /// the first answer, and those whose replay differed from it.
    pub replays_identical: usize,
    pub replays_differing: usize,
    /// Deliveries the receiver got, and those it answered from its
    /// inbox's record (a message it had already run).
    pub deliveries: u64,
    pub answered_from_record: u64,
    /// Messages whose effect ran more than once at the receiver.
    pub receiver_duplicates: i64,
}

/// One failover run (`synchronous` or asynchronous replication) of `plan`'s
/// size on the suite's cluster ([`ByHand`]); asserts what holds whatever
/// the timing, returns the figures.
pub async fn failover(synchronous: bool, plan: Plan) -> Figures {
    failover_on(&mut ByHand::start(synchronous).await, synchronous, plan).await
}

static NEXT_DATABASE: AtomicU64 = AtomicU64::new(0);

/// One failover run of `plan`'s size on `cluster`, whose replication is
/// synchronous or not as `synchronous` says (checked before the load);
/// asserts what holds whatever the timing, returns the figures.
pub async fn failover_on(cluster: &mut impl Cluster, synchronous: bool, plan: Plan) -> Figures {
    let name = format!(
        "idem_failover_{}_{}",
        std::process::id(),
        NEXT_DATABASE.fetch_add(1, Ordering::SeqCst)
    );
    let admin = PgPool::connect(&cluster.url("postgres")).await.unwrap();
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let service_url = cluster.url(&name);
    let direct = PgPool::connect(&service_url).await.unwrap();
    Engine::<Postgres>::new(direct.clone())
        .migrate()
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL, amount_cents bigint NOT NULL)",
    )
        .execute(&direct)
        .await
        .unwrap();
    if synchronous {
        sqlx::raw_sql(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = 'remote_apply'"
        ))
        .execute(&direct)
        .await
        .unwrap();
    }
    let want = if synchronous { "sync" } else { "async" };
    let started = Instant::now();
    loop {
        let state: Option<String> =
            sqlx::query_scalar("SELECT sync_state FROM pg_stat_replication")
                .fetch_optional(&direct)
                .await
                .unwrap();
        if state.as_deref() == Some(want) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "standby not {want}: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    direct.close().await;

    let policy = Policy::default().with_wait_timeout(Duration::from_secs(1));
    let pool = idem::store::postgres::connect(&service_url, &policy, 8)
        .await
        .unwrap();
    let engine = Engine::new(pool).with_policy(policy);
    let (hook, effects, seen) = receiver().await;
    let relay = Relay::new(&engine)
        .sink(WebhookSink::new(SigningSecret::new(SECRET).unwrap()))
        .lease(Duration::from_secs(2))
        .publish_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50))
        .backoff(Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(500),
        })
        .batch(16)
        .spawn()
        .await
        .unwrap();

    let url = serve(engine, &hook).await;

    let tally = Arc::new(Tally {
        first: Mutex::new(vec![None; plan.keys]),
        ..Tally::default()
    });
    let killed = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Sent::default());
    let clients: Vec<_> = (0..plan.clients)
        .map(|c| {
            let keys = (c..plan.keys).step_by(plan.clients).collect();
            tokio::spawn(client(
                ChargeClient::new(&url, sent.clone()),
                keys,
                tally.clone(),
                killed.clone(),
            ))
        })
        .collect();
    let standby_pool = PgPool::connect(&cluster.standby_url(&name)).await.unwrap();
    while tally.answered.load(Ordering::SeqCst) < plan.kill_after {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Asynchronous: hold the standby's WAL receiver for a moment, as a
    // slow link would, so the primary dies with commits not yet streamed.
    let receiver: Option<String> = if synchronous {
        None
    } else {
        let pid: i32 = sqlx::query_scalar("SELECT pid FROM pg_stat_wal_receiver")
            .fetch_one(&standby_pool)
            .await
            .unwrap();
        run(
            Command::new("kill").args(["-STOP", &pid.to_string()]),
            "kill -STOP",
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        Some(pid.to_string())
    };
    standby_pool.close().await;
    killed.store(true, Ordering::SeqCst);
    let kill = Instant::now();
    cluster.kill_primary().await;
    // What the held receiver had not written is gone with it (the bytes
    // waiting in its socket too); the standby restarts its receiver.
    if let Some(pid) = receiver {
        run(Command::new("kill").args(["-KILL", &pid]), "kill -KILL").unwrap();
    }
    cluster.take_over().await;
    let without_primary = kill.elapsed();
    for client in clients {
        client.await.unwrap();
    }

    assert_eq!(
        sent.attempts.load(Ordering::SeqCst),
        plan.keys as u64 + sent.retries.load(Ordering::SeqCst),
        "an attempt went uncounted"
    );

    // The answers given whose payment the promoted server does not hold:
    // lost with the primary, the key's record with them. (By key and id: a
    // lost id may be handed out again by the promoted server's sequence.)
    let promoted = PgPool::connect(&service_url).await.unwrap();
    let held: HashSet<(i64, String)> = sqlx::query_as("SELECT id, key FROM payments")
        .fetch_all(&promoted)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let first: Vec<FirstAnswer> = tally
        .first
        .lock()
        .unwrap()
        .iter()
        .map(|answer| answer.clone().expect("every key answered"))
        .collect();
    let payment = |body: &[u8]| -> (i64, String) {
        let answer: serde_json::Value = serde_json::from_slice(body).unwrap();
        (
            answer["payment"].as_i64().unwrap(),
            answer["key"].as_str().unwrap().to_owned(),
        )
    };
    let lost = first
        .iter()
        .filter(|answer| !held.contains(&payment(&answer.body)))
        .count();
    // Every key once more, on the promoted server (a 503 from a pool
    // connection still on its way out is retried as well).
    let after = Arc::new(Sent::default());
    let again = ChargeClient::new(&url, after.clone());
    let (mut reexecuted, mut replays_identical, mut replays_differing) = (0, 0, 0);
    for (k, answer) in first.iter().enumerate() {
        let charged = again.charge(k).await;
        if !charged.replayed {
            reexecuted += 1;
        } else if charged.body == answer.body {
            replays_identical += 1;
        } else {
            replays_differing += 1;
        }
    }
    // The relay delivers what the promoted server holds: at most 20 s, or
    // 20 ms a key for a larger run.
    let drain = Duration::from_secs(20).max(Duration::from_millis(20) * plan.keys as u32);
    let started = Instant::now();
    while outbox::backlog(&promoted).await.unwrap().pending > 0 {
        assert!(
            started.elapsed() < drain,
            "the relay did not drain the outbox after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let relayed = relay.shutdown().await;
    assert_eq!(relayed.dead, 0, "{relayed:?}");
    // Every payment's notification reached the receiver, and its effect ran once.
    let (distinct, receiver_duplicates): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE n > 1) \
         FROM (SELECT message_id, count(*) AS n FROM effects GROUP BY message_id) e",
    )
    .fetch_one(&effects)
    .await
    .unwrap();
    assert_eq!(distinct, plan.keys as i64);
    let delivered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_outbox WHERE state = 'sent'")
            .fetch_one(&promoted)
            .await
            .unwrap();
    assert_eq!(delivered, plan.keys as i64);
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT key FROM payments GROUP BY key HAVING count(*) > 1) d",
    )
    .fetch_one(&promoted)
    .await
    .unwrap();
    assert_eq!(doubled, 0, "a key's work committed twice");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&promoted)
        .await
        .unwrap();
    assert_eq!(rows, plan.keys as i64);
    let stuck: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE status <> 'completed'")
            .fetch_one(&promoted)
            .await
            .unwrap();
    assert_eq!(stuck, 0);
    let figures = Figures {
        answered_before_kill: first.iter().filter(|answer| answer.before_kill).count(),
        lost,
        reexecuted,
        retries: sent.retries.load(Ordering::SeqCst),
        unavailable: sent.unavailable.load(Ordering::SeqCst),
        in_progress: sent.in_progress.load(Ordering::SeqCst),
        transport_errors: sent.transport_errors.load(Ordering::SeqCst),
        without_retry_after: sent.without_retry_after.load(Ordering::SeqCst)
            + after.without_retry_after.load(Ordering::SeqCst),
        server_errors: sent.server_errors.load(Ordering::SeqCst)
            + after.server_errors.load(Ordering::SeqCst),
        without_primary,
        in_progress_after: after.in_progress.load(Ordering::SeqCst),
        replays_identical,
        replays_differing,
        deliveries: seen.deliveries.load(Ordering::SeqCst),
        answered_from_record: seen.answered_from_record.load(Ordering::SeqCst),
        receiver_duplicates,
    };
    eprintln!(
        "{} replication: {} keys over HTTP, {} answered before the kill, {} after, answers lost {}, re-executions {}, \
         client retries {}, 503s {}, 409s {}, 503s/409s without Retry-After {}, other 5xx {}, no answer {}, \
         {:.1} s without a primary, 409s after the failover {}, replays byte-identical {} (differing {}), \
         keys left in progress {stuck}; \
         receiver: {} deliveries, {} answered from its inbox's record, {} duplicate effects",
        if synchronous { "synchronous" } else { "asynchronous" },
        plan.keys,
        figures.answered_before_kill,
        plan.keys - figures.answered_before_kill,
        figures.lost,
        figures.reexecuted,
        figures.retries,
        figures.unavailable,
        figures.in_progress,
        figures.without_retry_after,
        figures.server_errors,
        figures.transport_errors,
        figures.without_primary.as_secs_f64(),
        figures.in_progress_after,
        figures.replays_identical,
        figures.replays_differing,
        figures.deliveries,
        figures.answered_from_record,
        figures.receiver_duplicates,
    );
    figures
}
