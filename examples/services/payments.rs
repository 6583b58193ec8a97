//! The payments service: `POST /payments`, `GET /payments`, `GET /healthz`.
//!
//! Shared by `examples/payments.rs` (the service on its own), the checkout
//! demo (which runs it in-process) and the HTTP tests.
#![allow(dead_code)]

use std::any::Any;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idem::http::{HeaderScope, Json, XTenantId};
use idem::Policy;
use idem::Problem;
use idem::{idempotent, Backend, Engine, Fingerprint, IdempotencyKey};
use serde::{Deserialize, Serialize};
use sqlx::{MySql, Pool, Postgres, Sqlite};

use fault::FaultPoint;

idem::steps! {
    /// The step every payment is created under.
    pub const CREATE_PAYMENT = "create-payment.v1";
}

/// The default request body limit.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The default SQLite file, in the working directory.
pub const DEFAULT_SQLITE_FILE: &str = "idem-payments.db";

/// Knobs of one payments service.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Bodies larger than this are refused with 413 before any claim.
    pub body_limit: usize,
    /// Honour `X-Idem-Fault` (only with the `faults` feature).
    pub allow_faults: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            allow_faults: false,
        }
    }
}

/// `POST /payments` body. `requested_at` is a client timestamp and is not
/// part of the fingerprint: a retry with a fresh timestamp is the same request.
#[derive(Debug, Clone, Deserialize, Fingerprint)]
pub struct PaymentRequest {
    /// Amount in the currency's minor unit; must be positive.
    pub amount_cents: i64,
    /// ISO 4217 code: three uppercase letters.
    pub currency: String,
    /// Where the money goes; not empty.
    pub destination: String,
    /// When the client made the request (ignored by the fingerprint).
    #[serde(default)]
    #[fingerprint(skip)]
    pub requested_at: Option<String>,
}

/// A stored payment, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The payment's id.
    pub payment_id: String,
    /// The amount in minor units.
    pub amount_cents: i64,
    /// The currency.
    pub currency: String,
    /// The destination.
    pub destination: String,
}

/// `GET /payments` answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct PaymentList {
    /// How many payments the tenant has.
    pub count: usize,
    /// The payments, oldest first.
    pub payments: Vec<Payment>,
}

/// The business table, on either backend.
pub trait Ledger: Backend {
    /// Creates the `payments` table if missing.
    fn create_table(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// Inserts a payment inside the claim's transaction.
    fn insert(
        conn: &mut Self::Connection,
        tenant: &str,
        payment: &Payment,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// The tenant's payment `payment_id`, read inside the claim's transaction.
    fn find(
        conn: &mut Self::Connection,
        tenant: &str,
        payment_id: &str,
    ) -> impl Future<Output = sqlx::Result<Option<Payment>>> + Send;
    /// The tenant's payments, oldest first.
    fn list(
        pool: &Pool<Self>,
        tenant: &str,
    ) -> impl Future<Output = sqlx::Result<Vec<Payment>>> + Send;
    /// One round trip to the database.
    fn ping(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// The ledger's SQL in one backend's dialect.
struct LedgerSql {
    create_table: &'static str,
    insert: &'static str,
    find: &'static str,
    list: &'static str,
}

/// SQLite and Postgres: `$n` placeholders work on both.
const DOLLAR_SQL: LedgerSql = LedgerSql {
    create_table: "CREATE TABLE IF NOT EXISTS payments (
        payment_id   TEXT PRIMARY KEY,
        tenant_id    TEXT NOT NULL,
        amount_cents BIGINT NOT NULL,
        currency     TEXT NOT NULL,
        destination  TEXT NOT NULL,
        created_at   BIGINT NOT NULL
    )",
    insert: "INSERT INTO payments (payment_id, tenant_id, amount_cents, currency, destination, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
    find: "SELECT payment_id, amount_cents, currency, destination FROM payments
           WHERE tenant_id = $1 AND payment_id = $2",
    list: "SELECT payment_id, amount_cents, currency, destination FROM payments
           WHERE tenant_id = $1 ORDER BY created_at, payment_id",
};

/// MySQL: `?` placeholders, and a key column of bounded length.
const MYSQL_SQL: LedgerSql = LedgerSql {
    create_table: "CREATE TABLE IF NOT EXISTS payments (
        payment_id   VARCHAR(255) PRIMARY KEY,
        tenant_id    VARCHAR(255) NOT NULL,
        amount_cents BIGINT NOT NULL,
        currency     VARCHAR(16) NOT NULL,
        destination  TEXT NOT NULL,
        created_at   BIGINT NOT NULL
    )",
    insert: "INSERT INTO payments (payment_id, tenant_id, amount_cents, currency, destination, created_at)
             VALUES (?, ?, ?, ?, ?, ?)",
    find: "SELECT payment_id, amount_cents, currency, destination FROM payments
           WHERE tenant_id = ? AND payment_id = ?",
    list: "SELECT payment_id, amount_cents, currency, destination FROM payments
           WHERE tenant_id = ? ORDER BY created_at, payment_id",
};

/// One implementation per backend, each with its dialect's [`LedgerSql`].
macro_rules! ledger {
    ($db:ty, $sql:expr) => {
        impl Ledger for $db {
            async fn create_table(pool: &Pool<Self>) -> sqlx::Result<()> {
                sqlx::query($sql.create_table).execute(pool).await.map(drop)
            }

            async fn insert(
                conn: &mut Self::Connection,
                tenant: &str,
                payment: &Payment,
            ) -> sqlx::Result<()> {
                sqlx::query($sql.insert)
                    .bind(&payment.payment_id)
                    .bind(tenant)
                    .bind(payment.amount_cents)
                    .bind(&payment.currency)
                    .bind(&payment.destination)
                    .bind(now_millis())
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn find(
                conn: &mut Self::Connection,
                tenant: &str,
                payment_id: &str,
            ) -> sqlx::Result<Option<Payment>> {
                let row: Option<(String, i64, String, String)> = sqlx::query_as($sql.find)
                    .bind(tenant)
                    .bind(payment_id)
                    .fetch_optional(conn)
                    .await?;
                Ok(row.map(
                    |(payment_id, amount_cents, currency, destination)| Payment {
                        payment_id,
                        amount_cents,
                        currency,
                        destination,
                    },
                ))
            }

            async fn list(pool: &Pool<Self>, tenant: &str) -> sqlx::Result<Vec<Payment>> {
                let rows: Vec<(String, i64, String, String)> = sqlx::query_as($sql.list)
                    .bind(tenant)
                    .fetch_all(pool)
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(
                        |(payment_id, amount_cents, currency, destination)| Payment {
                            payment_id,
                            amount_cents,
                            currency,
                            destination,
                        },
                    )
                    .collect())
            }

            async fn ping(pool: &Pool<Self>) -> sqlx::Result<()> {
                sqlx::query("SELECT 1").execute(pool).await.map(drop)
            }
        }
    };
}

ledger!(Sqlite, DOLLAR_SQL);
ledger!(Postgres, DOLLAR_SQL);
ledger!(MySql, MYSQL_SQL);

/// The store behind a payments service: a SQLite file, a Postgres or a MySQL
/// database.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded default.
    Sqlite(Engine<Sqlite>),
    /// Chosen by a `postgres://` URL.
    Postgres(Engine<Postgres>),
    /// Chosen by a `mysql://` or `mariadb://` URL.
    MySql(Engine<MySql>),
}

impl Store {
    /// Opens the store named by `url` (`postgres://...`, `mysql://...`, `sqlite:...`, a file
    /// path, or `None` for [`DEFAULT_SQLITE_FILE`]), runs idem's migrations,
    /// creates the `payments` table and validates the step registry against
    /// the store (every problem listed in the error).
    pub async fn open(url: Option<&str>) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Self::open_with(url, Policy::default()).await
    }

    /// Like [`Store::open`], with a policy other than the default.
    pub async fn open_with(
        url: Option<&str>,
        policy: Policy,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        const POOL: u32 = 8;
        let store = match url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                let pool = idem::store::postgres::connect(url, &policy, POOL).await?;
                Store::Postgres(Engine::new(pool).with_policy(policy))
            }
            Some(url) if url.starts_with("mysql://") || url.starts_with("mariadb://") => {
                let pool = idem::store::mysql::connect(url, &policy, POOL).await?;
                Store::MySql(Engine::new(pool).with_policy(policy))
            }
            url => {
                let url = url.unwrap_or(DEFAULT_SQLITE_FILE);
                let path = url
                    .strip_prefix("sqlite://")
                    .or_else(|| url.strip_prefix("sqlite:"))
                    .unwrap_or(url);
                let pool = idem::store::sqlite::open(path, &policy, POOL).await?;
                Store::Sqlite(Engine::new(pool).with_policy(policy))
            }
        };
        match &store {
            Store::Sqlite(engine) => {
                engine.migrate().await?;
                Sqlite::create_table(engine.pool()).await?;
                idem::registry::validate(engine).await?;
            }
            Store::Postgres(engine) => {
                engine.migrate().await?;
                Postgres::create_table(engine.pool()).await?;
                idem::registry::validate(engine).await?;
            }
            Store::MySql(engine) => {
                engine.migrate().await?;
                MySql::create_table(engine.pool()).await?;
                idem::registry::validate(engine).await?;
            }
        }
        Ok(store)
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
            Store::MySql(_) => "mysql",
        }
    }

    /// The store's engine as an `Engine<DB>`, for code generic over the
    /// backend; `None` when the store is on another backend.
    pub fn engine<DB: Backend>(&self) -> Option<&Engine<DB>> {
        let engine: &dyn Any = match self {
            Store::Sqlite(engine) => engine,
            Store::Postgres(engine) => engine,
            Store::MySql(engine) => engine,
        };
        engine.downcast_ref()
    }

    /// Runs one statement without parameters on the store.
    pub async fn execute(&self, sql: &str) -> sqlx::Result<()> {
        match self {
            Store::Sqlite(engine) => sqlx::query(sql).execute(engine.pool()).await.map(drop),
            Store::Postgres(engine) => sqlx::query(sql).execute(engine.pool()).await.map(drop),
            Store::MySql(engine) => sqlx::query(sql).execute(engine.pool()).await.map(drop),
        }
    }

    /// Closes the store's pool: every later request finds the store down.
    pub async fn close(&self) {
        match self {
            Store::Sqlite(engine) => engine.pool().close().await,
            Store::Postgres(engine) => engine.pool().close().await,
            Store::MySql(engine) => engine.pool().close().await,
        }
    }

    /// The service's routes on this store.
    pub fn router(&self, config: Config) -> Router {
        match self {
            Store::Sqlite(engine) => router(engine.clone(), config),
            Store::Postgres(engine) => router(engine.clone(), config),
            Store::MySql(engine) => router(engine.clone(), config),
        }
    }
}

/// The router's state.
pub struct AppState<DB: Backend> {
    engine: Engine<DB>,
    config: Config,
}

impl<DB: Backend> Clone for AppState<DB> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: self.config,
        }
    }
}

/// `#[idempotent(http)]` handlers take the engine from the state.
impl<DB: Backend> FromRef<AppState<DB>> for Engine<DB> {
    fn from_ref(state: &AppState<DB>) -> Self {
        state.engine.clone()
    }
}

/// The payments routes over `engine`.
pub fn router<DB: Ledger>(engine: Engine<DB>, config: Config) -> Router {
    Router::new()
        .route(
            "/payments",
            post(create_payment::<DB>).get(list_payments::<DB>),
        )
        .route("/healthz", get(healthz::<DB>))
        .route("/openapi.json", get(openapi_json))
        .layer(axum::middleware::from_fn_with_state(
            config.allow_faults,
            fault::layer,
        ))
        .layer(DefaultBodyLimit::max(config.body_limit))
        .with_state(AppState { engine, config })
}

/// `POST /payments`, one handler for both backends (`DB` is SQLite or
/// Postgres; the router mounts `create_payment::<DB>`).
///
/// Every extractor (tenant, key, fault plan, body) runs before the claim, so
/// a malformed request is refused with nothing stored. The body runs after
/// the claim, inside its transaction; the macro renders and stores the
/// response and commits it with the payment, or rolls back on a 5xx.
#[idempotent(http, scope = "tenant", step = CREATE_PAYMENT)]
async fn create_payment<DB: Ledger>(
    tx: &mut DB::Connection,
    tenant: HeaderScope<XTenantId>,
    key: IdempotencyKey,
    faults: fault::Faults,
    #[fingerprint] Json(request): Json<PaymentRequest>,
) -> Response {
    charge::<DB>(tx, &tenant, &request, &faults).await
}

/// The business write of `POST /payments`, in the claim's transaction. The
/// fault points `after-claim` and `after-business-write` are here; the
/// `after-commit` point is in [`fault::layer`], which sees the response
/// after the macro's commit.
async fn charge<DB: Ledger>(
    tx: &mut DB::Connection,
    tenant: &str,
    request: &PaymentRequest,
    faults: &fault::Faults,
) -> Response {
    faults.at(FaultPoint::AfterClaim);
    let answer = match validate(request) {
        Err(problem) => problem.into_response(),
        Ok(()) => {
            let payment = Payment {
                payment_id: new_payment_id(),
                amount_cents: request.amount_cents,
                currency: request.currency.clone(),
                destination: request.destination.clone(),
            };
            match DB::insert(tx, tenant, &payment).await {
                Ok(()) => {
                    // Stored with the response: the replay carries it too.
                    let location = format!("/payments/{}", payment.payment_id);
                    (
                        StatusCode::CREATED,
                        [(header::LOCATION, location)],
                        axum::Json(payment),
                    )
                        .into_response()
                }
                Err(error) => {
                    tracing::warn!(%error, "payment insert failed; rolling back");
                    Problem::new(503, "Payment could not be recorded")
                        .with_detail("The database failed while recording the payment; nothing was charged. Retry with the same Idempotency-Key.")
                        .into_response()
                }
            }
        }
    };
    faults.at(FaultPoint::AfterBusinessWrite);
    faults.ran_body();
    answer
}

/// The rules a well-formed body must also meet; breaking one is a
/// deterministic 422, stored and replayed.
fn validate(request: &PaymentRequest) -> Result<(), Problem> {
    let invalid = |detail: String| Err(Problem::new(422, "Invalid payment").with_detail(detail));
    if request.amount_cents <= 0 {
        return invalid(format!(
            "amount_cents must be a positive integer, got {}; send a new request with a new Idempotency-Key",
            request.amount_cents
        ));
    }
    if request.currency.len() != 3 || !request.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return invalid(format!(
            "currency must be three uppercase letters (ISO 4217, e.g. EUR), got {:?}; send a new request with a new Idempotency-Key",
            request.currency
        ));
    }
    if request.destination.trim().is_empty() {
        return invalid(
            "destination must not be empty; send a new request with a new Idempotency-Key"
                .to_owned(),
        );
    }
    Ok(())
}

/// `GET /payments`: the tenant's payments only.
async fn list_payments<DB: Ledger>(
    State(state): State<AppState<DB>>,
    tenant: HeaderScope<XTenantId>,
) -> Response {
    match DB::list(state.engine.pool(), &tenant).await {
        Ok(payments) => axum::Json(PaymentList {
            count: payments.len(),
            payments,
        })
        .into_response(),
        Err(error) => {
            tracing::warn!(%error, "listing payments failed");
            store_down().into_response()
        }
    }
}

/// `GET /openapi.json`: the API's OpenAPI document; `POST /payments` is
/// documented as idempotent (its `Idempotency-Key` header,
/// `Idempotent-Replayed` on its answers, idem's problem responses).
async fn openapi_json() -> Response {
    use idem::http::openapi::{self, utoipa};
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem, PathsBuilder};
    use utoipa::openapi::{InfoBuilder, OpenApiBuilder, ResponseBuilder};

    let create = OperationBuilder::new()
        .operation_id(Some("createPayment"))
        .summary(Some("Create a payment, once per Idempotency-Key"))
        .response(
            "201",
            ResponseBuilder::new().description("The payment; its URL in Location"),
        )
        .response(
            "422",
            ResponseBuilder::new()
                .description("The key was reused with another request, or the payment is invalid"),
        )
        .build();
    let list = OperationBuilder::new()
        .operation_id(Some("listPayments"))
        .response(
            "200",
            ResponseBuilder::new().description("The tenant's payments"),
        )
        .build();
    let mut payments = PathItem::new(HttpMethod::Post, create);
    payments.get = Some(list);
    let mut api = OpenApiBuilder::new()
        .info(InfoBuilder::new().title("payments").version("1").build())
        .paths(PathsBuilder::new().path("/payments", payments))
        .build();
    openapi::document(&mut api, "/payments", HttpMethod::Post);
    axum::Json(api).into_response()
}

/// `GET /healthz`: 200 when the store answers within a second, 503 when not.
async fn healthz<DB: Ledger>(State(state): State<AppState<DB>>) -> Response {
    match tokio::time::timeout(Duration::from_secs(1), DB::ping(state.engine.pool())).await {
        Ok(Ok(())) => axum::Json(serde_json::json!({"status": "ok"})).into_response(),
        _ => store_down().into_response(),
    }
}

fn store_down() -> Problem {
    Problem::new(503, "Store unavailable")
        .with_type(idem::http::problem::types::STORE_UNAVAILABLE)
        .with_detail("The database does not answer; retry in a few seconds.")
}

/// A fresh, unique payment id: a random (v4) UUID.
pub fn new_payment_id() -> String {
    format!("pay_{}", uuid::Uuid::new_v4().simple())
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Fault injection: `X-Idem-Fault` is honoured only when the service was
/// started with `--allow-faults`, and aborts only in a build with idem's
/// `faults` feature.
///
/// `#[idempotent(http)]` owns the claim and the commit, so the points are
/// reached from both sides of it: [`layer`] reads the header into a
/// [`Faults`] plan the handler extracts; the handler's body calls
/// [`Faults::at`] right after the claim and after the business write; and
/// [`layer`] aborts at `after-commit` once the handler has answered, if its
/// body ran and the answer is one the macro stored (below 500), i.e. the
/// commit happened and the answer has not been sent.
mod fault {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use axum::extract::{FromRequestParts, Request, State};
    use axum::http::request::Parts;
    use axum::middleware::Next;
    use axum::response::Response;
    pub use idem::faults::FaultPoint;

    /// The fault point a request asked for, if faults are allowed.
    #[derive(Clone, Default)]
    pub struct Faults {
        armed: Option<FaultPoint>,
        body_ran: Arc<AtomicBool>,
    }

    impl Faults {
        /// Aborts the process if this request armed `here`.
        pub fn at(&self, here: FaultPoint) {
            idem::faults::abort_at(self.armed, here)
        }

        /// Records that the handler's body ran (not a replay, not a refusal).
        pub fn ran_body(&self) {
            self.body_ran.store(true, Ordering::SeqCst);
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for Faults {
        type Rejection = Infallible;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
            Ok(parts
                .extensions
                .get::<Faults>()
                .cloned()
                .unwrap_or_default())
        }
    }

    /// Reads `X-Idem-Fault` (when `allowed`), and aborts after the commit
    /// when `after-commit` was asked for.
    pub async fn layer(State(allowed): State<bool>, mut request: Request, next: Next) -> Response {
        let armed = if allowed {
            request
                .headers()
                .get("x-idem-fault")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
        } else {
            None
        };
        let faults = Faults {
            armed,
            body_ran: Arc::default(),
        };
        request.extensions_mut().insert(faults.clone());
        let response = next.run(request).await;
        if faults.body_ran.load(Ordering::SeqCst) && response.status().as_u16() < 500 {
            faults.at(FaultPoint::AfterCommit);
        }
        response
    }
}

/// Whether this build can inject faults.
pub const FAULTS_COMPILED: bool = idem::faults::ENABLED;
