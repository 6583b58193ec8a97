//! `idem::tower::IdempotencyLayer` and `Tx`, on SQLite and Postgres, over
//! real sockets: in front of an axum router (HTTP) and in front of a tonic
//! server whose methods carry no attribute (gRPC).

#[path = "../examples/services/payments.rs"]
mod payments;
#[path = "../examples/services/payments_grpc.rs"]
mod payments_grpc;

use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::grpc::FromRequestMetadata;
use idem::http::problem::types;
use idem::tower::{IdempotencyLayer, Tx};
use idem::{Backend, Engine, Policy};
use idem_test_support::{on_each_store, Harness, TestBackend};
use payments_grpc::{
    ChargeReply, ChargeRequest, Payments, PaymentsClient, PaymentsServer, RefundReply,
    RefundRequest,
};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request};

idem::steps! {
    /// The HTTP route behind the layer.
    const CREATE_ORDER = "layer-create-order.v1";
    /// The gRPC method behind the layer.
    const LAYER_CHARGE = "layer-charge.v1";
}

/// `POST /orders` with a body `amount`: writes a payment row through the
/// claim's transaction, then answers 201 (positive), 422 (negative: a
/// deterministic refusal, stored) or 503 (zero: transient, rolled back).
async fn create_order<DB: TestBackend>(mut tx: Tx<DB>, body: Bytes) -> Response {
    let amount: i64 = std::str::from_utf8(&body).unwrap().trim().parse().unwrap();
    DB::insert_payment(&mut tx, "acme", amount).await.unwrap();
    match amount {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "ledger down").into_response(),
        a if a < 0 => (StatusCode::UNPROCESSABLE_ENTITY, "negative amount").into_response(),
        a => (
            StatusCode::CREATED,
            [
                ("location", format!("/orders/{a}")),
                ("server-id", "replica-1".to_owned()),
            ],
            format!("order for {a}"),
        )
            .into_response(),
    }
}

/// A route that asks for a `Tx` where no layer claims.
async fn unclaimed<DB: TestBackend>(_tx: Tx<DB>) -> StatusCode {
    StatusCode::OK
}

/// Serves `router` on an ephemeral loopback port; its base URL.
async fn serve_http(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

async fn http_app<DB: TestBackend>(h: &Harness<DB>, layer: IdempotencyLayer<DB>) -> String {
    let _ = h;
    serve_http(
        Router::new()
            .route("/orders", post(create_order::<DB>))
            .layer(layer)
            .merge(Router::new().route("/unclaimed", post(unclaimed::<DB>))),
    )
    .await
}

async fn post_order(url: &str, key: Option<&str>, amount: &str) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{url}/orders"))
        .header("x-tenant-id", "acme")
        .body(amount.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.unwrap()
}

fn replayed(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

async fn problem_type(response: reqwest::Response) -> String {
    let body: serde_json::Value = response.json().await.unwrap();
    body["type"].as_str().unwrap_or_default().to_owned()
}

/// First call, replay byte-identical with its kept headers, a reused key,
/// a stored 422 and a rolled-back 503.
async fn http_state_table<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default()).await;
    let url = http_app(&h, IdempotencyLayer::new(h.engine.clone(), CREATE_ORDER)).await;

    let first = post_order(&url, Some("k-1"), "5").await;
    assert_eq!(first.status(), 201);
    assert!(!replayed(&first));
    assert_eq!(first.headers()["location"], "/orders/5");
    assert!(
        first.headers().get("server-id").is_none(),
        "not a kept header"
    );
    let first_body = first.bytes().await.unwrap();
    let again = post_order(&url, Some("k-1"), "5").await;
    assert_eq!(again.status(), 201);
    assert!(replayed(&again));
    assert_eq!(again.headers()["location"], "/orders/5");
    assert_eq!(again.bytes().await.unwrap(), first_body);
    assert_eq!(h.payments().await, 1);

    let reused = post_order(&url, Some("k-1"), "6").await;
    assert_eq!(reused.status(), 422);
    assert_eq!(problem_type(reused).await, types::KEY_REUSED);

    for _ in 0..2 {
        let refused = post_order(&url, Some("k-neg"), "-3").await;
        assert_eq!(refused.status(), 422);
        assert_eq!(refused.text().await.unwrap(), "negative amount");
    }
    assert_eq!(
        h.payments().await,
        2,
        "the stored 422 ran once, its row kept"
    );

    for _ in 0..2 {
        let down = post_order(&url, Some("k-zero"), "0").await;
        assert_eq!(down.status(), 503);
        assert!(!replayed(&down));
    }
    assert_eq!(h.payments().await, 2, "the 503 rolled its row back, twice");
    assert_eq!(h.records().await, 2);
}

/// Refused before anything is claimed: no key, a malformed key, no scope,
/// a body over the limit; and a `Tx` outside the layer is a clear 500.
async fn http_refusals<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default()).await;
    let layer = IdempotencyLayer::new(h.engine.clone(), CREATE_ORDER).with_max_body_bytes(8);
    let url = http_app(&h, layer).await;

    let missing = post_order(&url, None, "5").await;
    assert_eq!(missing.status(), 400);
    assert_eq!(problem_type(missing).await, types::KEY_MISSING);
    let malformed = post_order(&url, Some(&"k".repeat(300)), "5").await;
    assert_eq!(malformed.status(), 400);
    assert_eq!(problem_type(malformed).await, types::KEY_MALFORMED);
    let too_large = post_order(&url, Some("k-big"), "123456789012").await;
    assert_eq!(too_large.status(), 413);
    assert_eq!(problem_type(too_large).await, types::BODY_TOO_LARGE);
    let no_scope = reqwest::Client::new()
        .post(format!("{url}/orders"))
        .header("idempotency-key", "k-2")
        .body("5")
        .send()
        .await
        .unwrap();
    assert_eq!(no_scope.status(), 400);
    assert!(no_scope.text().await.unwrap().contains("x-tenant-id"));

    let unclaimed = reqwest::Client::new()
        .post(format!("{url}/unclaimed"))
        .send()
        .await
        .unwrap();
    assert_eq!(unclaimed.status(), 500);
    assert!(unclaimed.text().await.unwrap().contains("IdempotencyLayer"));
    assert_eq!((h.payments().await, h.records().await), (0, 0));
}

/// 16 concurrent requests with one key: one row; every answer is the
/// order or idem's in-progress 409.
async fn http_concurrent_duplicates<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default().with_wait_timeout(Duration::from_secs(5))).await;
    let url = http_app(&h, IdempotencyLayer::new(h.engine.clone(), CREATE_ORDER)).await;
    let calls = (0..16).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { post_order(&url, Some("k-dup"), "7").await.status() })
    });
    for status in futures::future::join_all(calls).await {
        let status = status.unwrap();
        assert!(status == 201 || status == 409, "{status}");
    }
    assert_eq!(h.payments().await, 1);
}

/// The key table gone: 503 store-unavailable, nothing written.
async fn http_store_down<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default()).await;
    let url = http_app(&h, IdempotencyLayer::new(h.engine.clone(), CREATE_ORDER)).await;
    h.break_key_table().await;
    let down = post_order(&url, Some("k-1"), "5").await;
    assert_eq!(down.status(), 503);
    assert!(down.headers().contains_key("retry-after"));
    assert_eq!(problem_type(down).await, types::STORE_UNAVAILABLE);
    assert_eq!(h.payments().await, 0);
}

/// A tonic service without the attribute: `Charge` takes the claim's
/// transaction from its extensions; `Refund` is not claimed.
struct Plain<DB: Backend> {
    _db: std::marker::PhantomData<fn() -> DB>,
}

#[tonic::async_trait]
impl<DB: TestBackend> Payments for Plain<DB> {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<tonic::Response<ChargeReply>, tonic::Status> {
        let mut tx = Tx::<DB>::from_request_metadata(request.metadata(), request.extensions())?;
        let charge = request.into_inner();
        DB::insert_payment(&mut tx, "acme", charge.amount_cents)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        match charge.destination.as_str() {
            "closed" => Err(tonic::Status::not_found("no such account")),
            "busy" => Err(tonic::Status::unavailable("the ledger is busy")),
            _ => {
                let mut reply = tonic::Response::new(ChargeReply {
                    charge_id: format!("ch_{}", charge.amount_cents),
                    amount_cents: charge.amount_cents,
                    currency: charge.currency,
                });
                reply
                    .metadata_mut()
                    .insert("x-ledger-entry", "le_1".parse().unwrap());
                Ok(reply)
            }
        }
    }

    async fn refund(
        &self,
        request: Request<RefundRequest>,
    ) -> Result<tonic::Response<RefundReply>, tonic::Status> {
        // Not claimed: there is no transaction to take.
        let claimed = Tx::<DB>::from_request_metadata(request.metadata(), request.extensions());
        assert_eq!(
            claimed.err().map(|status| status.code()),
            Some(Code::Internal)
        );
        Ok(tonic::Response::new(RefundReply {
            refund_id: "rf_1".into(),
            amount_cents: request.into_inner().amount_cents,
        }))
    }
}

async fn grpc_client<DB: TestBackend>(engine: Engine<DB>) -> PaymentsClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let layer = IdempotencyLayer::for_paths(
        engine,
        [("/idem.payments.v1.Payments/Charge", LAYER_CHARGE)],
    );
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(PaymentsServer::new(Plain::<DB> {
                _db: std::marker::PhantomData,
            }))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    PaymentsClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap())
}

fn charge(key: &str, amount_cents: i64, destination: &str) -> Request<ChargeRequest> {
    let mut request = Request::new(ChargeRequest {
        amount_cents,
        currency: "EUR".into(),
        destination: destination.into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-tenant-id", "acme".parse().unwrap());
    request
}

fn grpc_replayed<T>(response: &tonic::Response<T>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// The layer in front of tonic: the reply stored and replayed with its
/// kept metadata; a reused key `FAILED_PRECONDITION`; `NOT_FOUND` stored,
/// `UNAVAILABLE` rolled back; no key `INVALID_ARGUMENT`; an unclaimed
/// method passes through.
async fn grpc_state_table<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = harness(Policy::default()).await;
    let mut client = grpc_client(h.engine.clone()).await;

    let first = client.charge(charge("g-1", 500, "acct")).await.unwrap();
    assert!(!grpc_replayed(&first));
    let again = client.charge(charge("g-1", 500, "acct")).await.unwrap();
    assert!(grpc_replayed(&again));
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(again.metadata().get("x-ledger-entry").unwrap(), "le_1");
    assert_eq!(h.payments().await, 1);

    let reused = client.charge(charge("g-1", 501, "acct")).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");

    for _ in 0..2 {
        let closed = client
            .charge(charge("g-closed", 7, "closed"))
            .await
            .unwrap_err();
        assert_eq!(closed.code(), Code::NotFound);
    }
    assert_eq!(h.payments().await, 2, "NOT_FOUND stored: ran once");
    for _ in 0..2 {
        let busy = client
            .charge(charge("g-busy", 9, "busy"))
            .await
            .unwrap_err();
        assert_eq!(busy.code(), Code::Unavailable);
    }
    assert_eq!(h.payments().await, 2, "UNAVAILABLE rolled back");

    let mut keyless = charge("unused", 1, "acct");
    keyless.metadata_mut().remove("idempotency-key");
    let refused = client.charge(keyless).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    let refund = client
        .refund(Request::new(RefundRequest {
            request_id: String::new(),
            charge_id: "ch_500".into(),
            amount_cents: 100,
        }))
        .await
        .unwrap();
    assert_eq!(refund.get_ref().amount_cents, 100);
    assert_eq!(h.payments().await, 2);
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    http_state_table,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    http_refusals,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    http_concurrent_duplicates,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    http_store_down,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    grpc_state_table,
}
