//! The store failing under an `#[idempotent(http)]` handler, over real
//! sockets: the Postgres server stopped and started again under load, a
//! Postgres connection killed in the middle of a claim's transaction, and a
//! SQLite file that is read-only or full. Each fails closed (503 with
//! `Retry-After`, nothing run or nothing kept), recovers without restarting
//! the service, and loses nothing: every key that was answered 201 has
//! exactly one business row.

#[path = "../examples/services/client.rs"]
mod client;

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Extension, Path};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use client::{HttpClient, Reply};
use idem::http::Json;
use idem::{idempotent, Engine, Fingerprint, IdempotencyKey, Policy};
use idem_test_support::TestBackend;
use idem_test_support::{PgServer, TestDb, FAST_SETTINGS};
use serde::Deserialize;
use sqlx::{Postgres, Sqlite};
use tokio::sync::{oneshot, Notify};

idem::steps! {
    const TAKE_CHARGE = "take-charge.v1";
}

#[derive(Debug, Deserialize, Fingerprint)]
struct Charge {
    amount: i64,
    /// Bytes of padding in the answer (a large stored response).
    #[serde(default)]
    padding: usize,
    /// Write no business row (only the stored answer is written).
    #[serde(default)]
    dry: bool,
}

/// What the handler reports to the test.
#[derive(Default)]
struct Probe {
    /// How many times the handler's body ran.
    runs: AtomicU64,
    /// When set, the next body sends its backend pid here, then waits for
    /// `release` before answering.
    hold: Mutex<Option<oneshot::Sender<i64>>>,
    release: Notify,
}

#[idempotent(http, scope = "tenant", step = TAKE_CHARGE)]
async fn take_charge<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    Extension(probe): Extension<Arc<Probe>>,
    key: IdempotencyKey,
    #[fingerprint] Json(charge): Json<Charge>,
) -> Response {
    probe.runs.fetch_add(1, Ordering::SeqCst);
    let insert = format!(
        "INSERT INTO charges (charge_key, amount) VALUES ('{tenant}/{}', {})",
        key.as_str(),
        charge.amount
    );
    if !charge.dry {
        if let Err(error) = DB::execute_on(tx, &insert).await {
            // The business write failed: a transient error, rolled back.
            return (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response();
        }
    }
    let hold = probe.hold.lock().unwrap().take();
    if let Some(hold) = hold {
        let pid = DB::fetch_i64_on(tx, "SELECT pg_backend_pid()::int8")
            .await
            .expect("backend pid");
        let _ = hold.send(pid);
        probe.release.notified().await;
    }
    let body = serde_json::json!({
        "charge": key.as_str(),
        "amount": charge.amount,
        "padding": "x".repeat(charge.padding),
    });
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

/// The handler on `engine`, served on a loopback port; returns its URL.
async fn serve<DB: TestBackend>(engine: &Engine<DB>, probe: &Arc<Probe>) -> String {
    let app = Router::new()
        .route("/{tenant}/charges", post(take_charge::<DB>))
        .layer(Extension(probe.clone()))
        .with_state(engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/acme/charges", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn charge(http: &HttpClient, url: &str, key: &str, amount: i64, padding: usize) -> Reply {
    send(
        http,
        url,
        key,
        serde_json::json!({"amount": amount, "padding": padding}),
    )
    .await
}

async fn send(http: &HttpClient, url: &str, key: &str, body: serde_json::Value) -> Reply {
    let key = format!("\"{key}\"");
    http.post_json(url, &[("idempotency-key", key.as_str())], &body)
        .await
        .expect("the service answers")
}

/// A 503 that says the store failed, with a `Retry-After`.
fn assert_fails_closed(reply: &Reply) {
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(
        reply
            .header("retry-after")
            .is_some_and(|s| s.parse::<u64>().is_ok()),
        "{reply:?}"
    );
    assert_eq!(
        reply.json()["type"],
        idem::http::problem::types::STORE_UNAVAILABLE,
        "{reply:?}"
    );
}

const CREATE_CHARGES: &str =
    "CREATE TABLE charges (charge_key TEXT NOT NULL, amount BIGINT NOT NULL)";

async fn charges_of<DB: TestBackend>(engine: &Engine<DB>, key: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM charges WHERE charge_key = 'acme/{key}'");
    let mut conn = engine.pool().acquire().await.unwrap();
    DB::fetch_i64_on(&mut conn, &sql).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_load_fails_closed_and_recovers_without_a_restart() {
    let server = PgServer::start(FAST_SETTINGS).expect("a Postgres server of its own");
    let url = server.fresh_database().await;
    let policy = Policy::default();
    let engine =
        Engine::<Postgres>::new(Postgres::pool_of(&url, &policy, 4).await).with_policy(policy);
    engine.migrate().await.unwrap();
    Postgres::execute(engine.pool(), CREATE_CHARGES).await;
    let probe = Arc::new(Probe::default());
    let service = serve(&engine, &probe).await;
    let http = HttpClient::new();

    // Load: four clients, each charging key after key, every key retried
    // until it is answered 201.
    let done = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for client in 0..4 {
        let (http, service, done, refused) =
            (http.clone(), service.clone(), done.clone(), refused.clone());
        load.push(tokio::spawn(async move {
            let mut created = Vec::new();
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                let key = format!("load-{client}-{n}");
                loop {
                    let reply = charge(&http, &service, &key, 100, 0).await;
                    match reply.status {
                        201 => break,
                        // The store refused the claim (fail closed), or an
                        // attempt already in its body lost its connection.
                        503 => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("{key}: unexpected {other}: {reply:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                created.push(key);
                n += 1;
            }
            created
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    server.stop().unwrap();
    // Attempts that were already inside their bodies when the server went
    // away end now; from here on nothing may run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs_while_down = probe.runs.load(Ordering::SeqCst);
    for n in 0..3 {
        let reply = charge(&http, &service, &format!("while-down-{n}"), 7, 0).await;
        assert_fails_closed(&reply);
    }
    assert_eq!(
        probe.runs.load(Ordering::SeqCst),
        runs_while_down,
        "no handler body runs while the store is down"
    );

    server.start_again().unwrap();
    // The same service, the same pool: it answers again once the server is back.
    let deadline = Instant::now() + Duration::from_secs(30);
    let recovered = loop {
        let reply = charge(&http, &service, "after-restart", 9, 0).await;
        if reply.status == 201 || Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(recovered.status, 201, "{recovered:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, Ordering::SeqCst);
    let mut created = vec!["after-restart".to_owned()];
    for client in load {
        created.extend(client.await.unwrap());
    }

    assert!(
        refused.load(Ordering::SeqCst) > 0,
        "the load met the outage"
    );
    for key in &created {
        assert_eq!(charges_of(&engine, key).await, 1, "{key}: one charge");
        let replay = charge(
            &http,
            &service,
            key,
            if key == "after-restart" { 9 } else { 100 },
            0,
        )
        .await;
        assert!(
            replay.status == 201 && replay.replayed(),
            "{key}: {replay:?}"
        );
    }
    let all = Postgres::count(engine.pool(), "SELECT COUNT(*) FROM charges").await;
    assert_eq!(all as usize, created.len(), "no charge without a 201");
    let distinct: HashSet<&String> = created.iter().collect();
    assert_eq!(distinct.len(), created.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_transaction_rolls_back_and_the_retry_runs_once() {
    let db = TestDb::postgres().await;
    let policy = Policy::default();
    let engine =
        Engine::<Postgres>::new(Postgres::pool(db.url(), &policy).await).with_policy(policy);
    engine.migrate().await.unwrap();
    Postgres::execute(engine.pool(), CREATE_CHARGES).await;
    let probe = Arc::new(Probe::default());
    let service = serve(&engine, &probe).await;
    let http = HttpClient::new();

    let (pid_tx, pid_rx) = oneshot::channel();
    *probe.hold.lock().unwrap() = Some(pid_tx);
    let first = {
        let (http, service) = (http.clone(), service.clone());
        tokio::spawn(async move { charge(&http, &service, "killed-1", 500, 0).await })
    };
    // The body has claimed the key and written its charge; its connection
    // is killed before the transaction commits.
    let pid = pid_rx.await.unwrap();
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1::int4)")
        .bind(pid as i32)
        .fetch_one(engine.pool())
        .await
        .unwrap();
    assert!(terminated);
    probe.release.notify_one();
    let first = first.await.unwrap();
    assert_fails_closed(&first);
    assert_eq!(charges_of(&engine, "killed-1").await, 0, "rolled back");
    assert_eq!(
        Postgres::count(engine.pool(), "SELECT COUNT(*) FROM idempotency_keys").await,
        0,
        "nothing stored for the key"
    );

    let retry = charge(&http, &service, "killed-1", 500, 0).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    let again = charge(&http, &service, "killed-1", 500, 0).await;
    assert!(again.replayed() && again.body == retry.body, "{again:?}");
    assert_eq!(charges_of(&engine, "killed-1").await, 1);
    assert_eq!(
        probe.runs.load(Ordering::SeqCst),
        2,
        "the killed attempt and the retry"
    );
}

/// A SQLite store whose connections open the file `url` with `options` on
/// top of the usual ones, migrated and with the `charges` table made
/// through a normal connection first.
async fn sqlite_engine(
    url: &str,
    extra: impl Fn(sqlx::sqlite::SqliteConnectOptions) -> sqlx::sqlite::SqliteConnectOptions,
) -> Engine<Sqlite> {
    let options = extra(
        sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .unwrap()
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5)),
    );
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    Engine::new(pool)
}

#[tokio::test]
async fn a_read_only_sqlite_file_answers_503_and_loses_nothing() {
    let db = TestDb::sqlite();
    let writable = Engine::<Sqlite>::new(Sqlite::pool(db.url(), &Policy::default()).await);
    writable.migrate().await.unwrap();
    Sqlite::execute(writable.pool(), CREATE_CHARGES).await;
    let http = HttpClient::new();

    // The file opened read-only (as when its mount or permissions turn
    // read-only): the claim's write, or the body's, is refused.
    let read_only = sqlite_engine(db.url(), |o| o.read_only(true)).await;
    let probe = Arc::new(Probe::default());
    let service = serve(&read_only, &probe).await;
    let refused = charge(&http, &service, "ro-1", 250, 0).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    // A body that writes nothing itself: storing its answer is refused.
    let dry = serde_json::json!({"amount": 1, "dry": true});
    let refused_dry = send(&http, &service, "ro-2", dry.clone()).await;
    assert_fails_closed(&refused_dry);
    assert_eq!(
        Sqlite::count(writable.pool(), "SELECT COUNT(*) FROM idempotency_keys").await,
        0,
        "nothing stored"
    );

    // Writable again: the retries with the same keys run, once.
    let service = serve(&writable, &probe).await;
    let runs = probe.runs.load(Ordering::SeqCst);
    let retry = charge(&http, &service, "ro-1", 250, 0).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    let retry_dry = send(&http, &service, "ro-2", dry.clone()).await;
    assert!(
        retry_dry.status == 201 && !retry_dry.replayed(),
        "{retry_dry:?}"
    );
    let replay = charge(&http, &service, "ro-1", 250, 0).await;
    assert!(replay.replayed() && replay.body == retry.body, "{replay:?}");
    assert_eq!(charges_of(&writable, "ro-1").await, 1);
    assert_eq!(probe.runs.load(Ordering::SeqCst), runs + 2);
}

#[tokio::test]
async fn a_full_sqlite_file_answers_503_and_loses_nothing() {
    let db = TestDb::sqlite();
    let roomy = Engine::<Sqlite>::new(Sqlite::pool(db.url(), &Policy::default()).await);
    roomy.migrate().await.unwrap();
    Sqlite::execute(roomy.pool(), CREATE_CHARGES).await;
    let pages = Sqlite::count(roomy.pool(), "PRAGMA page_count").await;
    let http = HttpClient::new();

    // The file may not grow: a large answer has no room to be stored.
    let full = sqlite_engine(db.url(), move |o| {
        o.pragma("max_page_count", pages.to_string())
    })
    .await;
    let probe = Arc::new(Probe::default());
    let service = serve(&full, &probe).await;
    let refused = charge(&http, &service, "full-1", 300, 64 * 1024).await;
    assert_fails_closed(&refused);
    assert_eq!(charges_of(&roomy, "full-1").await, 0, "rolled back");

    // Room again: the retry with the same key runs once and is kept.
    let service = serve(&roomy, &probe).await;
    let retry = charge(&http, &service, "full-1", 300, 64 * 1024).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    let again = charge(&http, &service, "full-1", 300, 64 * 1024).await;
    assert!(again.replayed() && again.body == retry.body);
    assert_eq!(charges_of(&roomy, "full-1").await, 1);
}
