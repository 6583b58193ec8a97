//! `idem_client::grpc` against a real tonic server over HTTP/2 on 127.0.0.1:
//! which statuses are retried, with which key and message, how long it waits.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use idem_client::grpc::{self, IdempotentRetry, IdempotentRetryLayer};
use idem_client::{IdempotencyKey, ResponseExt, RetryPolicy};
use idem_runtime::grpc::FromRequestMetadata;
use idem_runtime::IdemError;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::body::Body;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use tower::{service_fn, Service, ServiceBuilder};

#[derive(Clone, PartialEq, prost::Message)]
struct Charge {
    #[prost(string, tag = "1")]
    id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Receipt {
    #[prost(string, tag = "1")]
    id: String,
}

/// One call the handler saw.
#[derive(Debug, Clone)]
struct Call {
    key: String,
    id: String,
    at: Instant,
}

/// The test service's script and record: it answers each status of `fail`
/// in turn, then succeeds.
#[derive(Default)]
struct Shared {
    fail: Mutex<VecDeque<Status>>,
    calls: Mutex<Vec<Call>>,
    /// Successes say `idempotent-replayed: true`.
    replayed: bool,
    /// The first call sleeps this long before answering.
    slow_first: Option<Duration>,
}

impl Shared {
    fn failing(fail: impl IntoIterator<Item = Status>) -> Self {
        Self {
            fail: Mutex::new(fail.into_iter().collect()),
            ..Self::default()
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

async fn answer(
    shared: Arc<Shared>,
    request: Request<Charge>,
) -> Result<Response<Receipt>, Status> {
    // idem's own parsing of the key: the server reads what the client sends.
    let key = IdempotencyKey::from_request_metadata(request.metadata(), request.extensions())?;
    let first = {
        let mut calls = shared.calls.lock().unwrap();
        calls.push(Call {
            key: key.as_str().to_owned(),
            id: request.get_ref().id.clone(),
            at: Instant::now(),
        });
        calls.len() == 1
    };
    if let (true, Some(wait)) = (first, shared.slow_first) {
        tokio::time::sleep(wait).await;
    }
    if let Some(status) = shared.fail.lock().unwrap().pop_front() {
        return Err(status);
    }
    let mut response = Response::new(Receipt {
        id: request.into_inner().id,
    });
    if shared.replayed {
        let metadata = response.metadata_mut();
        metadata.insert("idempotent-replayed", "true".parse().unwrap());
    }
    Ok(response)
}

type Messages = tokio_stream::Iter<std::vec::IntoIter<Result<Receipt, Status>>>;

/// `test.Payments`: `Charge` (unary: errors go out trailers-only),
/// `ChargeStream` (server streaming: the receipt twice, or the error in the
/// trailers after the headers) and `ChargeAll` (client streaming: one charge
/// of the ids sent, joined by commas).
#[derive(Clone)]
struct Payments(Arc<Shared>);

impl NamedService for Payments {
    const NAME: &'static str = "test.Payments";
}

impl Service<http::Request<Body>> for Payments {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Receipt, Charge>::default());
            Ok(match request.uri().path() {
                "/test.Payments/Charge" => {
                    let handler = service_fn(move |r| answer(shared.clone(), r));
                    grpc.unary(handler, request).await
                }
                "/test.Payments/ChargeStream" => {
                    let handler = service_fn(move |r| {
                        let shared = shared.clone();
                        async move {
                            let messages = match answer(shared, r).await {
                                Ok(receipt) => {
                                    let receipt = receipt.into_inner();
                                    vec![Ok(receipt.clone()), Ok(receipt)]
                                }
                                Err(status) => vec![Err(status)],
                            };
                            Ok::<_, Status>(Response::new(tokio_stream::iter(messages) as Messages))
                        }
                    });
                    grpc.server_streaming(handler, request).await
                }
                "/test.Payments/ChargeAll" => {
                    let handler = service_fn(move |r: Request<tonic::Streaming<Charge>>| {
                        let shared = shared.clone();
                        async move {
                            let (metadata, extensions, mut charges) = r.into_parts();
                            let mut ids = Vec::new();
                            while let Some(charge) = charges.message().await? {
                                ids.push(charge.id);
                            }
                            let charge = Charge { id: ids.join(",") };
                            answer(shared, Request::from_parts(metadata, extensions, charge)).await
                        }
                    });
                    grpc.client_streaming(handler, request).await
                }
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let server = Server::builder()
        .add_service(Payments(shared))
        .serve_with_incoming(TcpListenerStream::new(listener));
    tokio::spawn(server);
}

async fn start(shared: Shared) -> (SocketAddr, Arc<Shared>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shared = Arc::new(shared);
    serve(listener, shared.clone());
    (addr, shared)
}

type Client = tonic::client::Grpc<IdempotentRetry<Channel>>;

fn client(addr: SocketAddr, policy: RetryPolicy) -> Client {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    tonic::client::Grpc::new(
        ServiceBuilder::new()
            .layer(IdempotentRetryLayer::new(policy))
            .service(channel),
    )
}

/// Short waits, so the tests run in milliseconds.
fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .deadline(Duration::from_secs(5))
}

fn charge_request(id: &str) -> Request<Charge> {
    Request::new(Charge { id: id.to_owned() })
}

async fn charge(
    client: &mut Client,
    request: Request<Charge>,
) -> Result<Response<Receipt>, Status> {
    client.ready().await.map_err(Status::from_error)?;
    let path = PathAndQuery::from_static("/test.Payments/Charge");
    client.unary(request, path, ProstCodec::default()).await
}

fn with_metadata(code: Code, message: &str, entries: &[(&'static str, &str)]) -> Status {
    let mut metadata = MetadataMap::new();
    for (name, value) in entries {
        metadata.insert(*name, value.parse().unwrap());
    }
    Status::with_metadata(code, message, metadata)
}

#[tokio::test]
async fn unavailable_then_ok_is_retried_with_the_same_key_and_message() {
    let (addr, shared) = start(Shared::failing([Status::unavailable("store down")])).await;
    let response = charge(&mut client(addr, fast()), charge_request("ch_1"))
        .await
        .unwrap();
    assert_eq!(response.attempts(), 2);
    assert!(!response.replayed());
    assert_eq!(response.get_ref().id, "ch_1");
    let calls = shared.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].key, calls[1].key);
    assert_eq!(calls[0].key.len(), 36, "a fresh UUID: {}", calls[0].key);
    assert!(calls.iter().all(|c| c.id == "ch_1"));
}

#[tokio::test]
async fn idems_in_progress_is_retried_after_its_pushback() {
    let in_progress = Status::from(IdemError::InProgress {
        retry_after: Duration::from_millis(300),
    });
    let (addr, shared) = start(Shared::failing([in_progress])).await;
    let response = charge(&mut client(addr, fast()), charge_request("ch_1"))
        .await
        .unwrap();
    assert_eq!(response.attempts(), 2);
    let calls = shared.calls();
    assert_eq!(calls.len(), 2);
    // The backoff alone is at most 50 ms.
    let waited = calls[1].at - calls[0].at;
    assert!(waited >= Duration::from_millis(300), "waited {waited:?}");
}

#[tokio::test]
async fn an_aborted_that_is_not_idems_in_progress_is_not_retried() {
    let (addr, shared) = start(Shared::failing([Status::aborted("transaction conflict")])).await;
    let status = charge(&mut client(addr, fast()), charge_request("ch_1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    assert_eq!(status.message(), "transaction conflict");
    assert_eq!(shared.calls().len(), 1);
}

#[tokio::test]
async fn invalid_argument_and_failed_precondition_are_not_retried() {
    for refusal in [
        Status::invalid_argument("amount must be positive"),
        Status::from(IdemError::Mismatch),
    ] {
        let code = refusal.code();
        let (addr, shared) = start(Shared::failing([refusal])).await;
        let status = charge(&mut client(addr, fast()), charge_request("ch_1"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), code);
        assert_eq!(shared.calls().len(), 1, "{code:?} was retried");
    }
    assert_eq!(
        Status::from(IdemError::Mismatch).code(),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn a_negative_pushback_is_not_retried() {
    let status = with_metadata(
        Code::Unavailable,
        "go away",
        &[("grpc-retry-pushback-ms", "-1")],
    );
    let (addr, shared) = start(Shared::failing([status])).await;
    let status = charge(&mut client(addr, fast()), charge_request("ch_1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(shared.calls().len(), 1);
}

#[tokio::test]
async fn the_attempt_limit_returns_the_last_status() {
    let fail = (1..=5).map(|n| Status::unavailable(format!("down {n}")));
    let (addr, shared) = start(Shared::failing(fail)).await;
    let status = charge(
        &mut client(addr, fast().max_attempts(3)),
        charge_request("ch_1"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "down 3");
    assert_eq!(shared.calls().len(), 3);
}

#[tokio::test]
async fn the_deadline_ends_the_call_before_a_wait_would_pass_it() {
    let busy = || {
        Status::from(IdemError::StoreBusy {
            retry_after: Duration::from_millis(200),
        })
    };
    let (addr, shared) = start(Shared::failing((0..10).map(|_| busy()))).await;
    let policy = fast().deadline(Duration::from_millis(500));
    let started = Instant::now();
    let status = charge(&mut client(addr, policy), charge_request("ch_1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let calls = shared.calls().len();
    assert!((2..=3).contains(&calls), "{calls} calls");
}

#[tokio::test]
async fn an_attempt_running_at_the_deadline_is_cut_off() {
    let (addr, shared) = start(Shared {
        slow_first: Some(Duration::from_secs(3)),
        ..Shared::default()
    })
    .await;
    let policy = fast().deadline(Duration::from_millis(400));
    let started = Instant::now();
    let status = charge(&mut client(addr, policy), charge_request("ch_1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(
        status.message().contains("same idempotency key"),
        "{}",
        status.message()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(shared.calls().len(), 1);
}

#[tokio::test]
async fn an_attempt_past_its_timeout_is_retried() {
    let (addr, shared) = start(Shared {
        slow_first: Some(Duration::from_secs(3)),
        ..Shared::default()
    })
    .await;
    let policy = fast().attempt_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let response = charge(&mut client(addr, policy), charge_request("ch_1"))
        .await
        .unwrap();
    assert_eq!(response.attempts(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let calls = shared.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].key, calls[1].key);
}

#[tokio::test]
async fn a_server_that_comes_up_late_is_reached_by_a_retry() {
    // A free port, closed again: connecting to it is refused until the server binds it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let shared = Arc::new(Shared::default());
    let late = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        serve(TcpListener::bind(addr).await.unwrap(), late);
    });
    let policy = fast().max_attempts(50);
    let started = Instant::now();
    let response = charge(&mut client(addr, policy), charge_request("ch_1"))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(response.attempts() >= 2, "{} attempts", response.attempts());
    // Only the attempt after the server came up reached it.
    assert_eq!(shared.calls().len(), 1);
}

#[tokio::test]
async fn the_callers_key_is_kept() {
    let (addr, shared) = start(Shared::failing([Status::unavailable("store down")])).await;
    let mut client = client(addr, fast());
    let key = IdempotencyKey::new("order-7").unwrap();
    charge(&mut client, grpc::with_key(charge_request("ch_1"), key))
        .await
        .unwrap();
    // A key put in the metadata by hand is kept too; a call without one gets its own.
    let mut by_hand = charge_request("ch_2");
    by_hand
        .metadata_mut()
        .insert("idempotency-key", "order-8".parse().unwrap());
    charge(&mut client, by_hand).await.unwrap();
    charge(&mut client, charge_request("ch_3")).await.unwrap();
    charge(&mut client, charge_request("ch_4")).await.unwrap();
    let keys: Vec<_> = shared.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(keys[..3], ["order-7", "order-7", "order-8"]);
    assert_ne!(keys[3], keys[4]);
    assert_eq!(keys.len(), 5);
}

#[tokio::test]
async fn a_replay_is_reported() {
    let (addr, _) = start(Shared {
        replayed: true,
        ..Shared::default()
    })
    .await;
    let response = charge(&mut client(addr, fast()), charge_request("ch_1"))
        .await
        .unwrap();
    assert!(response.replayed());
    assert_eq!(response.attempts(), 1);
}

#[tokio::test]
async fn a_pushback_past_the_deadline_gives_up_at_once() {
    let in_progress = Status::from(IdemError::InProgress {
        retry_after: Duration::from_secs(10),
    });
    let (addr, shared) = start(Shared::failing([in_progress])).await;
    let policy = fast().deadline(Duration::from_secs(2));
    let started = Instant::now();
    let status = charge(&mut client(addr, policy), charge_request("ch_1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(shared.calls().len(), 1);
}

#[tokio::test]
async fn a_status_in_trailers_is_retried_and_a_stream_still_streams() {
    let (addr, shared) = start(Shared::failing([Status::unavailable("store down")])).await;
    let mut client = client(addr, fast());
    client.ready().await.unwrap();
    let path = PathAndQuery::from_static("/test.Payments/ChargeStream");
    let response = client
        .server_streaming(charge_request("ch_1"), path, ProstCodec::default())
        .await
        .unwrap();
    assert_eq!(response.attempts(), 2);
    let mut stream = response.into_inner();
    let mut receipts: Vec<Receipt> = Vec::new();
    while let Some(receipt) = stream.message().await.unwrap() {
        receipts.push(receipt);
    }
    assert_eq!(receipts.len(), 2);
    assert!(receipts.iter().all(|r| r.id == "ch_1"));
    assert_eq!(shared.calls().len(), 2);
}

async fn charge_all<S>(client: &mut Client, charges: S) -> Result<Response<Receipt>, Status>
where
    S: tokio_stream::Stream<Item = Charge> + Send + 'static,
{
    client.ready().await.map_err(Status::from_error)?;
    let path = PathAndQuery::from_static("/test.Payments/ChargeAll");
    client
        .client_streaming(Request::new(charges), path, ProstCodec::default())
        .await
}

#[tokio::test]
async fn a_running_client_stream_is_sent_once_a_finished_one_is_retried() {
    let (addr, shared) = start(Shared::failing([
        Status::unavailable("store down"),
        Status::unavailable("store down"),
    ]))
    .await;
    let mut client = client(addr, fast());
    // Still being produced when the call starts: sent once, with its key.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for id in ["a", "b"] {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(Charge { id: id.into() }).await.unwrap();
        }
    });
    let running = tokio_stream::wrappers::ReceiverStream::new(rx);
    let status = charge_all(&mut client, running).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(shared.calls().len(), 1);

    let finished = tokio_stream::iter(["c", "d"].map(|id| Charge { id: id.into() }));
    let response = charge_all(&mut client, finished).await.unwrap();
    assert_eq!(response.attempts(), 2);
    assert_eq!(response.get_ref().id, "c,d");
    let calls = shared.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0].id, "a,b");
    assert_eq!((calls[1].id.as_str(), calls[2].id.as_str()), ("c,d", "c,d"));
    assert_eq!(calls[1].key, calls[2].key);
    assert_ne!(calls[0].key, calls[1].key);
}
