//! Black-box HTTP tests of `examples/payments`, through real sockets, on
//! SQLite and Postgres: the service's router on a bound port for the state
//! table, and the built example binary for the crash points.

#[path = "../examples/services/client.rs"]
mod client;
#[path = "../examples/services/payments.rs"]
mod payments;

use std::process::Stdio;
use std::time::Duration;

use client::{HttpClient, Reply};
use idem::ClaimMode;
use idem::{Backend, Claim, ClaimGuard, Engine, IdempotencyKey, Operation, Policy, Scope};
use idem_test_support::{example_binary, on_each_store, Harness, TestBackend, TestDb};
use payments::{Config, PaymentRequest, Store, CREATE_PAYMENT};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The payments router served in-process on an ephemeral loopback port.
struct Service {
    base: String,
    store: Store,
    http: HttpClient,
}

/// A short wait bound keeps the in-progress and concurrency cases quick.
fn test_policy() -> Policy {
    Policy::default().with_wait_timeout(Duration::from_secs(3))
}

async fn serve(db: &TestDb, config: Config) -> Service {
    let store = Store::open_with(Some(db.url()), test_policy())
        .await
        .expect("open store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = store.router(config);
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    Service {
        base,
        store,
        http: HttpClient::new(),
    }
}

fn body(amount_cents: i64) -> Value {
    json!({"amount_cents": amount_cents, "currency": "EUR", "destination": "acct_42", "requested_at": "2026-01-01T00:00:00Z"})
}

impl Service {
    async fn pay(&self, tenant: &str, key: &str, body: &Value) -> Reply {
        let headers = [("idempotency-key", key), ("x-tenant-id", tenant)];
        self.http
            .post_json(&format!("{}/payments", self.base), &headers, body)
            .await
            .expect("POST /payments")
    }

    async fn raw(&self, headers: &[(&str, &[u8])], body: &[u8]) -> Reply {
        self.http
            .send(
                axum::http::Method::POST,
                &format!("{}/payments", self.base),
                headers,
                Some(body.to_vec()),
            )
            .await
            .expect("POST /payments")
    }

    async fn count(&self, tenant: &str) -> usize {
        let reply = self.list(tenant).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json()["count"].as_u64().unwrap() as usize
    }

    /// Clears the stored headers of every record, as rows written before
    /// the `response_headers` column existed have none.
    async fn forget_response_headers(&self) {
        const SQL: &str = "UPDATE idempotency_keys SET response_headers = NULL";
        self.store
            .execute(SQL)
            .await
            .expect("clear response_headers");
    }

    async fn list(&self, tenant: &str) -> Reply {
        self.http
            .get(
                &format!("{}/payments", self.base),
                &[("x-tenant-id", tenant)],
            )
            .await
            .expect("GET /payments")
    }
}

/// A problem+json body with the four RFC 9457 members and the given status.
fn assert_problem(reply: &Reply, status: u16) -> Value {
    assert_eq!(
        reply.status,
        status,
        "{reply:?} {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{reply:?}"
    );
    let problem = reply.json();
    for member in ["type", "title", "detail"] {
        assert!(
            problem[member].as_str().is_some_and(|s| !s.is_empty()),
            "{member} missing in {problem}"
        );
    }
    assert_eq!(problem["status"], status, "{problem}");
    problem
}

fn retry_after(reply: &Reply) -> u64 {
    reply
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("Retry-After in seconds")
}

/// Holds a durable claim on `(tenant, key)` for `request`: an `in_progress` row with a live lock.
async fn hold_claim<DB: Backend>(
    engine: &Engine<DB>,
    tenant: &str,
    key: &str,
    request: &Value,
) -> ClaimGuard<DB> {
    let request: PaymentRequest = serde_json::from_value(request.clone()).unwrap();
    let op = Operation::new(
        Scope::tenant(tenant),
        IdempotencyKey::new(key).unwrap(),
        CREATE_PAYMENT.name(),
        &request,
    )
    .with_policy(test_policy().with_claim_mode(ClaimMode::Durable));
    match engine.claim(&op).await.expect("claim") {
        Claim::Execute(guard) => guard,
        Claim::Replay(_) => panic!("expected a fresh claim"),
    }
}

async fn state_table<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db, Config::default()).await;

    // nothing → execute: 201 with the payment.
    let first = svc.pay("acme", "k-1", &body(2500)).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    let payment = first.json();
    assert!(payment["payment_id"].as_str().unwrap().starts_with("pay_"));
    assert_eq!(
        (payment["amount_cents"].clone(), payment["currency"].clone()),
        (json!(2500), json!("EUR"))
    );
    assert_eq!(payment["destination"], "acct_42");

    // completed, same fingerprint → replay: same status, content type and bytes, plus the header.
    // `requested_at` is not part of the fingerprint.
    let mut retry_body = body(2500);
    retry_body["requested_at"] = json!("2026-01-01T00:00:09Z");
    let replay = svc.pay("acme", "k-1", &retry_body).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header("content-type"), first.header("content-type"));
    assert_eq!(replay.body, first.body);
    // The response's headers are stored with it: the replay carries the same `Location`.
    let location = format!("/payments/{}", payment["payment_id"].as_str().unwrap());
    assert_eq!(
        first.header("location"),
        Some(location.as_str()),
        "{first:?}"
    );
    assert_eq!(replay.header("location"), first.header("location"));

    // A record written before headers were stored (NULL column) still replays.
    svc.forget_response_headers().await;
    let old_row = svc.pay("acme", "k-1", &body(2500)).await;
    assert_eq!(old_row.status, 201);
    assert!(old_row.replayed(), "{old_row:?}");
    assert_eq!(old_row.body, first.body);
    assert_eq!(old_row.header("location"), None);

    // completed, different fingerprint → 422, nothing runs.
    let reused = svc.pay("acme", "k-1", &body(9999)).await;
    let problem = assert_problem(&reused, 422);
    assert!(
        problem["detail"].as_str().unwrap().contains("new key"),
        "{problem}"
    );
    assert_eq!(svc.count("acme").await, 1);

    // in progress, same fingerprint, live lock → 409 + Retry-After; different fingerprint → 422.
    let engine = svc.store.engine::<DB>().expect("the store's backend");
    let guard = hold_claim(engine, "acme", "k-busy", &body(700)).await;
    let busy = svc.pay("acme", "k-busy", &body(700)).await;
    assert_problem(&busy, 409);
    assert!(retry_after(&busy) >= 1);
    assert_problem(&svc.pay("acme", "k-busy", &body(701)).await, 422);
    drop(guard);
    assert_eq!(svc.count("acme").await, 1);

    // a deterministic client error is stored and replayed.
    let invalid = svc.pay("acme", "k-bad", &body(0)).await;
    assert_problem(&invalid, 422);
    let again = svc.pay("acme", "k-bad", &body(0)).await;
    assert!(again.replayed());
    assert_eq!((again.status, &again.body), (422, &invalid.body));
    let mut currency = body(100);
    currency["currency"] = json!("eur");
    assert_problem(&svc.pay("acme", "k-cur", &currency).await, 422);
    assert_eq!(svc.count("acme").await, 1);

    // store down → fail closed: 503 + Retry-After, and /healthz says 503.
    let health = svc
        .http
        .get(&format!("{}/healthz", svc.base), &[])
        .await
        .unwrap();
    assert_eq!(health.status, 200);
    svc.store.close().await;
    let down = svc.pay("acme", "k-down", &body(100)).await;
    assert_problem(&down, 503);
    assert!(retry_after(&down) >= 1);
    let health = svc
        .http
        .get(&format!("{}/healthz", svc.base), &[])
        .await
        .unwrap();
    assert_eq!(health.status, 503);
}

async fn keys_and_bodies<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(
        &db,
        Config {
            body_limit: 1024,
            ..Config::default()
        },
    )
    .await;
    let valid = serde_json::to_vec(&body(100)).unwrap();
    let tenant: (&str, &[u8]) = ("x-tenant-id", b"acme");

    // Missing key, malformed keys, oversized key: 400, nothing stored.
    let missing = svc.raw(&[tenant], &valid).await;
    assert_problem(&missing, 400);
    let long = format!("\"{}\"", "k".repeat(256));
    let bad_keys: [&[u8]; 7] = [
        b"has space",
        b"\"unterminated",
        b"\"\"",
        b"caf\xc3\xa9",
        b"\"a\"junk",
        long.as_bytes(),
        &long.as_bytes()[1..257],
    ];
    for key in bad_keys {
        let reply = svc.raw(&[tenant, ("idempotency-key", key)], &valid).await;
        assert_problem(&reply, 400);
    }
    let twice = svc
        .raw(
            &[tenant, ("idempotency-key", b"a"), ("idempotency-key", b"b")],
            &valid,
        )
        .await;
    assert_problem(&twice, 400);
    assert_eq!(svc.count("acme").await, 0);

    // Missing tenant: 400.
    assert_problem(&svc.raw(&[("idempotency-key", b"k-t")], &valid).await, 400);

    // The structured-field string and the bare value are the same key; 255 characters is fine.
    let quoted = svc
        .raw(&[tenant, ("idempotency-key", b"\"k-sf\"")], &valid)
        .await;
    assert_eq!(quoted.status, 201, "{quoted:?}");
    let bare = svc
        .raw(&[tenant, ("idempotency-key", b"k-sf")], &valid)
        .await;
    assert!(bare.replayed());
    assert_eq!(bare.body, quoted.body);
    let max = "k".repeat(255);
    assert_eq!(svc.pay("acme", &max, &body(100)).await.status, 201);

    // Malformed JSON, a wrong shape and an oversized body: refused before any claim.
    assert_problem(
        &svc.raw(
            &[tenant, ("idempotency-key", b"k-json")],
            b"{\"amount_cents\": ",
        )
        .await,
        400,
    );
    assert_problem(
        &svc.raw(
            &[tenant, ("idempotency-key", b"k-json")],
            b"{\"amount_cents\": \"ten\"}",
        )
        .await,
        400,
    );
    let mut huge = body(100);
    huge["destination"] = json!("x".repeat(4096));
    assert_problem(&svc.pay("acme", "k-huge", &huge).await, 413);
    assert_eq!(svc.count("acme").await, 2);
    // ... so the same keys then execute normally.
    assert_eq!(svc.pay("acme", "k-json", &body(100)).await.status, 201);
    assert_eq!(svc.pay("acme", "k-huge", &body(100)).await.status, 201);
    assert_eq!(svc.count("acme").await, 4);

    // X-Idem-Fault is ignored without --allow-faults.
    let headers: [(&str, &[u8]); 3] = [
        tenant,
        ("idempotency-key", b"k-fault"),
        ("x-idem-fault", b"after-claim"),
    ];
    assert_eq!(svc.raw(&headers, &valid).await.status, 201);
}

async fn cross_tenant<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db, Config::default()).await;
    let a = svc.pay("tenant-a", "shared-key", &body(1000)).await;
    assert_eq!(a.status, 201);
    // B with A's key, same body: B's own payment, never A's answer.
    let b = svc.pay("tenant-b", "shared-key", &body(1000)).await;
    assert_eq!(b.status, 201);
    assert!(!b.replayed());
    assert_ne!(b.json()["payment_id"], a.json()["payment_id"]);
    // B with A's key and another body: executes too (no 422 across tenants).
    let b2 = svc.pay("tenant-b", "other-key", &body(1)).await;
    assert_eq!(b2.status, 201);
    let a_id = a.json()["payment_id"].as_str().unwrap().to_owned();
    let b_list = svc.list("tenant-b").await;
    assert_eq!(b_list.json()["count"], 2);
    assert!(!String::from_utf8_lossy(&b_list.body).contains(&a_id));
    assert_eq!(svc.count("tenant-a").await, 1);
}

async fn concurrent_duplicates<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db, Config::default()).await;
    let svc = std::sync::Arc::new(svc);
    let attempts = (0..64).map(|_| {
        let svc = svc.clone();
        tokio::spawn(async move { svc.pay("acme", "k-dup", &body(4200)).await })
    });
    let replies: Vec<Reply> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let executed: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .collect();
    assert_eq!(executed.len(), 1, "exactly one attempt executes");
    for reply in &replies {
        match reply.status {
            201 => assert_eq!(reply.body, executed[0].body),
            409 => assert!(retry_after(reply) >= 1),
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(svc.count("acme").await, 1);
}

/// The built `payments` example, started with `--allow-faults` on `url`.
struct Process {
    child: Child,
    base: String,
}

async fn start_process(url: &str) -> Process {
    let mut child = Command::new(example_binary("payments"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            url,
            "--allow-faults",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the payments example");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the example did not start within 30 s")
        .unwrap()
        .expect("the example exited before listening");
    let base = line
        .strip_prefix("listening on ")
        .expect("the ready line")
        .to_owned();
    Process { child, base }
}

async fn crash_points<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let http = HttpClient::new();
    for (n, point) in ["after-claim", "after-business-write", "after-commit"]
        .into_iter()
        .enumerate()
    {
        let key = format!("k-crash-{n}");
        let tenant = "acme";
        let mut process = start_process(db.url()).await;
        let url = format!("{}/payments", process.base);
        let headers = [
            ("idempotency-key", key.as_str()),
            ("x-tenant-id", tenant),
            ("x-idem-fault", point),
        ];
        let crashed = http.post_json(&url, &headers, &body(5000)).await;
        assert!(
            crashed.is_err(),
            "{point}: the process should die before answering, got {crashed:?}"
        );
        let status = tokio::time::timeout(Duration::from_secs(10), process.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(!status.success(), "{point}: aborted");

        // Restart and retry without the fault: exactly one payment, a consistent answer.
        let process = start_process(db.url()).await;
        let url = format!("{}/payments", process.base);
        let headers = [("idempotency-key", key.as_str()), ("x-tenant-id", tenant)];
        let retry = http.post_json(&url, &headers, &body(5000)).await.unwrap();
        assert_eq!(retry.status, 201, "{point}: {retry:?}");
        assert_eq!(
            retry.replayed(),
            point == "after-commit",
            "{point}: only a committed attempt is replayed"
        );
        let again = http.post_json(&url, &headers, &body(5000)).await.unwrap();
        assert!(again.replayed());
        assert_eq!(again.body, retry.body);
        let list = http.get(&url, &[("x-tenant-id", tenant)]).await.unwrap();
        assert_eq!(list.json()["count"], n + 1, "{point}: one payment per key");
        let listed = list.json();
        let ids: Vec<&Value> = listed["payments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["payment_id"])
            .collect();
        assert!(
            ids.contains(&&retry.json()["payment_id"]),
            "{point}: the answer names the stored payment"
        );
    }
}

/// A store holding live keys for a step this build no longer declares (a
/// rename inside the retry window): the service refuses to start, and says why.
async fn refuses_to_start_with_undeclared_live_steps<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let db = DB::test_db().await;
    // The store as a previous version of the service left it.
    let store = Store::open(Some(db.url())).await.expect("open store");
    let request: PaymentRequest = serde_json::from_value(body(100)).unwrap();
    let op = Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new("k-old").unwrap(),
        "refund-payment.v1",
        &request,
    );
    let refunded = || Ok::<_, idem::Problem>("refunded".to_owned());
    let engine = store.engine::<DB>().expect("the store's backend");
    engine
        .run(&op, async |_| refunded())
        .await
        .expect("a key under the old step");
    drop(store);

    let output = Command::new(example_binary("payments"))
        .args(["--listen", "127.0.0.1:0", "--database-url", db.url()])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("the example did not stop within 30 s")
        .expect("run the payments example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    for expected in [
        "1 problem(s) with idempotent steps",
        "unexpired keys for step `refund-payment.v1`, which is no longer declared",
        "#[retired]",
    ] {
        assert!(
            stderr.contains(expected),
            "{expected:?} missing from\n{stderr}"
        );
    }
}

/// A client that writes a whole oversized body before reading gets the 413,
/// not a broken pipe: the server reads and discards the rest of the body
/// (up to a bound) before it answers and closes.
async fn oversized_body_written_whole_gets_its_413<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let db = DB::test_db().await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let svc = serve(&db, Config::default()).await;
    let address = svc.base.trim_start_matches("http://").to_owned();
    // 8 MiB: 128 times the route's limit, more than loopback socket buffers hold.
    let body = format!(
        "{{\"amount_cents\": 100, \"currency\": \"EUR\", \"destination\": \"{}\"}}",
        "x".repeat(128 * payments::DEFAULT_BODY_LIMIT)
    );
    for attempt in 0..3 {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        let head = format!(
            "POST /payments HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
             x-tenant-id: acme\r\nidempotency-key: k-big-{attempt}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket
            .write_all(body.as_bytes())
            .await
            .expect("the server reads the whole body before closing");
        let mut answer = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match socket.read(&mut buffer).await {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buffer[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Err(error) => panic!("reading the answer: {error}"),
            }
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("application/problem+json"), "{answer}");
    }
    assert_eq!(svc.count("acme").await, 0);
}

/// `GET /openapi.json` documents `POST /payments` as idempotent.
async fn openapi_document<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let db = DB::test_db().await;
    let svc = serve(&db, Config::default()).await;
    let reply = svc
        .http
        .send(
            axum::http::Method::GET,
            &format!("{}/openapi.json", svc.base),
            &[],
            None,
        )
        .await
        .expect("GET /openapi.json");
    assert_eq!(reply.status, 200, "{reply:?}");
    let api = reply.json();
    let create = &api["paths"]["/payments"]["post"];
    let key = &create["parameters"][0];
    assert_eq!(key["name"], "Idempotency-Key");
    assert_eq!(key["in"], "header");
    assert_eq!(key["required"], true);
    assert!(create["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
    for status in ["400", "409", "422", "503"] {
        let problem = &create["responses"][status];
        assert!(problem.is_object(), "{status}: {create}");
    }
    for status in ["400", "409", "503"] {
        assert_eq!(
            create["responses"][status]["content"]["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem"
        );
    }
    assert!(create["responses"]["409"]["headers"]["Retry-After"].is_object());
    // The example's own 422 stays as it documented it.
    assert!(create["responses"]["422"]["description"]
        .as_str()
        .unwrap()
        .contains("invalid"));
    assert_eq!(
        api["components"]["schemas"]["Problem"]["required"],
        json!(["type", "title", "status"])
    );
    // Other operations are left alone.
    assert!(api["paths"]["/payments"]["get"]["parameters"].is_null());
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    state_table,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    keys_and_bodies,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    oversized_body_written_whole_gets_its_413,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    openapi_document,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    cross_tenant,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    concurrent_duplicates,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    crash_points,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    refuses_to_start_with_undeclared_live_steps,
}
