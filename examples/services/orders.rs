//! The order service: `POST /checkout`, and the relay that delivers its
//! outbox to the notifications service.
//!
//! Shared by the checkout demo (in process, on SQLite) and the chaos run (a
//! process of its own, on SQLite or Postgres).
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::http::{HeaderScope, Json, XTenantId};
use idem::outbox::{self, Backoff, Message, Relay, WebhookSink};
use idem::signature::SigningSecret;
use idem::{idempotent, Backend, Engine, Fingerprint, IdempotencyKey, Problem, Scope};
use idem_client::reqwest_middleware::{self, ClientWithMiddleware};
use idem_client::{IdempotentRetry, RequestBuilderExt, RetryPolicy};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{PgConnection, Pool, Postgres, Sqlite, SqliteConnection};

idem::steps! {
    /// An order placed through the order service's `POST /checkout`.
    pub const PLACE_ORDER = "place-order.v1";
    /// The card charge an order asks payments for; its key is the order's
    /// key's child under this step.
    pub const CHARGE_CARD = "charge-card.v1";
    /// The notification an order sends through the outbox; its message id
    /// is the order's key's child under this step.
    pub const NOTIFY_ORDER = "notify-order.v1";
}

/// `POST /checkout` body.
#[derive(Debug, Clone, Deserialize, Fingerprint)]
pub struct CheckoutRequest {
    /// The order's id; one order per id.
    pub order_ref: String,
    /// The amount to charge, in minor units.
    pub amount_cents: i64,
    /// ISO 4217 code.
    pub currency: String,
}

/// A placed order, as `POST /checkout` answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// The order's id (the request's `order_ref`).
    pub order_id: String,
    /// The payment that charged it.
    pub payment_id: String,
    /// The amount charged.
    pub amount_cents: i64,
}

/// The order service's state.
pub struct Orders<DB: Backend> {
    /// The order service's own store.
    pub engine: Engine<DB>,
    /// The payments service (with a [`round_robin`] client, any replica).
    pub payments_url: String,
    /// Where order notifications are delivered (the notifications service).
    pub notifications_url: String,
    /// The client that calls payments, retrying with the charge's key.
    pub http: ClientWithMiddleware,
}

impl<DB: Backend> Clone for Orders<DB> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            payments_url: self.payments_url.clone(),
            notifications_url: self.notifications_url.clone(),
            http: self.http.clone(),
        }
    }
}

impl<DB: Backend> FromRef<Orders<DB>> for Engine<DB> {
    fn from_ref(orders: &Orders<DB>) -> Self {
        orders.engine.clone()
    }
}

/// The `orders` table and the checkout route, on either backend.
pub trait OrderBook: Backend {
    /// Creates the `orders` table if missing.
    fn create_table(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Records `order` and enqueues `notification`, in the claim's transaction.
    fn record_order(
        conn: &mut Self::Connection,
        order: &Order,
        notification: &Message,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// Every order: `(order_id, payment_id)`.
    fn all(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<Vec<(String, String)>>> + Send;
}

macro_rules! order_book {
    ($db:ty, $connection:ty) => {
        impl OrderBook for $db {
            async fn create_table(pool: &Pool<Self>) -> sqlx::Result<()> {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
                )
                .execute(pool)
                .await
                .map(drop)
            }

            async fn record_order(
                conn: &mut $connection,
                order: &Order,
                notification: &Message,
            ) -> Result<(), String> {
                sqlx::query(
                    "INSERT INTO orders (order_id, payment_id, amount_cents) VALUES ($1, $2, $3)",
                )
                .bind(&order.order_id)
                .bind(&order.payment_id)
                .bind(order.amount_cents)
                .execute(&mut *conn)
                .await
                .map_err(|error| format!("the order could not be recorded ({error})"))?;
                outbox::enqueue(conn, notification)
                    .await
                    .map(drop)
                    .map_err(|error| format!("the notification could not be enqueued ({error})"))
            }

            async fn all(pool: &Pool<Self>) -> sqlx::Result<Vec<(String, String)>> {
                sqlx::query_as("SELECT order_id, payment_id FROM orders")
                    .fetch_all(pool)
                    .await
            }
        }
    };
}

order_book!(Sqlite, SqliteConnection);
order_book!(Postgres, PgConnection);

/// Migrates the order service's store, validates the step registry against
/// it and creates the `orders` table.
pub async fn prepare<DB: OrderBook>(
    engine: &Engine<DB>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    engine.migrate().await?;
    idem::registry::validate(engine).await?;
    DB::create_table(engine.pool()).await?;
    Ok(())
}

/// The order service's routes (`POST /checkout`).
pub fn router<DB: OrderBook>(orders: Orders<DB>) -> Router {
    Router::new()
        .route("/checkout", post(checkout::<DB>))
        .with_state(orders)
}

/// `POST /checkout`, on either backend: see [`place_order`].
#[idempotent(http, scope = "tenant", step = PLACE_ORDER, durable, lock_ttl = "2s")]
async fn checkout<DB: OrderBook>(
    tx: &mut DB::Connection,
    State(orders): State<Orders<DB>>,
    tenant: HeaderScope<XTenantId>,
    key: IdempotencyKey,
    #[fingerprint] Json(request): Json<CheckoutRequest>,
) -> Response {
    place_order::<DB>(tx, &orders, &tenant, &key, &request).await
}

/// Charge the card through payments with the derived key,
/// record the order and enqueue its notification in the outbox; the order,
/// the notification and this answer commit together, and every retry of the
/// key gets this answer back without running again (nor enqueueing again:
/// the notification's id is `child_key(order key, NOTIFY_ORDER)`).
///
/// The claim is `durable`: it commits an `in_progress` record before the call
/// to payments, so no database lock is held across that call, and a duplicate
/// arriving meanwhile is told 409 with the seconds left on the lock.
async fn place_order<DB: OrderBook>(
    tx: &mut DB::Connection,
    orders: &Orders<DB>,
    tenant: &str,
    key: &IdempotencyKey,
    request: &CheckoutRequest,
) -> Response {
    let charge_key = key.child(CHARGE_CARD);
    let charge = json!({
        "amount_cents": request.amount_cents,
        "currency": request.currency,
        "destination": format!("merchant/{}", request.order_ref),
    });
    let sent = orders
        .http
        .post(format!("{}/payments", orders.payments_url))
        .idempotency_key(charge_key)
        .header("x-tenant-id", tenant)
        .header("content-type", "application/json")
        .body(charge.to_string())
        .send()
        .await;
    let reply = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.json::<serde_json::Value>().await {
                Ok(body) => Ok((status, body)),
                // The answer was cut off while it was read: not an answer.
                Err(error) => {
                    return unavailable(&format!("the payments answer was lost ({error})"))
                }
            }
        }
        Err(error) => Err(error),
    };
    match reply {
        Ok((201, payment)) => {
            let Some(payment_id) = payment["payment_id"].as_str() else {
                return unavailable("the payments service answered 201 without a payment_id");
            };
            let order = Order {
                order_id: request.order_ref.clone(),
                payment_id: payment_id.to_owned(),
                amount_cents: request.amount_cents,
            };
            let notification =
                Message::webhook(format!("{}/notifications", orders.notifications_url))
                    .json(&json!({"order_id": order.order_id, "amount_cents": order.amount_cents}))
                    .map(|message| {
                        message
                            .for_step(key, NOTIFY_ORDER)
                            .scope(&Scope::tenant(tenant))
                    });
            let recorded = match notification {
                Ok(message) => DB::record_order(tx, &order, &message).await,
                Err(error) => Err(error.to_string()),
            };
            match recorded {
                Ok(()) => (StatusCode::CREATED, axum::Json(order)).into_response(),
                Err(why) => unavailable(&why),
            }
        }
        // A deterministic refusal: stored and replayed.
        Ok((status, _)) if (400..500).contains(&status) && status != 409 => {
            Problem::new(402, "Payment refused")
                .with_detail(format!(
                    "The payments service refused the charge ({status}); nothing was ordered."
                ))
                .into_response()
        }
        Ok((status, _)) => unavailable(&format!("the payments service answered {status}")),
        Err(error) => unavailable(&format!("the payments service did not answer ({error})")),
    }
}

/// A transient failure (5xx): rolled back, not stored; the retry runs again.
fn unavailable(why: &str) -> Response {
    Problem::new(503, "Order not placed")
        .with_detail(format!(
            "{why}; nothing was stored, retry with the same Idempotency-Key."
        ))
        .into_response()
}

/// A relay for the order service's outbox, delivering through the webhook
/// sink signed with `secret`; `name` is its user agent. Retries of a failed
/// delivery wait by `backoff`.
pub fn relay<DB: Backend>(
    engine: &Engine<DB>,
    name: &str,
    secret: &str,
    lease: Duration,
    backoff: Backoff,
) -> Result<Relay<DB>, Box<dyn std::error::Error + Send + Sync>> {
    let client = reqwest::Client::builder().user_agent(name).build()?;
    Ok(Relay::new(engine)
        .sink(WebhookSink::with_client(
            client,
            SigningSecret::new(secret)?,
        ))
        .lease(lease)
        .backoff(backoff)
        .poll_interval(Duration::from_millis(50)))
}

/// A client for payments replicas: each attempt of a call (the first and
/// every retry by `policy`, all with the call's key) goes to the next replica
/// in turn, so a retry after a replica died reaches another one. Requests
/// name any replica's URL; the scheme, host and port are replaced.
pub fn round_robin(
    replicas: &[String],
    policy: RetryPolicy,
) -> Result<ClientWithMiddleware, Box<dyn std::error::Error + Send + Sync>> {
    let replicas = replicas
        .iter()
        .map(|replica| reqwest::Url::parse(replica))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(
        reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(IdempotentRetry::new(policy))
            .with(RoundRobin {
                replicas,
                next: AtomicUsize::new(0),
            })
            .build(),
    )
}

/// Sends each attempt to the next replica (below [`IdempotentRetry`], so it
/// sees every attempt).
struct RoundRobin {
    replicas: Vec<reqwest::Url>,
    next: AtomicUsize,
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for RoundRobin {
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut axum::http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if !self.replicas.is_empty() {
            let replica =
                &self.replicas[self.next.fetch_add(1, Ordering::Relaxed) % self.replicas.len()];
            let url = request.url_mut();
            // Both are http URLs with a host: these cannot fail.
            let _ = url.set_scheme(replica.scheme());
            let _ = url.set_host(replica.host_str());
            let _ = url.set_port(replica.port());
        }
        next.run(request, extensions).await
    }
}
