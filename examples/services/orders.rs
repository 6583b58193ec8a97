//! The order service: `POST /checkout`, and the relay that delivers its
//! outbox to the notifications service. It charges the card over gRPC, with
//! the payments service's `Charge` (`examples/services/payments_grpc.rs`),
//! through idem-client's retry layer.
//!
//! Shared by the checkout demo (in process, on SQLite) and the chaos run (a
//! process of its own, on SQLite or Postgres).
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
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
use idem_client::grpc::{self, IdempotentRetryLayer};
use idem_client::RetryPolicy;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{MySql, MySqlConnection, PgConnection, Pool, Postgres, Sqlite, SqliteConnection};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use crate::payments_grpc::{ChargeRequest, PaymentsClient};

/// The card charge an order asks payments for, over gRPC: the step payments'
/// `Charge` claims its key under. The charge's key is the order's key's
/// child under this step.
pub use crate::payments_grpc::CHARGE_CARD;

idem::steps! {
    /// An order placed through the order service's `POST /checkout`.
    pub const PLACE_ORDER = "place-order.v1";
    /// The notification an order sends through the outbox; its message id
    /// is the order's key's child under this step.
    pub const NOTIFY_ORDER = "notify-order.v1";
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the order service charges through: a gRPC channel to payments inside
/// idem-client's [`IdempotentRetryLayer`], boxed so that [`Orders`] has one
/// type whatever is below the layer (one channel, replicas in turn, the
/// demo's tracing).
pub type ChargeChannel =
    BoxCloneSyncService<http::Request<Body>, http::Response<Body>, ChannelError>;

/// Why a charge got no answer from the channel (a connection refused or
/// lost, the retry layer's deadline), as a type of its own: with a boxed
/// `dyn Error` as the channel's error, the compiler cannot see that the
/// backend-generic checkout handler's future is `Send`.
#[derive(Debug)]
pub struct ChannelError(pub BoxError);

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ChannelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A payments client on `channel` whose calls retry by `policy`, each with
/// its call's key on every attempt.
pub fn payments_client<S>(channel: S, policy: RetryPolicy) -> PaymentsClient<ChargeChannel>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
{
    let retrying = IdempotentRetryLayer::new(policy).layer(channel);
    PaymentsClient::new(BoxCloneSyncService::new(retrying.map_err(ChannelError)))
}

/// A channel to the gRPC server at `url` (`http://host:port`) that connects
/// on first use and again after the connection is lost, so the order service
/// starts, and keeps working, while payments is down or restarting.
pub fn lazy_channel(url: &str) -> Result<Channel, BoxError> {
    Ok(Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy())
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
    /// The payments service's gRPC client ([`payments_client`]), retrying
    /// with the charge's key.
    pub payments: PaymentsClient<ChargeChannel>,
    /// Where order notifications are delivered (the notifications service).
    pub notifications_url: String,
}

impl<DB: Backend> Clone for Orders<DB> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            payments: self.payments.clone(),
            notifications_url: self.notifications_url.clone(),
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

/// One implementation per backend: the table and the insert in its dialect.
macro_rules! order_book {
    ($db:ty, $connection:ty, $create:expr, $insert:expr) => {
        impl OrderBook for $db {
            async fn create_table(pool: &Pool<Self>) -> sqlx::Result<()> {
                sqlx::query($create).execute(pool).await.map(drop)
            }

            async fn record_order(
                conn: &mut $connection,
                order: &Order,
                notification: &Message,
            ) -> Result<(), String> {
                sqlx::query($insert)
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

const CREATE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)";
order_book!(
    Sqlite,
    SqliteConnection,
    CREATE_ORDERS,
    "INSERT INTO orders (order_id, payment_id, amount_cents) VALUES ($1, $2, $3)"
);
order_book!(
    Postgres,
    PgConnection,
    CREATE_ORDERS,
    "INSERT INTO orders (order_id, payment_id, amount_cents) VALUES ($1, $2, $3)"
);
order_book!(
    MySql,
    MySqlConnection,
    "CREATE TABLE IF NOT EXISTS orders (order_id VARCHAR(255) PRIMARY KEY, payment_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
    "INSERT INTO orders (order_id, payment_id, amount_cents) VALUES (?, ?, ?)"
);

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

/// Charge the card through payments' gRPC `Charge` with the derived key,
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
    let Ok(tenant_entry) = tenant.parse() else {
        return Problem::new(400, "Tenant not sendable")
            .with_detail("The X-Tenant-Id cannot be sent as gRPC metadata (visible ASCII only).")
            .into_response();
    };
    let mut charge = grpc::with_key(
        tonic::Request::new(ChargeRequest {
            amount_cents: request.amount_cents,
            currency: request.currency.clone(),
            destination: format!("merchant/{}", request.order_ref),
            ..ChargeRequest::default()
        }),
        key.child(CHARGE_CARD),
    );
    charge.metadata_mut().insert("x-tenant-id", tenant_entry);
    let reply = match orders.payments.clone().charge(charge).await {
        Ok(reply) => reply.into_inner(),
        // A deterministic refusal (payments stores these): stored and replayed.
        Err(status)
            if matches!(
                status.code(),
                Code::InvalidArgument
                    | Code::FailedPrecondition
                    | Code::OutOfRange
                    | Code::NotFound
                    | Code::AlreadyExists
            ) =>
        {
            return Problem::new(402, "Payment refused")
                .with_detail(format!(
                    "The payments service refused the charge ({:?}: {}); nothing was ordered.",
                    status.code(),
                    status.message()
                ))
                .into_response();
        }
        Err(status) => {
            return unavailable(&format!(
                "the payments service did not charge ({:?}: {})",
                status.code(),
                status.message()
            ))
        }
    };
    let order = Order {
        order_id: request.order_ref.clone(),
        payment_id: reply.charge_id,
        amount_cents: request.amount_cents,
    };
    let notification = Message::webhook(format!("{}/notifications", orders.notifications_url))
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

/// Payments replicas in turn: each call through it (each attempt of a
/// logical call, below [`IdempotentRetryLayer`], all with the call's key)
/// goes to the next replica, so a retry after a replica died reaches another
/// one.
#[derive(Clone)]
pub struct RoundRobin {
    replicas: std::sync::Arc<[Channel]>,
    next: std::sync::Arc<AtomicUsize>,
}

impl RoundRobin {
    /// A lazy channel ([`lazy_channel`]) to each replica's gRPC URL.
    pub fn new(replicas: &[String]) -> Result<Self, BoxError> {
        let replicas = replicas
            .iter()
            .map(|url| lazy_channel(url))
            .collect::<Result<Vec<_>, _>>()?;
        if replicas.is_empty() {
            return Err("no payments replica".into());
        }
        Ok(Self {
            replicas: replicas.into(),
            next: Default::default(),
        })
    }
}

impl Service<http::Request<Body>> for RoundRobin {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>>;

    /// Always ready: the replica a call goes to is waited for in the call.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let n = self.next.fetch_add(1, Ordering::Relaxed) % self.replicas.len();
        let replica = self.replicas[n].clone();
        Box::pin(async move {
            let response = replica.oneshot(request).await?;
            Ok(response.map(Body::new))
        })
    }
}
