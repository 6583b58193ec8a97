//! Keeping the idempotency key with the pending work, on the caller's side.
//!
//! ```text
//! cargo run --example pending_payment [-- --dir DIR]
//! ```
//!
//! (`--dir` keeps the caller's `caller.db` and the service's `payments.db` in
//! `DIR`.)
//!
//! A caller that mints its key in memory loses it in a crash, and the retry
//! after the restart carries a new key: the payment runs twice. So the key is
//! part of the intent:
//!
//! 1. In one transaction of the caller's own database, the pending payment is
//!    recorded *with* a fresh `IdempotencyKey::random()`.
//! 2. The call is sent with that key (`idem-client` retries it with the same
//!    key and body).
//! 3. The answer is recorded against the row: `done` (2xx) or `rejected`
//!    (4xx). With no answer, the row stays `pending`.
//! 4. At start, and from time to time, every `pending` row is sent again with
//!    its stored key; the service replays what it already did.
//!
//! The demo runs the payments service in-process on a temporary SQLite file,
//! keeps its own pending work in another, records two payments, "crashes"
//! after the first call was sent but before its answer was recorded, and on
//! "restart" resends both: the first comes back replayed, the second is
//! charged, and the service holds exactly two payments. Exits 0 when so.

#[path = "services/payments.rs"]
mod payments;

use std::process::ExitCode;
use std::time::Duration;

use idem_client::reqwest_middleware::ClientWithMiddleware;
use idem_client::{IdempotencyKey, RequestBuilderExt, ResponseExt, RetryPolicy};
use serde_json::{json, Value};
use sqlx::SqlitePool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TENANT: &str = "acme";

/// The caller's own table of work it has decided to do.
const CREATE_PENDING: &str = "CREATE TABLE IF NOT EXISTS pending_payments (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    amount_cents    BIGINT NOT NULL,
    currency        TEXT NOT NULL,
    destination     TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    answer_status   INTEGER,
    answer          TEXT
)";

/// A payment the caller decided to make and has not seen answered.
#[derive(Debug, sqlx::FromRow)]
struct Pending {
    id: i64,
    idempotency_key: String,
    amount_cents: i64,
    currency: String,
    destination: String,
}

/// Step 1: the intent and its key, in one transaction. After the commit, a
/// crash at any point leaves a row that will be sent with this same key.
async fn record_intent(
    db: &SqlitePool,
    amount_cents: i64,
    destination: &str,
) -> Result<Pending, BoxError> {
    let key = IdempotencyKey::random();
    let mut tx = db.begin().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO pending_payments (idempotency_key, amount_cents, currency, destination)
         VALUES ($1, $2, 'EUR', $3) RETURNING id",
    )
    .bind(key.as_str())
    .bind(amount_cents)
    .bind(destination)
    .fetch_one(&mut *tx)
    .await?;
    // ... the caller's other writes for this intent (the order row, say) go here ...
    tx.commit().await?;
    Ok(Pending {
        id,
        idempotency_key: key.to_string(),
        amount_cents,
        currency: "EUR".into(),
        destination: destination.into(),
    })
}

/// Step 2: the call, with the stored key.
async fn send(
    http: &ClientWithMiddleware,
    url: &str,
    pending: &Pending,
) -> Result<reqwest::Response, BoxError> {
    let key = IdempotencyKey::new(pending.idempotency_key.as_str())?;
    let body = json!({
        "amount_cents": pending.amount_cents,
        "currency": pending.currency,
        "destination": pending.destination,
    });
    Ok(http
        .post(url)
        .idempotency_key(key)
        .header("x-tenant-id", TENANT)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body)?)
        .send()
        .await?)
}

/// Step 3: the answer, against the row. A 5xx after the last retry leaves it pending.
async fn record_answer(
    db: &SqlitePool,
    pending: &Pending,
    response: reqwest::Response,
) -> Result<String, BoxError> {
    let status = response.status();
    let (attempts, replayed) = (response.attempts(), response.replayed());
    let answer = response.text().await?;
    let state = match status.as_u16() {
        200..=299 => "done",
        400..=499 => "rejected",
        _ => "pending",
    };
    sqlx::query(
        "UPDATE pending_payments SET state = $1, answer_status = $2, answer = $3 WHERE id = $4",
    )
    .bind(state)
    .bind(i64::from(status.as_u16()))
    .bind(&answer)
    .bind(pending.id)
    .execute(db)
    .await?;
    let payment_id = serde_json::from_str::<Value>(&answer)
        .ok()
        .and_then(|v| v["payment_id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok(format!(
        "{} {state:<8} {payment_id} after {attempts} attempt(s){}",
        status.as_u16(),
        if replayed { ", replayed" } else { "" }
    ))
}

/// Step 4: everything still pending, each with its own stored key.
async fn resend_pending(
    db: &SqlitePool,
    http: &ClientWithMiddleware,
    url: &str,
) -> Result<(), BoxError> {
    let pending: Vec<Pending> = sqlx::query_as(
        "SELECT id, idempotency_key, amount_cents, currency, destination
         FROM pending_payments WHERE state = 'pending' ORDER BY id",
    )
    .fetch_all(db)
    .await?;
    for row in &pending {
        match send(http, url, row).await {
            Ok(response) => {
                let line = record_answer(db, row, response).await?;
                println!("  pending #{}: {line}", row.id);
            }
            Err(error) => println!("  pending #{}: still pending ({error})", row.id),
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("pending_payment: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    let temp = tempfile::tempdir()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = match args.as_slice() {
        [] => temp.path().to_owned(),
        [flag, dir] if flag == "--dir" => std::path::PathBuf::from(dir),
        _ => return Err("usage: pending_payment [--dir DIR]".into()),
    };

    // The payments service, on its own SQLite file.
    let service_db = dir.join("payments.db");
    let store = payments::Store::open(Some(&service_db.display().to_string())).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/payments", listener.local_addr()?);
    let app = store.router(payments::Config::default());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The caller's database of pending work.
    let caller_db = dir.join("caller.db");
    let db = SqlitePool::connect(&format!("sqlite://{}?mode=rwc", caller_db.display())).await?;
    sqlx::query(CREATE_PENDING).execute(&db).await?;

    let http = idem_client::client(
        reqwest::Client::new(),
        RetryPolicy::default().deadline(Duration::from_secs(10)),
    );

    println!("recording two payments, each with its key, in the caller's database");
    let first = record_intent(&db, 2500, "acct_42").await?;
    let second = record_intent(&db, 990, "acct_7").await?;

    println!(
        "sending #{}; the process dies before the answer is recorded",
        first.id
    );
    let lost = send(&http, &url, &first).await?;
    println!(
        "  (the service answered {}; nobody wrote it down)",
        lost.status().as_u16()
    );
    drop(lost);

    println!("restart: resending every pending payment with its stored key");
    resend_pending(&db, &http, &url).await?;

    let left: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM pending_payments WHERE state = 'pending'")
            .fetch_one(&db)
            .await?;
    let list: Value = reqwest::Client::new()
        .get(&url)
        .header("x-tenant-id", TENANT)
        .send()
        .await?
        .json()
        .await?;
    let charged = list["count"].as_u64().unwrap_or(0);
    let recorded: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pending_payments")
        .fetch_one(&db)
        .await?;
    println!("intents recorded: {recorded}, payments charged: {charged}, pending left: {left}");
    drop(second);
    Ok(charged == 2 && left == 0)
}
