//! `idem-client` against the payments example, over real sockets, on SQLite
//! and Postgres. Faults are real: a TCP proxy on 127.0.0.1 that loses an
//! answer after the service sent it, a claim held by another attempt, a key
//! table taken away from the service, a listener that never answers.

#[path = "../examples/services/payments.rs"]
mod payments;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::ClaimMode;
use idem::{Backend, Claim, ClaimGuard, Engine, Operation, Policy, Scope};
use idem_client::reqwest_middleware::ClientWithMiddleware;
use idem_client::{
    ClientError, IdempotencyKey, MissingKey, RequestBuilderExt, ResponseExt, RetryPolicy,
};
use idem_test_support::{on_each_store, Harness, TestBackend, TestDb};
use payments::{Config, PaymentRequest, Store, CREATE_PAYMENT};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The payments router on an ephemeral loopback port, behind a [`Proxy`].
struct Service {
    store: Store,
    direct: String,
    proxy: Proxy,
}

async fn serve(db: &TestDb) -> Service {
    let store = Store::open_with(
        Some(db.url()),
        Policy::default().with_wait_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("open store");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let app = store.router(Config::default());
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    Service {
        store,
        direct: format!("http://{addr}"),
        proxy: Proxy::start(addr).await,
    }
}

impl Service {
    /// `POST /payments` through the proxy.
    fn payments(&self) -> String {
        format!("{}/payments", self.proxy.base)
    }

    /// The tenant's payments, asked directly.
    async fn count(&self, tenant: &str) -> u64 {
        let list: Value = reqwest::Client::new()
            .get(format!("{}/payments", self.direct))
            .header("x-tenant-id", tenant)
            .send()
            .await
            .expect("GET /payments")
            .json()
            .await
            .expect("a payment list");
        list["count"].as_u64().expect("count")
    }

    /// Runs `sql` on the service's own store.
    async fn execute(&self, sql: &'static str) {
        self.store.execute(sql).await.expect(sql);
    }
}

/// A TCP proxy on 127.0.0.1 that forwards bytes both ways, except on
/// connections it was told to break: there it forwards the request, waits
/// until the service starts answering (so the work is committed), and closes
/// the client's side without passing the answer on.
struct Proxy {
    base: String,
    lose_next: Arc<AtomicUsize>,
    answers: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let lose_next = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (lose, seen, conns) = (lose_next.clone(), answers.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                let lose_this = lose
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                tokio::spawn(relay(client, upstream, lose_this, seen.clone()));
            }
        });
        Self {
            base,
            lose_next,
            answers,
            connections,
        }
    }

    /// Loses the answers on the next `n` connections.
    fn lose_answers(&self, n: usize) {
        self.lose_next.store(n, Ordering::SeqCst);
    }

    /// Answers the service started sending back, lost ones included.
    fn answers(&self) -> usize {
        self.answers.load(Ordering::SeqCst)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, lose: bool, answers: Arc<AtomicUsize>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match server_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Each read that starts an HTTP/1 status line is one answer.
                if buffer[..n].starts_with(b"HTTP/1.") {
                    answers.fetch_add(1, Ordering::SeqCst);
                }
                if lose {
                    break;
                }
                if client_write.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    requests.abort();
}

fn client(policy: RetryPolicy) -> ClientWithMiddleware {
    idem_client::client(reqwest::Client::new(), policy)
}

fn body(amount_cents: i64) -> Value {
    json!({"amount_cents": amount_cents, "currency": "EUR", "destination": "acct_42"})
}

async fn pay(
    http: &ClientWithMiddleware,
    url: &str,
    tenant: &str,
    key: &IdempotencyKey,
    body: &Value,
) -> Result<reqwest::Response, idem_client::reqwest_middleware::Error> {
    http.post(url)
        .idempotency_key(key.clone())
        .header("x-tenant-id", tenant)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
}

/// Holds a durable claim on `(tenant, key)` for `request`, as a concurrent
/// first attempt would: an `in_progress` row whose lock lasts `lock_ttl`.
async fn hold_claim<DB: Backend>(
    engine: &Engine<DB>,
    tenant: &str,
    key: &IdempotencyKey,
    request: &Value,
    lock_ttl: Duration,
) -> ClaimGuard<DB> {
    let request: PaymentRequest = serde_json::from_value(request.clone()).unwrap();
    let op = Operation::new(
        Scope::tenant(tenant),
        key.clone(),
        CREATE_PAYMENT.name(),
        &request,
    )
    .with_policy(
        Policy::default()
            .with_claim_mode(ClaimMode::Durable)
            .with_lock_ttl(lock_ttl),
    );
    match engine.claim(&op).await.expect("claim") {
        Claim::Execute(guard) => guard,
        Claim::Replay(_) => panic!("expected a fresh claim"),
    }
}

/// Holds a claim on `key` in the service's own store, as a first attempt
/// still running would.
async fn hold<DB: Backend>(
    svc: &Service,
    key: &IdempotencyKey,
    request: &Value,
    lock_ttl: Duration,
) -> ClaimGuard<DB> {
    let engine = svc.store.engine::<DB>().expect("the store's backend");
    hold_claim(engine, "acme", key, request, lock_ttl).await
}

/// The first attempt finishes: its answer is stored and committed.
async fn finish<DB: Backend>(held: ClaimGuard<DB>, answer: &Value) {
    let stored = idem::StoredResponse {
        status: 201,
        content_type: "application/json".into(),
        body: serde_json::to_vec(answer).unwrap(),
        headers: Vec::new(),
    };
    held.commit(stored).await.expect("commit the held claim");
}

/// The service committed, the answer was lost on the way back; the retry
/// carries the same key and gets the stored answer, replayed. One payment.
async fn lost_answer_then_replay<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db).await;
    let http = client(
        RetryPolicy::default().backoff(Duration::from_millis(10), Duration::from_millis(50)),
    );
    let key = IdempotencyKey::random();
    svc.proxy.lose_answers(1);

    let logs = idem_test_support::Captured::default();
    let response = {
        let _guard = tracing::subscriber::set_default(logs.subscriber());
        pay(&http, &svc.payments(), "acme", &key, &body(2500))
            .await
            .expect("an answer")
    };
    assert_eq!(response.status(), 201);
    assert_eq!(response.attempts(), 2);
    assert!(response.replayed(), "the retry got the stored answer");
    let payment: Value = response.json().await.unwrap();
    assert!(payment["payment_id"].as_str().unwrap().starts_with("pay_"));
    assert_eq!(svc.proxy.answers(), 2, "the service answered both attempts");
    assert_eq!(svc.count("acme").await, 1, "charged once");

    // One span for the call, one event per attempt with the reason.
    let logs = logs.text();
    assert_eq!(logs.matches("retrying").count(), 1, "{logs}");
    assert_eq!(logs.matches("answered").count(), 1, "{logs}");
    assert!(logs.contains("connection lost before the answer"), "{logs}");
    assert!(logs.contains("idempotent_call"), "{logs}");
    assert!(logs.contains(&key.log_tag()), "{logs}");
    assert!(
        !logs.contains(key.as_str()),
        "raw keys never reach the logs: {logs}"
    );
}

/// Another attempt holds the key: 409 with `Retry-After`; the client waits
/// what it was told (not its short backoff), retries, and gets the replay of
/// what the first attempt stored.
async fn in_progress_then_replay<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db).await;
    let key = IdempotencyKey::random();
    let held = hold::<DB>(&svc, &key, &body(700), Duration::from_secs(2)).await;
    let http =
        client(RetryPolicy::default().backoff(Duration::from_millis(5), Duration::from_millis(20)));

    let started = Instant::now();
    let call = {
        let (http, url, key) = (http.clone(), svc.payments(), key.clone());
        tokio::spawn(async move { pay(&http, &url, "acme", &key, &body(700)).await })
    };
    // The first attempt is refused with 409 while the claim is held.
    while svc.proxy.answers() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stored = json!({"payment_id": "pay_first_attempt", "amount_cents": 700, "currency": "EUR", "destination": "acct_42"});
    finish(held, &stored).await;

    let response = call.await.unwrap().expect("an answer");
    let waited = started.elapsed();
    assert_eq!(response.status(), 201);
    assert_eq!(response.attempts(), 2);
    assert!(response.replayed());
    assert_eq!(response.json::<Value>().await.unwrap(), stored);
    // Retry-After was 1 or 2 s (whole seconds left on a 2 s lock); the backoff alone would be < 20 ms.
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(4),
        "waited {waited:?}"
    );
}

/// The key table is gone: the service fails closed with 503 + `Retry-After`;
/// the table is back before the retry, which charges.
async fn unavailable_then_success<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db).await;
    svc.execute("ALTER TABLE idempotency_keys RENAME TO idempotency_keys_away")
        .await;
    let http = client(RetryPolicy::default());
    let key = IdempotencyKey::random();
    let call = {
        let (http, url, key) = (http.clone(), svc.payments(), key.clone());
        tokio::spawn(async move { pay(&http, &url, "acme", &key, &body(1200)).await })
    };
    while svc.proxy.answers() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    svc.execute("ALTER TABLE idempotency_keys_away RENAME TO idempotency_keys")
        .await;
    let response = call.await.unwrap().expect("an answer");
    assert_eq!(response.status(), 201);
    assert_eq!(response.attempts(), 2);
    assert!(!response.replayed());
    assert_eq!(svc.count("acme").await, 1);
}

/// A 422 is the answer, not a transient failure: one attempt.
async fn invalid_is_not_retried<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db).await;
    let http = client(RetryPolicy::default());
    let response = pay(
        &http,
        &svc.payments(),
        "acme",
        &IdempotencyKey::random(),
        &body(0),
    )
    .await
    .expect("an answer");
    assert_eq!(response.status(), 422);
    assert_eq!(response.attempts(), 1);
    assert_eq!(svc.proxy.answers(), 1);
    // Nor a 400 (no tenant).
    let response = http
        .post(svc.payments())
        .idempotency_key(IdempotencyKey::random())
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body(100)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(response.attempts(), 1);
    assert_eq!(svc.proxy.answers(), 2);
    assert_eq!(svc.count("acme").await, 0);
}

/// The deadline bounds the whole call: a `Retry-After` that would pass it
/// ends the call with the answer in hand, and an attempt still running at
/// the deadline is cut off.
async fn deadline_is_respected<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db).await;
    let key = IdempotencyKey::random();
    let _held = hold::<DB>(&svc, &key, &body(300), Duration::from_secs(30)).await;
    let http = client(
        RetryPolicy::default()
            .deadline(Duration::from_millis(1500))
            .retry_after_cap(Duration::from_secs(60)),
    );
    let started = Instant::now();
    let response = pay(&http, &svc.payments(), "acme", &key, &body(300))
        .await
        .expect("the 409 itself");
    assert_eq!(response.status(), 409);
    assert_eq!(response.attempts(), 1);
    assert!(response.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );

    // A listener that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/payments", silent.local_addr().unwrap());
    let held_open = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let started = Instant::now();
    let error = pay(&http, &url, "acme", &IdempotencyKey::random(), &body(300))
        .await
        .expect_err("no answer");
    let took = started.elapsed();
    assert!(
        matches!(
            ClientError::of(&error),
            Some(ClientError::DeadlineExceeded { attempts: 1, .. })
        ),
        "{error}"
    );
    assert!(
        took >= Duration::from_millis(1450) && took < Duration::from_millis(2500),
        "took {took:?}"
    );
    held_open.abort();
}

/// A streaming body cannot be sent twice: refused before anything is sent.
/// A keyless POST is refused when so configured, and sent once otherwise.
async fn unreplayable_and_keyless_requests<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let db = DB::test_db().await;
    let svc = serve(&db).await;
    let http = client(RetryPolicy::default());
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(serde_json::to_vec(&body(100)).unwrap())];
    let error = http
        .post(svc.payments())
        .idempotency_key(IdempotencyKey::random())
        .header("x-tenant-id", "acme")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect_err("refused");
    let refused = ClientError::of(&error).expect("a client error");
    assert!(
        matches!(refused, ClientError::BodyNotReplayable { .. }),
        "{refused}"
    );
    assert!(error.to_string().contains("streaming body"), "{error}");
    assert_eq!(refused.attempts(), 0);
    assert_eq!(svc.proxy.connections(), 0, "nothing was sent");

    let strict = client(RetryPolicy::default().missing_key(MissingKey::Refuse));
    let error = strict
        .post(svc.payments())
        .header("x-tenant-id", "acme")
        .body(serde_json::to_vec(&body(100)).unwrap())
        .send()
        .await
        .expect_err("refused");
    assert!(
        matches!(
            ClientError::of(&error),
            Some(ClientError::MissingKey { .. })
        ),
        "{error}"
    );
    assert_eq!(svc.proxy.connections(), 0, "nothing was sent");

    // Without a key, a lost answer is not retried: the error comes back as is.
    svc.proxy.lose_answers(1);
    let error = http
        .post(svc.payments())
        .header("x-tenant-id", "acme")
        .header("idempotency-key", "keyless-by-the-client")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body(100)).unwrap())
        .send()
        .await
        .expect_err("the answer was lost");
    assert!(ClientError::of(&error).is_none(), "{error}");
    assert_eq!(svc.proxy.answers(), 1, "sent once");
}

/// The pending-work example: a crash between the call and recording its
/// answer, then a restart that resends with the stored key, charges once.
#[tokio::test]
async fn pending_payment_example_charges_each_intent_once() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(idem_test_support::example_binary("pending_payment"))
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run the example");
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let open = async |file: &str| {
        sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join(file).display()))
            .await
            .expect(file)
    };
    let (caller, service) = (open("caller.db").await, open("payments.db").await);
    let intents: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT state, answer_status, answer FROM pending_payments ORDER BY id")
            .fetch_all(&caller)
            .await
            .unwrap();
    let made: Vec<String> =
        sqlx::query_scalar("SELECT payment_id FROM payments ORDER BY payment_id")
            .fetch_all(&service)
            .await
            .unwrap();
    assert_eq!(made.len(), 2, "two intents, two payments: {made:?}");
    let mut answered: Vec<String> = intents
        .iter()
        .map(|(state, status, answer)| {
            assert_eq!((state.as_str(), *status), ("done", 201), "{answer}");
            let answer: Value = serde_json::from_str(answer).unwrap();
            answer["payment_id"].as_str().unwrap().to_owned()
        })
        .collect();
    answered.sort();
    // The first intent's answer, recorded only after the restart, names the
    // payment its lost first call made: replayed, not charged again.
    assert_eq!(answered, made);
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    lost_answer_then_replay,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    in_progress_then_replay,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    unavailable_then_success,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    invalid_is_not_retried,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    deadline_is_respected,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    unreplayable_and_keyless_requests,
}
