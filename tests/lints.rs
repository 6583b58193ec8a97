//! The expansions of every macro are warning-free: this file denies warnings,
//! `unused_qualifications` and clippy's lints, and uses `#[idempotent]` (plain
//! on a free fn, a `&self` method and a generic fn; `http` in a `Router`),
//! `#[derive(Fingerprint)]` (struct, tuple, unit, enum, generic) and
//! `steps!`. It also runs them once on `SQLite`, so nothing here is dead code.

#![deny(warnings, unused_qualifications, clippy::all, clippy::pedantic)]

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem::http::Json;
use idem::sqlx::{Postgres, Sqlite, SqliteConnection};
use idem::{fingerprint, idempotent, Backend, Engine, Fingerprint, IdempotencyKey, Problem};
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

idem::steps! {
    /// Charging a card.
    pub const CHARGE = "charge.v1";
    /// Creating an order.
    const CREATE_ORDER = "create-order.v1";
    /// An older name, kept until its keys expire.
    #[retired]
    pub const CHARGE_V0 = "charge-card.v1";
}

/// A request with every field attribute.
#[derive(Debug, Clone, Deserialize, Fingerprint)]
pub struct Charge {
    amount: i64,
    note: Option<String>,
    #[fingerprint(skip)]
    #[serde(default)]
    trace_id: String,
    #[fingerprint(rename = "ccy")]
    currency: String,
    #[fingerprint(with = lowercase)]
    email: String,
}

#[allow(clippy::ptr_arg)] // the `with` function receives the field as declared
fn lowercase(value: &String, hasher: &mut idem::FingerprintHasher) {
    hasher.write_str(&value.to_lowercase());
}

/// A tuple struct.
#[derive(Fingerprint)]
pub struct Pair(i64, #[fingerprint(skip)] u64);

/// A unit struct.
#[derive(Fingerprint)]
pub struct Ping;

/// A generic enum.
#[derive(Fingerprint)]
pub enum Command<T: Clone> {
    /// A charge.
    Charge {
        /// How much.
        amount: T,
    },
    /// A refund.
    Refund(T, #[fingerprint(skip)] String),
    /// Nothing.
    Nothing,
}

/// A generic struct.
#[derive(Fingerprint)]
pub struct Wrapped<T> {
    inner: T,
}

/// The stored success.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    amount: i64,
}

/// A free function, literal step, with every policy override.
#[idempotent(
    scope = "tenant",
    step = "charge.v1",
    retain = "7d",
    lock_ttl = "30s",
    wait = "2s",
    timeout = "10s",
    durable
)]
async fn charge(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Charge,
) -> Result<Receipt, Problem> {
    let _ = (
        tx,
        &tenant,
        &req.note,
        &req.currency,
        &req.email,
        &req.trace_id,
    );
    Ok(Receipt { amount: req.amount })
}

/// The outcome under another name.
pub type ChargeResult = Result<Receipt, Problem>;

/// A return type that is an alias: not spelled `Result<T, E>`.
#[idempotent(scope = "tenant", step = CHARGE)]
async fn aliased(
    tx: &mut SqliteConnection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Pair,
) -> ChargeResult {
    let _ = (tx, tenant);
    Ok(Receipt { amount: req.0 })
}

/// A service with a method.
pub struct Service {
    fee: i64,
}

impl Service {
    #[idempotent(scope = "tenant", step = CHARGE, fail_open)]
    async fn charge(
        &self,
        tx: &mut SqliteConnection,
        tenant: &str,
        key: &IdempotencyKey,
        #[fingerprint] req: &Pair,
    ) -> Result<i64, Problem> {
        let _ = (tx, tenant);
        Ok(req.0 + self.fee)
    }
}

/// Generic over the backend and the request.
#[idempotent(scope = "tenant", step = CHARGE)]
async fn generic<DB: Backend, T>(
    tx: &mut DB::Connection,
    tenant: String,
    key: IdempotencyKey,
    #[fingerprint] req: Wrapped<T>,
) -> Result<String, Problem>
where
    T: Fingerprint + ToString + Send,
{
    let _ = (tx, tenant);
    Ok(req.inner.to_string())
}

/// An axum handler.
#[idempotent(http, scope = "tenant", step = CREATE_ORDER)]
async fn create_order(
    tx: &mut SqliteConnection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<Charge>,
) -> (StatusCode, String) {
    let _ = tx;
    (StatusCode::CREATED, format!("{tenant}/{}", order.amount))
}

/// The wrappers' futures are `Send` (they can be spawned), generic ones included.
#[allow(dead_code)]
fn futures_are_send(engine: &Engine<Sqlite>, pg: &Engine<Postgres>) {
    fn send<F: Send>(_: F) {}
    let key = IdempotencyKey::new("k").unwrap();
    send(aliased(engine, String::new(), key.clone(), Pair(1, 2)));
    send(generic(
        engine,
        String::new(),
        key.clone(),
        Wrapped { inner: 1u8 },
    ));
    send(generic(
        pg,
        String::new(),
        key.clone(),
        Wrapped { inner: 1u8 },
    ));
    send(Service { fee: 1 }.charge(engine, "acme", &key, &Pair(1, 2)));
}

#[tokio::test]
async fn every_macro_expands_without_warnings_and_runs() {
    let (dir, path) = idem_test_support::sqlite_file();
    let engine = Engine::<Sqlite>::open_sqlite(path).await.unwrap();
    engine.migrate().await.unwrap();
    let key = IdempotencyKey::new("k").unwrap();
    let request = Charge {
        amount: 5,
        note: None,
        trace_id: String::new(),
        currency: "EUR".into(),
        email: "A@B".into(),
    };

    let done = charge(&engine, "acme".into(), key.clone(), request)
        .await
        .unwrap();
    assert_eq!(done.value, Ok(Receipt { amount: 5 }));
    let service = Service { fee: 1 };
    let pair = Pair(1, 2);
    let key = IdempotencyKey::new("method").unwrap();
    let done = service.charge(&engine, "acme", &key, &pair).await.unwrap();
    assert_eq!(done.value, Ok(2));
    assert_eq!(pair.1, 2);
    let other = IdempotencyKey::new("other").unwrap();
    let done = generic(&engine, "acme".into(), other, Wrapped { inner: 3u8 })
        .await
        .unwrap();
    assert_eq!(done.value.unwrap(), "3");

    let aliased_key = IdempotencyKey::new("aliased").unwrap();
    let done = aliased(&engine, "acme".into(), aliased_key.clone(), Pair(4, 0))
        .await
        .unwrap();
    assert_eq!(done.value, Ok(Receipt { amount: 4 }));
    let again = aliased(&engine, "acme".into(), aliased_key, Pair(4, 0))
        .await
        .unwrap();
    assert_eq!(again.via, idem::Via::Replayed);

    let app = Router::new()
        .route("/{tenant}/orders", post(create_order))
        .with_state(engine.clone());
    let request = axum::http::Request::post("/acme/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "order-1")
        .body(axum::body::Body::from(
            r#"{"amount":1,"currency":"EUR","email":"a@b"}"#,
        ))
        .unwrap();
    assert_eq!(
        app.oneshot(request).await.unwrap().status(),
        StatusCode::CREATED
    );

    let _ = fingerprint(CHARGE.name(), &Ping);
    let _ = fingerprint(CHARGE_V0.name(), &Command::<u8>::Nothing);
    let _ = fingerprint(CHARGE.name(), &Command::Charge { amount: 1u8 });
    let _ = fingerprint(CHARGE.name(), &Command::Refund(1u8, String::new()));
    drop(dir);
}
