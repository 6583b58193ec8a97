//! The webhook receiver over real HTTP (axum on a loopback socket, signed
//! requests from a hyper client), on SQLite and Postgres: the guide's four
//! test-plan cases (first request, replay, concurrent duplicate, the same id
//! with a different payload), a refused signature (401, nothing stored), a
//! permanent error recorded as poison, and an `#[idempotent]` handler.

#[path = "../examples/services/client.rs"]
mod client;
mod inbox_support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use client::{HttpClient, Reply};
use idem::inbox::webhook::WebhookReceiver;
use idem::inbox::{Consumer, Inbox, Incoming};
use idem::signature::{unix_now, SigningSecret};
use idem::{idempotent, IdempotencyKey, Policy, Problem};
use idem_test_support::{Harness, TestBackend};
use inbox_support::Effects;

idem::steps! {
    const NOTIFY = "notify.v1";
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn hook<DB: TestBackend>(
    State(receiver): State<Arc<WebhookReceiver<DB>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    receiver
        .receive(&headers, &body, async |tx, message| {
            let event: serde_json::Value = message
                .json()
                .map_err(|error| Problem::new(400, "not JSON").with_detail(error.to_string()))?;
            if event["kind"] == "unknown" {
                return Err(Problem::new(422, "unknown event kind"));
            }
            DB::insert_payment(tx, &message.id, 1).await?;
            if event["slow"] == true {
                tokio::time::sleep(Duration::from_millis(2000)).await;
            }
            Ok(serde_json::json!({ "received": message.id }))
        })
        .await
}

/// A consumer handler written as an `#[idempotent]` function.
macro_rules! idempotent_hook {
    ($name:ident, $route:ident, $conn:ty, $db:ty) => {
        #[idempotent(scope = "consumer", step = NOTIFY)]
        async fn $name(
            tx: &mut $conn,
            consumer: Consumer,
            key: IdempotencyKey,
            #[fingerprint] message: Incoming,
        ) -> Result<String, Problem> {
            <$db as TestBackend>::insert_payment(tx, key.as_str(), 1).await?;
            Ok(format!("{} notified of {}", consumer.name(), message.id))
        }

        async fn $route(
            State(receiver): State<Arc<WebhookReceiver<$db>>>,
            headers: HeaderMap,
            body: Bytes,
        ) -> Response {
            receiver
                .receive_idempotent(&headers, &body, async |engine, consumer, key, message| {
                    $name(engine, consumer, key, message).await
                })
                .await
        }
    };
}
idempotent_hook!(
    notify_sqlite,
    macro_hook_sqlite,
    sqlx::SqliteConnection,
    sqlx::Sqlite
);
idempotent_hook!(
    notify_postgres,
    macro_hook_postgres,
    sqlx::PgConnection,
    sqlx::Postgres
);
idempotent_hook!(
    notify_mysql,
    macro_hook_mysql,
    sqlx::MySqlConnection,
    sqlx::MySql
);

struct Server {
    base: String,
    client: HttpClient,
    secret: SigningSecret,
}

impl Server {
    async fn start<DB: TestBackend>(
        h: &Harness<DB>,
        macro_route: Router<Arc<WebhookReceiver<DB>>>,
    ) -> Self {
        let inbox = Inbox::new(h.engine.clone(), "orders-webhooks", NOTIFY.name()).expect("inbox");
        let secret = SigningSecret::new(SECRET).expect("secret");
        let receiver = Arc::new(WebhookReceiver::new(inbox, secret.clone()));
        let app = Router::new()
            .route("/hooks/orders", post(hook::<DB>))
            .merge(macro_route)
            .with_state(receiver);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        Self {
            base,
            client: HttpClient::new(),
            secret,
        }
    }

    async fn send_signed_by(
        &self,
        path: &str,
        secret: &SigningSecret,
        id: &str,
        timestamp: i64,
        body: &str,
    ) -> Reply {
        let signature = secret.sign(id, timestamp, body.as_bytes());
        let timestamp = timestamp.to_string();
        self.client
            .send(
                Method::POST,
                &format!("{}{path}", self.base),
                &[
                    ("webhook-id", id.as_bytes()),
                    ("webhook-timestamp", timestamp.as_bytes()),
                    ("webhook-signature", signature.as_bytes()),
                ],
                Some(body.as_bytes().to_vec()),
            )
            .await
            .expect("request")
    }

    async fn send(&self, id: &str, body: &str) -> Reply {
        self.send_signed_by("/hooks/orders", &self.secret, id, unix_now(), body)
            .await
    }
}

async fn guide_cases<DB: TestBackend + Effects>(
    h: Harness<DB>,
    macro_route: Router<Arc<WebhookReceiver<DB>>>,
    macro_path: &str,
) {
    let server = Server::start(&h, macro_route).await;
    let effects = async |id: &str| DB::effects(h.engine.pool(), id).await;

    // A bad signature: 401 problem+json before any claim; nothing stored.
    let forged = SigningSecret::new("whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==").expect("secret");
    let body = r#"{"kind":"order.created","order":1}"#;
    let refused = server
        .send_signed_by("/hooks/orders", &forged, "evt-1", unix_now(), body)
        .await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(refused.json()["detail"]
        .as_str()
        .unwrap_or("")
        .contains("nothing was processed"));
    let stale = server
        .send_signed_by(
            "/hooks/orders",
            &server.secret,
            "evt-1",
            unix_now() - 3600,
            body,
        )
        .await;
    assert_eq!(
        stale.status, 401,
        "a replayed capture outside the tolerance"
    );
    let unsigned = server
        .client
        .send(
            Method::POST,
            &format!("{}/hooks/orders", server.base),
            &[("webhook-id", b"evt-1")],
            Some(body.as_bytes().to_vec()),
        )
        .await
        .expect("request");
    assert_eq!(unsigned.status, 401);
    assert_eq!(h.records().await, 0, "no claim was made");
    assert_eq!(h.payments().await, 0);

    // 1. First request: processed.
    let first = server.send("evt-1", body).await;
    assert_eq!(
        first.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.json()["received"], "evt-1");
    assert!(!first.replayed());
    assert_eq!(effects("evt-1").await, 1);

    // 2. Replay: the same answer, marked replayed, no second effect.
    let replay = server.send("evt-1", body).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.body, first.body);
    assert!(replay.replayed());
    assert_eq!(effects("evt-1").await, 1);

    // 3. Concurrent duplicate: one runs, the other is told to come back.
    let slow = r#"{"kind":"order.created","order":2,"slow":true}"#;
    let (a, b) = tokio::join!(server.send("evt-2", slow), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.send("evt-2", slow).await
    });
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    let busy = if a.status == 409 { &a } else { &b };
    assert!(busy.header("retry-after").is_some());
    assert_eq!(
        busy.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(effects("evt-2").await, 1);
    let later = server.send("evt-2", slow).await;
    assert_eq!(later.status, 200);
    assert!(later.replayed());
    assert_eq!(effects("evt-2").await, 1);

    // 4. The same id with a different payload: 422, nothing runs.
    let reused = server
        .send("evt-1", r#"{"kind":"order.created","order":99}"#)
        .await;
    assert_eq!(reused.status, 422);
    assert_eq!(
        reused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(effects("evt-1").await, 1);

    // A permanent error: the handler's 4xx, recorded as poison, replayed as such.
    let unknown = r#"{"kind":"unknown"}"#;
    let rejected = server.send("evt-3", unknown).await;
    assert_eq!(rejected.status, 422);
    assert_eq!(server.send("evt-3", unknown).await.status, 422);
    assert_eq!(effects("evt-3").await, 0);
    let inbox = Inbox::new(h.engine.clone(), "orders-webhooks", NOTIFY.name()).expect("inbox");
    let poisoned = inbox.poisoned().await.expect("poisoned");
    assert_eq!(poisoned.len(), 1);
    assert_eq!(poisoned[0].message_id, "evt-3");
    assert_eq!(poisoned[0].source.as_deref(), Some("orders-webhooks"));
    // Requeued (the sender fixed its side), the next delivery runs.
    inbox.requeue("evt-3").await.expect("requeue");
    assert_eq!(
        server.send("evt-3", unknown).await.status,
        422,
        "runs again, still unknown"
    );

    // An `#[idempotent]` handler behind the same receiver.
    let via_macro = server
        .send_signed_by(macro_path, &server.secret, "evt-4", unix_now(), body)
        .await;
    assert_eq!(via_macro.status, 200);
    assert_eq!(via_macro.json(), "orders-webhooks notified of evt-4");
    let again = server
        .send_signed_by(macro_path, &server.secret, "evt-4", unix_now(), body)
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, via_macro.body);
    assert_eq!(effects("evt-4").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_webhook_receiver() {
    guide_cases(
        idem_test_support::stores::sqlite(Policy::default()).await,
        Router::new().route("/hooks/macro", post(macro_hook_sqlite)),
        "/hooks/macro",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_webhook_receiver() {
    guide_cases(
        idem_test_support::stores::postgres(Policy::default()).await,
        Router::new().route("/hooks/macro", post(macro_hook_postgres)),
        "/hooks/macro",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_webhook_receiver() {
    guide_cases(
        idem_test_support::stores::mysql(Policy::default()).await,
        Router::new().route("/hooks/macro", post(macro_hook_mysql)),
        "/hooks/macro",
    )
    .await;
}
