//! Over real sockets, on SQLite and Postgres: one `#[idempotent(http)]`
//! handler generic over the backend, mounted for each; and the scope
//! extractors (a header, a named path segment, the authenticated principal)
//! keeping each scope's keys apart.

use std::borrow::Cow;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use idem::http::{HeaderScope, Json, PathScope, PrincipalScope, ScopePathParam, XTenantId};
use idem::{idempotent, Backend, Engine, Fingerprint, IdempotencyKey, Policy, ScopePart};
use idem_test_support::{on_each_store, Harness, TestBackend};
use sqlx::{MySql, Postgres, Sqlite};

idem::steps! {
    const PLACE_ORDER = "place-order.v1";
}

#[derive(serde::Deserialize, Fingerprint)]
struct NewOrder {
    amount: i64,
}

/// The path segment `{shop}`.
struct Shop;
impl ScopePathParam for Shop {
    const NAME: &'static str = "shop";
}

/// The caller an authentication layer found; keys live per organisation.
#[derive(Clone)]
struct Caller {
    org: String,
    user: String,
}

impl ScopePart for Caller {
    fn scope_part(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.org)
    }
}

/// One handler for both backends: the business write goes through the
/// claim's connection, whatever the database.
#[idempotent(http, scope = "tenant", step = PLACE_ORDER)]
async fn by_header<DB: TestBackend>(
    tx: &mut DB::Connection,
    tenant: HeaderScope<XTenantId>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> Result<(StatusCode, String), StatusCode> {
    DB::insert_payment(tx, &tenant.to_string(), order.amount)
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    Ok((StatusCode::CREATED, format!("{tenant}:{}", order.amount)))
}

#[idempotent(http, scope = "shop", step = PLACE_ORDER)]
async fn by_path<DB: Backend>(
    tx: &mut DB::Connection,
    shop: PathScope<Shop>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> (StatusCode, String) {
    let _ = tx;
    (StatusCode::CREATED, format!("{shop}:{}", order.amount))
}

#[idempotent(http, scope = "caller", step = PLACE_ORDER)]
async fn by_principal<DB: Backend>(
    tx: &mut DB::Connection,
    caller: PrincipalScope<Caller>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> (StatusCode, String) {
    let _ = tx;
    (
        StatusCode::CREATED,
        format!("{}@{}:{}", caller.0.user, caller.0.org, order.amount),
    )
}

/// A stand-in authentication layer: `Authorization: Bearer ORG:USER`.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let caller = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .and_then(|token| token.split_once(':'))
        .map(|(org, user)| Caller {
            org: org.to_owned(),
            user: user.to_owned(),
        });
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    next.run(request).await
}

/// The same three handlers, instantiated for each backend.
trait Routes: TestBackend {
    fn router(engine: Engine<Self>) -> Router;
}

macro_rules! routes {
    ($db:ty) => {
        impl Routes for $db {
            fn router(engine: Engine<Self>) -> Router {
                Router::new()
                    .route("/orders", post(by_header::<$db>))
                    .route("/{shop}/orders/{id}", post(by_path::<$db>))
                    .route("/me/orders", post(by_principal::<$db>))
                    .layer(middleware::from_fn(authenticate))
                    .with_state(engine)
            }
        }
    };
}
routes!(Sqlite);
routes!(Postgres);
routes!(MySql);

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    scopes_over_sockets,
}

struct Reply {
    status: u16,
    replayed: bool,
    body: String,
}

async fn post_json(url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    Reply {
        status,
        replayed,
        body: response.text().await.expect("body"),
    }
}

async fn scopes_over_sockets<DB: Routes>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = DB::router(h.engine.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // The header scope, through the backend-generic handler.
    let url = format!("{base}/orders");
    let acme = [("x-tenant-id", "acme"), ("idempotency-key", "k-1")];
    let first = post_json(&url, &acme, r#"{"amount": 5}"#).await;
    assert_eq!(
        (first.status, first.replayed),
        (201, false),
        "{}",
        first.body
    );
    assert_eq!(first.body, "acme:5");
    let retry = post_json(&url, &acme, r#"{"amount": 5}"#).await;
    assert_eq!((retry.status, retry.replayed), (201, true));
    assert_eq!(retry.body, "acme:5");
    // The same key in another tenant's scope is another operation.
    let globex = [("x-tenant-id", "globex"), ("idempotency-key", "k-1")];
    let other = post_json(&url, &globex, r#"{"amount": 7}"#).await;
    assert_eq!((other.status, other.replayed), (201, false));
    assert_eq!(h.payments().await, 2);
    // No tenant: a problem naming the header, and nothing ran.
    let missing = post_json(&url, &[("idempotency-key", "k-2")], r#"{"amount": 5}"#).await;
    assert_eq!(missing.status, 400);
    let problem: serde_json::Value = serde_json::from_str(&missing.body).unwrap();
    assert_eq!(problem["title"], "x-tenant-id header missing or malformed");
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .starts_with("Send the x-tenant-id header"));
    assert_eq!(h.payments().await, 2);

    // The path scope: `{shop}`, whatever else the route holds.
    let key = [("idempotency-key", "k-1")];
    let shop = post_json(&format!("{base}/north/orders/9"), &key, r#"{"amount": 5}"#).await;
    assert_eq!(
        (shop.status, shop.replayed, shop.body.as_str()),
        (201, false, "north:5")
    );
    let again = post_json(&format!("{base}/north/orders/10"), &key, r#"{"amount": 5}"#).await;
    assert_eq!((again.status, again.replayed), (201, true));
    let south = post_json(&format!("{base}/south/orders/9"), &key, r#"{"amount": 5}"#).await;
    assert_eq!((south.status, south.replayed), (201, false));

    // The principal scope: per organisation, whichever user sends the key.
    // (A scope is its text: "acme" here is the header's "acme" too, so
    // these use a key of their own.)
    let key = [("idempotency-key", "k-p")];
    let url = format!("{base}/me/orders");
    let anonymous = post_json(&url, &key, r#"{"amount": 5}"#).await;
    assert_eq!(anonymous.status, 401);
    let ann = [
        ("authorization", "Bearer acme:ann"),
        ("idempotency-key", "k-p"),
    ];
    let by_ann = post_json(&url, &ann, r#"{"amount": 5}"#).await;
    assert_eq!(
        (by_ann.status, by_ann.replayed, by_ann.body.as_str()),
        (201, false, "ann@acme:5")
    );
    let bob = [
        ("authorization", "Bearer acme:bob"),
        ("idempotency-key", "k-p"),
    ];
    let by_bob = post_json(&url, &bob, r#"{"amount": 5}"#).await;
    assert_eq!(
        (by_bob.status, by_bob.replayed, by_bob.body.as_str()),
        (201, true, "ann@acme:5")
    );
    let zed = [
        ("authorization", "Bearer globex:zed"),
        ("idempotency-key", "k-p"),
    ];
    let by_zed = post_json(&url, &zed, r#"{"amount": 5}"#).await;
    assert_eq!((by_zed.status, by_zed.replayed), (201, false));
}
