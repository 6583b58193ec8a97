//! The retry story, end to end: an order service and a payments service,
//! each with its own SQLite store, in one process.
//!
//! `cargo run --example checkout`
//!
//! The order service's `POST /checkout` claims the client's key, charges the
//! card through the payments service with the derived key
//! `child_key(order_key, "charge-card.v1")`, and records the order in the
//! claim's transaction. The demo then replays the retries of the guide (a
//! client retry after a lost response, a gateway retry, a mesh retry of the
//! downstream call, a concurrent duplicate, a crash after commit, a key reused
//! with a changed amount), prints what every attempt got, and checks that each
//! order was charged exactly once. It exits non-zero if not.

#[path = "services/client.rs"]
mod client;
#[path = "services/payments.rs"]
mod payments;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use client::{BoxError, HttpClient, Reply};
use idem::http::{self, Json, ProblemDetails};
use idem::{
    child_key, Claim, Engine, Fingerprint, FingerprintHasher, IdempotencyKey, Operation, Scope,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Sqlite;
use tracing::Instrument;

/// The order service's step, and the step of its downstream charge.
const PLACE_ORDER: &str = "place-order.v1";
const CHARGE_CARD: &str = "charge-card.v1";
const TENANT: &str = "shop-1";

/// `POST /checkout` body.
#[derive(Debug, Clone, Deserialize)]
struct CheckoutRequest {
    order_ref: String,
    amount_cents: i64,
    currency: String,
}

impl Fingerprint for CheckoutRequest {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.begin_struct();
        hasher.write_field("amount_cents", &self.amount_cents);
        hasher.write_field("currency", &self.currency);
        hasher.write_field("order_ref", &self.order_ref);
        hasher.end_struct();
    }
}

#[derive(Debug, Serialize)]
struct Order {
    order_id: String,
    payment_id: String,
    amount_cents: i64,
}

#[derive(Clone)]
struct Orders {
    engine: Engine<Sqlite>,
    payments_url: String,
    http: HttpClient,
    /// What each call to payments got, for the demo's table.
    calls: Arc<Mutex<Vec<String>>>,
}

/// `POST /checkout`: claim, charge through payments with the derived key,
/// record the order, commit; or replay, or refuse.
async fn checkout(
    State(orders): State<Orders>,
    key: IdempotencyKey,
    headers: axum::http::HeaderMap,
    Json(request): Json<CheckoutRequest>,
) -> Response {
    // The sidecar in front of payments retries a call whose answer it lost.
    let mesh_retry = headers.contains_key("x-demo-mesh-retry");
    let op = Operation::new(Scope::tenant(TENANT), key.clone(), PLACE_ORDER, &request);
    let span = http::operation_span(&op);
    async move {
        let mut guard = match orders.engine.claim(&op).await {
            Ok(Claim::Execute(guard)) => guard,
            Ok(Claim::Replay(stored)) => return http::respond(Claim::<Sqlite>::replayed(stored)),
            Err(error) => return http::respond(Err(error)),
        };
        let charge_key = child_key(key.as_str(), CHARGE_CARD);
        let charge = json!({
            "amount_cents": request.amount_cents,
            "currency": request.currency,
            "destination": format!("merchant/{}", request.order_ref),
        });
        let headers = [
            ("idempotency-key", charge_key.as_str()),
            ("x-tenant-id", TENANT),
        ];
        let url = format!("{}/payments", orders.payments_url);
        let mut charged = orders.http.post_json(&url, &headers, &charge).await;
        orders
            .calls
            .lock()
            .unwrap()
            .push(describe(&charged, mesh_retry));
        if mesh_retry {
            charged = orders.http.post_json(&url, &headers, &charge).await;
            orders.calls.lock().unwrap().push(describe(&charged, false));
        }
        let answer = match charged {
            Ok(reply) if reply.status == 201 => {
                let order = Order {
                    order_id: request.order_ref.clone(),
                    payment_id: reply.json()["payment_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    amount_cents: request.amount_cents,
                };
                let inserted = sqlx::query(
                    "INSERT INTO orders (order_id, payment_id, amount_cents) VALUES ($1, $2, $3)",
                )
                .bind(&order.order_id)
                .bind(&order.payment_id)
                .bind(order.amount_cents)
                .execute(guard.connection())
                .await;
                match inserted {
                    Ok(_) => (StatusCode::CREATED, axum::Json(order)).into_response(),
                    Err(error) => {
                        unavailable(&format!("the order could not be recorded ({error})"))
                    }
                }
            }
            Ok(reply) if (400..500).contains(&reply.status) && reply.status != 409 => {
                ProblemDetails::new(402, "Payment refused")
                    .with_detail(format!(
                        "The payments service refused the charge ({}); nothing was ordered.",
                        reply.status
                    ))
                    .into_response()
            }
            Ok(reply) => unavailable(&format!("the payments service answered {}", reply.status)),
            Err(error) => unavailable(&format!("the payments service did not answer ({error})")),
        };
        http::respond(guard.complete(http::into_stored(answer).await).await)
    }
    .instrument(span)
    .await
}

/// A transient failure: not stored, the client's retry runs again.
fn unavailable(why: &str) -> Response {
    ProblemDetails::new(503, "Order not placed")
        .with_detail(format!(
            "{why}; nothing was stored, retry with the same Idempotency-Key."
        ))
        .into_response()
}

/// `X-Demo-Crash: after-commit`: the handler commits, then the task dies
/// before the answer leaves (the connection drops, like a crashed process).
async fn crash_after_commit(request: Request, next: Next) -> Response {
    let crash = request.headers().contains_key("x-demo-crash");
    let response = next.run(request).await;
    if crash {
        std::panic::panic_any(CrashAfterCommit);
    }
    response
}

struct CrashAfterCommit;

async fn start(app: Router) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(base)
}

/// One attempt of a logical operation, as the table shows it.
struct Attempt {
    who: &'static str,
    got: String,
}

fn describe(reply: &Result<Reply, BoxError>, lost: bool) -> String {
    match reply {
        Err(_) => "no answer: connection dropped".to_owned(),
        Ok(reply) => {
            let what = match reply.status {
                201 if reply.replayed() => "201 replayed".to_owned(),
                201 => "201 executed".to_owned(),
                409 => format!(
                    "409 in progress, Retry-After {}",
                    reply.header("retry-after").unwrap_or("?")
                ),
                422 => "422 key reused with a different request".to_owned(),
                other => format!("{other} {}", reply.json()["title"].as_str().unwrap_or("")),
            };
            if lost {
                format!("{what} (response lost on the way back)")
            } else {
                what
            }
        }
    }
}

struct Demo {
    http: HttpClient,
    orders_url: String,
}

impl Demo {
    async fn send(
        &self,
        key: &str,
        order_ref: &str,
        amount_cents: i64,
        extra: &[(&str, &str)],
    ) -> Result<Reply, BoxError> {
        let mut headers = vec![("idempotency-key", key), ("x-tenant-id", TENANT)];
        headers.extend_from_slice(extra);
        let body = json!({"order_ref": order_ref, "amount_cents": amount_cents, "currency": "EUR"});
        self.http
            .post_json(&format!("{}/checkout", self.orders_url), &headers, &body)
            .await
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("checkout demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, BoxError> {
    // The crash simulation panics on purpose; keep its message out of the table.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<CrashAfterCommit>().is_none() {
            default_hook(info);
        }
    }));

    let dir = tempfile::tempdir()?;
    let payments_db = dir.path().join("payments.db");
    let payments_store = payments::Store::open(Some(&payments_db.display().to_string())).await?;
    let payments_url = start(payments_store.router(payments::Config::default())).await?;

    let orders_engine = Engine::<Sqlite>::open_sqlite(dir.path().join("orders.db")).await?;
    orders_engine.migrate().await?;
    sqlx::query("CREATE TABLE orders (order_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)")
        .execute(orders_engine.pool())
        .await?;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let orders = Orders {
        engine: orders_engine.clone(),
        payments_url: payments_url.clone(),
        http: HttpClient::new(),
        calls: calls.clone(),
    };
    let orders_app = Router::new()
        .route("/checkout", post(checkout))
        .layer(middleware::from_fn(crash_after_commit))
        .with_state(orders);
    let orders_url = start(orders_app).await?;
    let demo = Demo {
        http: HttpClient::new(),
        orders_url,
    };

    println!(
        "order service    {}  (SQLite, POST /checkout)",
        demo.orders_url
    );
    println!("payments service {payments_url}  (SQLite, POST /payments, key = child_key(order key, \"{CHARGE_CARD}\"))\n");

    let mut story: Vec<(&str, &str, Vec<Attempt>, Vec<String>)> = Vec::new();
    let downstream = || std::mem::take(&mut *calls.lock().unwrap());

    // 1. The client's answer is lost; the client retries with the same key.
    let a = demo.send("key-ord-1001", "ord-1001", 2500, &[]).await;
    let b = demo.send("key-ord-1001", "ord-1001", 2500, &[]).await;
    story.push((
        "client retry after a lost response",
        "ord-1001",
        vec![
            Attempt {
                who: "client",
                got: describe(&a, true),
            },
            Attempt {
                who: "client retry",
                got: describe(&b, false),
            },
        ],
        downstream(),
    ));

    // 2. The gateway times out upstream and retries on its own.
    let a = demo
        .send("key-ord-1002", "ord-1002", 1800, &[("via", "1.1 gateway")])
        .await;
    let b = demo
        .send("key-ord-1002", "ord-1002", 1800, &[("via", "1.1 gateway")])
        .await;
    story.push((
        "gateway retry",
        "ord-1002",
        vec![
            Attempt {
                who: "gateway",
                got: describe(&a, true),
            },
            Attempt {
                who: "gateway retry",
                got: describe(&b, false),
            },
        ],
        downstream(),
    ));

    // 3. The mesh sidecar retries the order service's call to payments.
    let a = demo
        .send(
            "key-ord-1003",
            "ord-1003",
            4200,
            &[("x-demo-mesh-retry", "1")],
        )
        .await;
    story.push((
        "mesh retry of the charge",
        "ord-1003",
        vec![Attempt {
            who: "client",
            got: describe(&a, false),
        }],
        downstream(),
    ));

    // 4. A double click: two attempts at once.
    let (a, b) = tokio::join!(
        demo.send("key-ord-1004", "ord-1004", 990, &[]),
        demo.send("key-ord-1004", "ord-1004", 990, &[])
    );
    story.push((
        "duplicate fired concurrently",
        "ord-1004",
        vec![
            Attempt {
                who: "client",
                got: describe(&a, false),
            },
            Attempt {
                who: "client (same instant)",
                got: describe(&b, false),
            },
        ],
        downstream(),
    ));

    // 5. The order service commits, then dies before answering.
    let a = demo
        .send(
            "key-ord-1005",
            "ord-1005",
            3100,
            &[("x-demo-crash", "after-commit")],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = demo.send("key-ord-1005", "ord-1005", 3100, &[]).await;
    story.push((
        "crash after commit",
        "ord-1005",
        vec![
            Attempt {
                who: "client",
                got: describe(&a, false),
            },
            Attempt {
                who: "client retry",
                got: describe(&b, false),
            },
        ],
        downstream(),
    ));

    // 6. A buggy client reuses a key for a different amount.
    let a = demo.send("key-ord-1006", "ord-1006", 5000, &[]).await;
    let b = demo.send("key-ord-1006", "ord-1006", 7500, &[]).await;
    story.push((
        "key reused with a changed amount",
        "ord-1006",
        vec![
            Attempt {
                who: "client",
                got: describe(&a, false),
            },
            Attempt {
                who: "client, amount 7500",
                got: describe(&b, false),
            },
        ],
        downstream(),
    ));

    // Side effects, per service.
    let charges = demo
        .http
        .get(
            &format!("{payments_url}/payments"),
            &[("x-tenant-id", TENANT)],
        )
        .await?
        .json();
    let charges = charges["payments"].as_array().cloned().unwrap_or_default();
    let orders: Vec<(String, String)> = sqlx::query_as("SELECT order_id, payment_id FROM orders")
        .fetch_all(orders_engine.pool())
        .await?;

    println!("{:<36} {:<40} answer", "logical operation", "attempt");
    println!("{}", "-".repeat(112));
    let mut ok = true;
    for (name, order_ref, attempts, calls) in &story {
        for (i, attempt) in attempts.iter().enumerate() {
            let label = if i == 0 { *name } else { "" };
            println!("{label:<36} #{} {:<37} {}", i + 1, attempt.who, attempt.got);
        }
        for call in calls {
            println!("{:<36}    {:<37} {call}", "", "  orders -> payments");
        }
        let destination = format!("merchant/{order_ref}");
        let charged = charges
            .iter()
            .filter(|c| c["destination"] == destination.as_str())
            .count();
        let ordered = orders.iter().filter(|(id, _)| id == order_ref).count();
        let verdict = if charged == 1 && ordered == 1 {
            "ok"
        } else {
            "WRONG"
        };
        ok &= charged == 1 && ordered == 1;
        println!(
            "{:<36}    side effects: orders {ordered}, charges {charged}  [{verdict}]",
            ""
        );
    }
    println!("{}", "-".repeat(112));
    println!(
        "order service: {} orders | payments service: {} charges | {} logical operations, one charge per order: {}",
        orders.len(),
        charges.len(),
        story.len(),
        if ok && charges.len() == story.len() { "yes" } else { "NO" }
    );
    Ok(ok && charges.len() == story.len() && orders.len() == story.len())
}
