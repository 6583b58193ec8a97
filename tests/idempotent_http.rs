//! `#[idempotent(http, ...)]` handlers mounted directly in an axum `Router`, on
//! SQLite and on Postgres, driven with `tower::ServiceExt::oneshot`: execute,
//! byte-identical replay, 422 on a changed body, 400 without a key, and a 5xx
//! that is not stored so the retry executes.

#[path = "../examples/services/client.rs"]
mod client;

use axum::body::{to_bytes, Body};
use axum::extract::Path;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::http::Json;
use idem::{idempotent, Engine, Fingerprint, IdempotencyKey, Policy};
use idem_test_support::{Harness, TestBackend};
use serde::Deserialize;
use tower::ServiceExt;

idem::steps! {
    const CREATE_ORDER = "create-order.v1";
}

#[derive(Debug, Deserialize, Fingerprint)]
struct NewOrder {
    sku: String,
    /// Makes the handler fail with a 503 after writing; not part of the request's identity.
    #[fingerprint(skip)]
    #[serde(default)]
    fail: bool,
}

fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// One answer, read whole.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true")
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .map_or("", |value| value.to_str().unwrap())
    }
}

async fn send(app: &Router, key: Option<&str>, body: &str) -> Reply {
    let mut request =
        Request::post("/acme/orders").header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: to_bytes(body, usize::MAX).await.unwrap().to_vec(),
    }
}

idem_test_support::on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test]
    executes_once_replays_refuses_a_changed_body_and_a_missing_key,
    #[tokio::test]
    a_server_error_is_not_stored_and_the_retry_executes,
    #[tokio::test]
    response_headers_are_stored_and_replayed_over_a_socket,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    another_keys_request_during_a_long_handler_is_not_blamed_on_its_key,
    #[tokio::test]
    which_statuses_are_stored_by_default_and_per_handler,
}

#[idempotent(http, scope = "tenant", step = CREATE_ORDER)]
async fn create_order<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> Response {
    let sql = format!(
        "INSERT INTO orders (tenant, sku) VALUES ('{tenant}', '{}')",
        order.sku
    );
    DB::execute_on(tx, &sql).await.unwrap();
    if order.fail {
        // Written, then a transient failure: must roll back, not be stored.
        return (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
    }
    let body = serde_json::json!({ "tenant": tenant, "sku": order.sku, "nonce": nonce() });
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

/// The handler mounted on the store's engine, with the `orders` table.
async fn app<DB: TestBackend>(store: &Harness<DB>) -> (Router, &Engine<DB>) {
    DB::execute(
        store.engine.pool(),
        "CREATE TABLE orders (tenant TEXT NOT NULL, sku TEXT NOT NULL)",
    )
    .await;
    let app = Router::new()
        .route("/{tenant}/orders", post(create_order::<DB>))
        .with_state(store.engine.clone());
    (app, &store.engine)
}

async fn orders<DB: TestBackend>(engine: &Engine<DB>) -> i64 {
    DB::count(engine.pool(), "SELECT COUNT(*) FROM orders").await
}

async fn executes_once_replays_refuses_a_changed_body_and_a_missing_key<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = harness(Policy::default()).await;
    let (app, engine) = app(&store).await;

    let first = send(&app, Some("\"order-1\""), r#"{"sku":"tea"}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.content_type(), "application/json");
    let body: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(body["tenant"], "acme");
    assert_eq!(body["sku"], "tea");

    // The retry (here in the bare form Stripe clients send) replays
    // the stored answer byte for byte: the nonce does not change.
    let retry = send(&app, Some("order-1"), r#"{"sku":"tea"}"#).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.content_type(), "application/json");
    assert_eq!(retry.body, first.body);

    let changed = send(&app, Some("\"order-1\""), r#"{"sku":"coffee"}"#).await;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(changed.content_type(), "application/problem+json");
    assert!(!changed.replayed());

    let keyless = send(&app, None, r#"{"sku":"tea"}"#).await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST);
    assert_eq!(keyless.content_type(), "application/problem+json");

    assert_eq!(orders(engine).await, 1);
}

async fn a_server_error_is_not_stored_and_the_retry_executes<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = harness(Policy::default()).await;
    let (app, engine) = app(&store).await;

    let failed = send(&app, Some("\"order-2\""), r#"{"sku":"tea","fail":true}"#).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!failed.replayed());
    assert_eq!(orders(engine).await, 0, "the 5xx rolled its write back");

    let retry = send(&app, Some("\"order-2\""), r#"{"sku":"tea"}"#).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(
        !retry.replayed(),
        "nothing was stored for the 5xx, so the retry runs"
    );

    let again = send(&app, Some("\"order-2\""), r#"{"sku":"tea"}"#).await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body);

    assert_eq!(orders(engine).await, 1);
}

idem::steps! {
    const CREATE_SESSION = "create-session.v1";
    const CREATE_TICKET = "create-ticket.v1";
}

/// The headers a created resource answers with, a session cookie and a
/// hop-by-hop header among them.
fn created_with_headers(path: String) -> Response {
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, path),
            (header::ETAG, "\"v1\"".to_owned()),
            (header::CACHE_CONTROL, "no-store".to_owned()),
            (header::LINK, "</docs>; rel=\"help\"".to_owned()),
            (header::SET_COOKIE, "session=first-client".to_owned()),
            (
                header::HeaderName::from_static("x-ticket-shard"),
                "7".to_owned(),
            ),
            (
                header::HeaderName::from_static("keep-alive"),
                "timeout=99".to_owned(),
            ),
        ],
        axum::Json(serde_json::json!({ "nonce": nonce() })),
    )
        .into_response()
}

/// Keeps the default headers: `Set-Cookie` is not stored, so not sent.
#[idempotent(http, scope = "tenant", step = CREATE_TICKET)]
async fn create_ticket<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> Response {
    let _ = &mut *tx;
    created_with_headers(format!("/{tenant}/tickets/{}", order.sku))
}

/// Opts in to `Set-Cookie`: stored, and handed to the retry too.
#[idempotent(http, scope = "tenant", step = CREATE_SESSION, headers = ["Set-Cookie"])]
async fn create_session<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<NewOrder>,
) -> Response {
    let _ = &mut *tx;
    created_with_headers(format!("/{tenant}/sessions/{}", order.sku))
}

async fn response_headers_are_stored_and_replayed_over_a_socket<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = harness(Policy::default()).await;
    let app = Router::new()
        .route("/{tenant}/tickets", post(create_ticket::<DB>))
        .route("/{tenant}/sessions", post(create_session::<DB>))
        .with_state(store.engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = client::HttpClient::new();
    let post = async |path: &str| {
        let key = format!("\"{path}\"");
        http.post_json(
            &format!("{base}{path}"),
            &[("idempotency-key", key.as_str())],
            &serde_json::json!({"sku": "tea"}),
        )
        .await
        .unwrap()
    };

    let first = post("/acme/tickets").await;
    let replay = post("/acme/tickets").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed() && replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    for (name, value) in [
        ("location", "/acme/tickets/tea"),
        ("etag", "\"v1\""),
        ("cache-control", "no-store"),
        ("link", "</docs>; rel=\"help\""),
        ("x-ticket-shard", "7"),
    ] {
        assert_eq!(
            first.header(name),
            Some(value),
            "{name} on the first answer"
        );
        assert_eq!(replay.header(name), Some(value), "{name} on the replay");
    }
    for reply in [&first, &replay] {
        assert_eq!(reply.header("set-cookie"), None, "{reply:?}");
        assert_ne!(reply.header("keep-alive"), Some("timeout=99"), "{reply:?}");
    }

    let first = post("/acme/sessions").await;
    let replay = post("/acme/sessions").await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(first.header("set-cookie"), Some("session=first-client"));
    assert_eq!(replay.header("set-cookie"), Some("session=first-client"));
    assert_eq!(replay.header("location"), Some("/acme/sessions/tea"));
}

idem::steps! {
    const SLOW_ORDER = "slow-order.v1";
}

#[derive(Debug, Deserialize, Fingerprint)]
struct SlowOrder {
    sku: String,
    /// How long the handler keeps its transaction open; not part of the request's identity.
    #[fingerprint(skip)]
    #[serde(default)]
    hold_ms: u64,
}

/// Writes, then keeps its claim's transaction open for `hold_ms`.
#[idempotent(http, scope = "tenant", step = SLOW_ORDER, wait = "300ms")]
async fn slow_order<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(order): Json<SlowOrder>,
) -> Response {
    let sql = format!(
        "INSERT INTO orders (tenant, sku) VALUES ('{tenant}', '{}')",
        order.sku
    );
    DB::execute_on(tx, &sql).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(order.hold_ms)).await;
    (
        StatusCode::CREATED,
        axum::Json(serde_json::json!({ "sku": order.sku })),
    )
        .into_response()
}

async fn post_slow(base: &str, key: &str, sku: &str, hold_ms: u64) -> client::Reply {
    client::HttpClient::new()
        .post_json(
            &format!("{base}/acme/slow"),
            &[("idempotency-key", key)],
            &serde_json::json!({ "sku": sku, "hold_ms": hold_ms }),
        )
        .await
        .unwrap()
}

fn problem_type(reply: &client::Reply) -> String {
    reply.json()["type"].as_str().unwrap_or_default().to_owned()
}

/// While one request's handler runs, a request with another key is never
/// told its key is in use: on Postgres it runs at once; on SQLite, whose one
/// writer is taken, it gets 503 + `Retry-After` "store busy". The same key
/// gets 409 on both.
async fn another_keys_request_during_a_long_handler_is_not_blamed_on_its_key<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = harness(Policy::default()).await;
    DB::execute(
        store.engine.pool(),
        "CREATE TABLE orders (tenant TEXT NOT NULL, sku TEXT NOT NULL)",
    )
    .await;
    let app = Router::new()
        .route("/{tenant}/slow", post(slow_order::<DB>))
        .with_state(store.engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let slow = tokio::spawn({
        let base = base.clone();
        async move { post_slow(&base, "slow-a", "tea", 2500).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;

    let other = post_slow(&base, "other-b", "coffee", 0).await;
    if <DB as sqlx::Database>::NAME == "SQLite" {
        assert_eq!(other.status, 503, "{other:?}");
        assert_eq!(other.header("retry-after"), Some("1"), "{other:?}");
        assert!(
            problem_type(&other).ends_with("#store-busy"),
            "{}",
            problem_type(&other)
        );
        let detail = other.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("says nothing about your key"), "{detail}");
    } else {
        assert_eq!(other.status, 201, "{other:?}");
    }

    let duplicate = post_slow(&base, "slow-a", "tea", 2500).await;
    assert_eq!(duplicate.status, 409, "{duplicate:?}");
    assert!(
        problem_type(&duplicate).ends_with("#request-in-progress"),
        "{}",
        problem_type(&duplicate)
    );

    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 201, "{slow:?}");
    // Once the writer is free, the refused request runs (or replays).
    let retried = post_slow(&base, "other-b", "coffee", 0).await;
    assert_eq!(retried.status, 201, "{retried:?}");
}

idem::steps! {
    const ANSWER_DEFAULT = "answer-default.v1";
    const ANSWER_CUSTOM = "answer-custom.v1";
}

#[derive(Debug, Deserialize, Fingerprint)]
struct Answered {
    /// The status the handler answers with.
    status: u16,
}

fn answer_with(status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap();
    (status, axum::Json(serde_json::json!({ "nonce": nonce() }))).into_response()
}

/// The default set: 401, 403, 408, 425 and 429 roll back; other 4xx are stored.
#[idempotent(http, scope = "tenant", step = ANSWER_DEFAULT)]
async fn answer_default<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(request): Json<Answered>,
) -> Response {
    let _ = (&mut *tx, tenant);
    answer_with(request.status)
}

/// Stores a 401, never a 404 (which replica lag can cause).
#[idempotent(http, scope = "tenant", step = ANSWER_CUSTOM, store = [401], never_store = [404])]
async fn answer_custom<DB: TestBackend>(
    tx: &mut DB::Connection,
    Path(tenant): Path<String>,
    key: IdempotencyKey,
    #[fingerprint] Json(request): Json<Answered>,
) -> Response {
    let _ = (&mut *tx, tenant);
    answer_with(request.status)
}

async fn which_statuses_are_stored_by_default_and_per_handler<DB: TestBackend>(
    harness: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let store = harness(Policy::default()).await;
    let app = Router::new()
        .route("/{tenant}/default", post(answer_default::<DB>))
        .route("/{tenant}/custom", post(answer_custom::<DB>))
        .with_state(store.engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = client::HttpClient::new();
    // Sends the same request twice; whether the second was a replay.
    let replayed = async |route: &str, status: u16| {
        let key = format!("\"{route}-{status}\"");
        let mut replies = Vec::new();
        for _ in 0..2 {
            let reply = http
                .post_json(
                    &format!("{base}/acme/{route}"),
                    &[("idempotency-key", key.as_str())],
                    &serde_json::json!({ "status": status }),
                )
                .await
                .unwrap();
            assert_eq!(reply.status, status, "{reply:?}");
            replies.push(reply);
        }
        let replay = replies[1].replayed();
        assert_eq!(
            replay,
            replies[0].body == replies[1].body,
            "{route} {status}"
        );
        replay
    };
    for status in [200, 201, 400, 404, 409, 422] {
        assert!(
            replayed("default", status).await,
            "{status} is stored by default"
        );
    }
    for status in [401, 403, 408, 425, 429, 500, 503] {
        assert!(
            !replayed("default", status).await,
            "{status} is not stored by default"
        );
    }
    assert!(
        replayed("custom", 401).await,
        "`store = [401]` stores a 401"
    );
    assert!(
        !replayed("custom", 404).await,
        "`never_store = [404]` rolls a 404 back"
    );
    assert!(replayed("custom", 422).await);
    assert!(!replayed("custom", 429).await);
}
