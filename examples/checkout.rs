//! The retry story, end to end, over real sockets in one process:
//!
//! ```text
//! client ──► gateway ──► order service ──► idem-client's ──► payments service
//!            (retries)   POST /checkout    gRPC retry        gRPC Charge
//!                        orders.db         layer             payments.db
//!                          │ outbox                          HTTP /payments
//!                          ▼                                 (the same store)
//!                        relay ──► notifications service
//!                        (webhook   POST /notifications
//!                         sink)     notifications.db
//! ```
//!
//! `cargo run --example checkout [-- [--json] [--keep-dbs DIR]]` (`--json`: the
//! report as one JSON document; `--keep-dbs` keeps `orders.db`,
//! `payments.db` and `notifications.db` in `DIR` for `idem inspect`)
//!
//! The order service's `POST /checkout` is an `#[idempotent(http)]` handler:
//! it charges the card with payments' gRPC `Charge`, with the derived key
//! `order_key.child(CHARGE_CARD)` (= `child_key(order_key, "charge-card.v1")`)
//! in the `idempotency-key` metadata entry and the tenant in `x-tenant-id`,
//! through idem-client's gRPC retry layer; then it records the order and
//! enqueues a notification (id `order_key.child(NOTIFY_ORDER)`) in the
//! claim's transaction. A relay delivers the outbox through the webhook sink
//! (signed per Standard Webhooks) to the notifications service, whose
//! receiver verifies the signature and records the notification under an
//! inbox claim keyed on `webhook-id`. The payments service serves its HTTP
//! API (`POST /payments`, `GET /payments`) from the same store and the same
//! `payments` table as its gRPC `Charge`, each transport under its own step.
//!
//! The gateway is a small retrying proxy: it retries once when its upstream
//! answer is lost (connection dropped) or late. Every hop that retries
//! (client, gateway, order service) does it with `idem-client`, keeping the
//! key and the body or message. Answers are really lost: a demo-only layer on
//! each service (axum middleware for HTTP, a tower layer on the gRPC server),
//! armed per key, drops the answer after the commit, holds it back, or drops
//! the call while the charge runs on.
//!
//! The demo plays the guide's retries (a client retry after a lost response, a
//! gateway retry, the gRPC layer's retry of a lost charge, a duplicate while
//! the first attempt runs, a crash after commit, a key reused with a changed
//! amount, a gRPC retry that meets the charge still running, a key claimed
//! over HTTP and retried over gRPC), then a relay crash: a relay process
//! (this program, run with `--relay-process ORDERS_DB`, its relay armed with
//! the `relay-after-publish` fault) dies after a notification is delivered
//! and before it is marked sent, and another relay delivers it again after
//! the lease. It prints every attempt in the order it started and what it
//! got, checks from the stores (the charges as payments' HTTP `GET /payments`
//! lists them) that each order was charged and notified exactly once and each
//! charge made once, and exits non-zero if not.

#[path = "services/notifications.rs"]
mod notifications;
#[path = "services/orders.rs"]
mod orders;
#[path = "services/payments.rs"]
mod payments;
#[path = "services/payments_grpc.rs"]
mod payments_grpc;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use idem::faults::FaultPoint;
use idem::http::problem::types;
use idem::outbox::{self, Backoff, Relay};
use idem::{Engine, IdempotencyKey, Policy, Problem};
use idem_client::reqwest_middleware::{self, ClientWithMiddleware};
use idem_client::{grpc, IdempotentRetry, RequestBuilderExt, ResponseExt, RetryPolicy};
use orders::{ChargeChannel, Orders, CHARGE_CARD, NOTIFY_ORDER, PLACE_ORDER};
use payments_grpc::{CardNetworkDelay, ChargeRequest, PaymentsClient};
use serde_json::json;
use sqlx::Sqlite;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::TcpIncoming;
use tonic::Code;
use tower::Service;

const TENANT: &str = "shop-1";
/// How long the gateway waits for an upstream answer.
const PROXY_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the client of the first story waits before giving up on a read.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the order service's gRPC retry layer waits for one attempt of a
/// charge.
const CHARGE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a duplicate charge waits for the attempt holding its key before
/// payments answers `ABORTED` (the payments store's `wait_timeout`).
const PAYMENTS_WAIT: Duration = Duration::from_millis(100);
/// How long a relay leases a message: after a relay dies, another one
/// delivers the message again once this has passed.
const RELAY_LEASE: Duration = Duration::from_millis(600);

/// Any error on the way to an answer.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------
// The notifications service, fed by the order service's outbox
// ---------------------------------------------------------------------------

/// The notifications service on its own SQLite file, behind `trace` (which
/// records every delivery, named by the relay's user agent).
async fn notifications_service(
    path: &std::path::Path,
    trace: &Trace,
) -> Result<(Engine<Sqlite>, String), BoxError> {
    let engine = Engine::<Sqlite>::open_sqlite(path).await?;
    let app = notifications::service(&engine)
        .await?
        .layer(middleware::from_fn_with_state(
            trace.clone(),
            trace_deliveries,
        ));
    Ok((engine, start(app).await?))
}

/// Records each webhook delivery in the trace, under its `webhook-id`.
async fn trace_deliveries(State(trace): State<Trace>, request: Request, next: Next) -> Response {
    let id = header(&request, "webhook-id").unwrap_or_default();
    let who = header(&request, "user-agent").unwrap_or_default();
    let seq = trace.start();
    let response = next.run(request).await;
    let got = match response.status().as_u16() {
        200 if response.headers().contains_key("idempotent-replayed") => Got::RecordedBefore,
        200 => Got::Recorded,
        status => Got::Other {
            answer: Answered::Status(status),
        },
    };
    trace.record(seq, &id, format!("{who} -> notifications"), got);
    response
}

/// A relay for the order service's outbox, delivering through the webhook
/// sink; `name` is its user agent, which the trace shows.
fn outbox_relay(engine: &Engine<Sqlite>, name: &str) -> Result<Relay<Sqlite>, BoxError> {
    orders::relay(
        engine,
        name,
        notifications::WEBHOOK_SECRET,
        RELAY_LEASE,
        Backoff::default(),
    )
}

/// Waits until every message of the outbox is delivered.
async fn drained(engine: &Engine<Sqlite>) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while outbox::backlog(engine.pool()).await?.pending > 0 {
        if Instant::now() > deadline {
            return Err("the outbox was not delivered within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `checkout --relay-process ORDERS_DB`: a relay process for the order
/// service's outbox that dies (`abort`) right after its first delivery is
/// acknowledged, before it marks the message sent.
async fn relay_process(orders_db: &str) -> Result<bool, BoxError> {
    let engine = Engine::<Sqlite>::open_sqlite(orders_db).await?;
    let relay = outbox_relay(&engine, "relay B")?
        .fault(Some(FaultPoint::RelayAfterPublish))
        .spawn()
        .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    relay.shutdown().await;
    Err("the relay process delivered nothing in 10 s".into())
}

// ---------------------------------------------------------------------------
// Lost answers: a demo-only layer on each service, armed per key
// ---------------------------------------------------------------------------

/// How the next answer for a key is lost.
#[derive(Clone, Copy)]
enum Loss {
    /// After the handler has committed, the connection dies without an
    /// answer, as when the process crashes right after the commit.
    Cut,
    /// After the handler has committed, the answer is held back this long (a
    /// stalled link); whoever waits less gives up.
    Stall(Duration),
    /// gRPC only: the call is dropped while the charge is still running, and
    /// the charge runs on (the card network takes this long, inside the
    /// charge's claim) as a call already made to another system does.
    CutWhileCharging(Duration),
}

/// Keys whose next answer is lost.
#[derive(Clone, Default)]
struct LinkFaults(Arc<Mutex<HashMap<String, Loss>>>);

impl LinkFaults {
    fn arm(&self, key: &str, loss: Loss) {
        self.0.lock().unwrap().insert(key.to_owned(), loss);
    }

    fn take(&self, key: &str) -> Option<Loss> {
        self.0.lock().unwrap().remove(key)
    }
}

/// The panic payload that kills a connection's task (kept out of the output).
struct ConnectionCut;

async fn lose_answers(State(faults): State<LinkFaults>, request: Request, next: Next) -> Response {
    let key = header(&request, "idempotency-key");
    let response = next.run(request).await;
    match key.and_then(|key| faults.take(&key)) {
        // axum serves each connection on its own task: this ends it, and the
        // peer sees the connection close with no answer.
        Some(Loss::Cut | Loss::CutWhileCharging(_)) => std::panic::panic_any(ConnectionCut),
        Some(Loss::Stall(delay)) => {
            tokio::time::sleep(delay).await;
            response
        }
        None => response,
    }
}

/// The gRPC server's counterpart of [`lose_answers`]: a tower layer around
/// the server's routes, armed per `idempotency-key`.
#[derive(Clone)]
struct LoseGrpcAnswers<S> {
    inner: S,
    faults: LinkFaults,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for LoseGrpcAnswers<S>
where
    S: Service<http::Request<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The service polled ready takes this call; a clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let loss =
            metadata(request.headers(), "idempotency-key").and_then(|key| self.faults.take(&key));
        match loss {
            None => Box::pin(inner.call(request)),
            // hyper serves each HTTP/2 stream on its own task: this ends it,
            // and the peer sees the stream reset with no answer.
            Some(Loss::Cut) => Box::pin(async move {
                let _committed = inner.call(request).await;
                std::panic::panic_any(ConnectionCut)
            }),
            Some(Loss::Stall(delay)) => Box::pin(async move {
                let response = inner.call(request).await;
                tokio::time::sleep(delay).await;
                response
            }),
            Some(Loss::CutWhileCharging(delay)) => {
                request.extensions_mut().insert(CardNetworkDelay(delay));
                // The charge runs on its own task, which outlives the call.
                let charging = tokio::spawn(inner.call(request));
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    drop(charging);
                    std::panic::panic_any(ConnectionCut)
                })
            }
        }
    }
}

/// Serves `routes` (gRPC) on an ephemeral loopback port behind
/// [`LoseGrpcAnswers`]; its `http://` URL.
async fn start_grpc(
    routes: tonic::service::Routes,
    faults: &LinkFaults,
) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let faults = faults.clone();
    let server = tonic::transport::Server::builder()
        .layer(tower::layer::layer_fn(move |inner| LoseGrpcAnswers {
            inner,
            faults: faults.clone(),
        }))
        .add_routes(routes)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(async move {
        let _ = server.await;
    });
    Ok(base)
}

/// A metadata entry (or header) as text, a structured-field string unquoted.
fn metadata(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
}

fn header(request: &Request, name: &str) -> Option<String> {
    metadata(request.headers(), name)
}

// ---------------------------------------------------------------------------
// The trace: every attempt, by whom, in the order it started
// ---------------------------------------------------------------------------

struct Event {
    seq: u64,
    /// The idempotency key the attempt carried.
    key: String,
    who: String,
    got: Got,
}

/// What one attempt got: a line of the table, a value of `--json`. An HTTP
/// answer has a `status`, a gRPC one a `code` (as gRPC spells it).
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "got", rename_all = "snake_case")]
enum Got {
    /// The work ran and answered `status` (HTTP) or `code` (gRPC).
    Executed {
        #[serde(flatten)]
        answer: Answered,
    },
    /// The stored answer, replayed.
    Replayed {
        #[serde(flatten)]
        answer: Answered,
    },
    /// 409: another attempt holds the key; come back after `retry_after` seconds.
    InProgress { retry_after: String },
    /// gRPC `ABORTED`, idem's in-progress answer: another attempt holds the
    /// key; come back after `pushback_ms` (`grpc-retry-pushback-ms`).
    Aborted { pushback_ms: String },
    /// 422 (HTTP) or `FAILED_PRECONDITION` (gRPC): the key was used before
    /// with another request.
    KeyReused {
        #[serde(flatten)]
        answer: Answered,
    },
    /// The notifications inbox recorded a delivery.
    Recorded,
    /// The notifications inbox answered a redelivery from its record.
    RecordedBefore,
    /// Any other answer.
    Other {
        #[serde(flatten)]
        answer: Answered,
    },
    /// No answer came back: the connection dropped (the HTTP/2 stream was
    /// reset, for a gRPC call), or none came within `timeout_ms`.
    NoAnswer {
        timeout_ms: Option<u128>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        stream_reset: bool,
        then: Then,
    },
    /// The relay process died where the demo made it die.
    ProcessDied,
    /// The relay process exited instead of dying.
    Exited { code: i32 },
}

/// An answer's status: an HTTP status or a gRPC code.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Answered {
    Status(u16),
    Code(&'static str),
}

impl std::fmt::Display for Answered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answered::Status(status) => write!(f, "{status}"),
            Answered::Code(code) => f.write_str(code),
        }
    }
}

/// What the caller did after an attempt got no answer.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Then {
    /// The caller sends the same request again, with the same key.
    Retries,
    /// A proxy retried once, then answered 502.
    GivesUp,
    /// The client stopped waiting for this attempt.
    ClientGaveUp,
}

impl std::fmt::Display for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Executed { answer } => write!(f, "{answer} executed"),
            Got::Replayed { answer } => write!(f, "{answer} replayed"),
            Got::InProgress { retry_after } => {
                write!(f, "409 in progress, Retry-After {retry_after}")
            }
            Got::Aborted { pushback_ms } => {
                write!(f, "ABORTED in progress, pushback {pushback_ms} ms")
            }
            Got::KeyReused { answer } => write!(f, "{answer} key reused with a different request"),
            Got::Recorded => f.write_str("200 recorded"),
            Got::RecordedBefore => f.write_str("200 replayed: recorded before"),
            Got::Other {
                answer: Answered::Status(status),
            } => {
                let reason = StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("");
                write!(f, "{status} {reason}")
            }
            Got::Other { answer } => write!(f, "{answer}"),
            Got::NoAnswer {
                timeout_ms,
                stream_reset,
                then,
            } => {
                match timeout_ms {
                    Some(ms) => write!(f, "no answer within {ms}ms")?,
                    None if *stream_reset => f.write_str("no answer: stream reset")?,
                    None => f.write_str("no answer: connection dropped")?,
                }
                match then {
                    Then::Retries => f.write_str(" -> retries"),
                    Then::GivesUp => f.write_str(" -> gives up: 502"),
                    Then::ClientGaveUp => f.write_str(": client gave up"),
                }
            }
            Got::ProcessDied => f.write_str("process died after the 200, before marking sent"),
            Got::Exited { code } => write!(f, "exited {code} without dying"),
        }
    }
}

#[derive(Clone, Default)]
struct Trace {
    next: Arc<AtomicU64>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Trace {
    /// Numbers an attempt as it starts: the table lists attempts in this order.
    fn start(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Records what the attempt numbered `seq` got.
    fn record(&self, seq: u64, key: &str, who: String, got: Got) {
        self.events.lock().unwrap().push(Event {
            seq,
            key: key.to_owned(),
            who,
            got,
        });
    }

    fn for_keys(&self, keys: &[&str]) -> Vec<(String, Got)> {
        let mut events: Vec<(u64, String, Got)> = self
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| keys.contains(&e.key.as_str()))
            .map(|e| (e.seq, e.who.clone(), e.got.clone()))
            .collect();
        events.sort_by_key(|e| e.0);
        events.into_iter().map(|(_, who, got)| (who, got)).collect()
    }
}

/// Names a logical call's attempts in the trace: a request extension read by
/// [`TraceAttempts`].
#[derive(Clone)]
struct Traced {
    /// The key the call carries.
    key: String,
    /// The name of each attempt; attempts past the list repeat its last name.
    names: Arc<Vec<String>>,
    /// How a lost answer reads in the table, by attempt number.
    no_answer: fn(u32, &reqwest_middleware::Error) -> Got,
    attempts: Arc<AtomicU32>,
}

impl Traced {
    fn new(
        key: &str,
        names: &[&str],
        no_answer: fn(u32, &reqwest_middleware::Error) -> Got,
    ) -> Self {
        Self {
            key: key.to_owned(),
            names: Arc::new(names.iter().map(|n| n.to_string()).collect()),
            no_answer,
            attempts: Arc::default(),
        }
    }
}

/// Records each attempt of a retrying client in the trace. It sits below
/// [`IdempotentRetry`] in the client's middleware, so it sees every attempt.
struct TraceAttempts(Trace);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for TraceAttempts {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut axum::http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let Some(traced) = extensions.get::<Traced>().cloned() else {
            return next.run(request, extensions).await;
        };
        let attempt = traced.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let who = traced.names[(attempt as usize - 1).min(traced.names.len() - 1)].clone();
        let seq = self.0.start();
        let result = next.run(request, extensions).await;
        let got = match &result {
            Ok(response) => describe(response),
            Err(error) => (traced.no_answer)(attempt, error),
        };
        self.0.record(seq, &traced.key, who, got);
        result
    }
}

/// A client whose calls retry by `policy`, each attempt traced.
fn traced_client(policy: RetryPolicy, trace: &Trace) -> ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(IdempotentRetry::new(policy))
        .with(TraceAttempts(trace.clone()))
        .build()
}

// ---------------------------------------------------------------------------
// The gRPC hop's attempts
// ---------------------------------------------------------------------------

/// Records each attempt of a gRPC call in the trace, as `hop #n` (the key's
/// n-th attempt through this hop). It sits below idem-client's
/// [`grpc::IdempotentRetryLayer`], so it sees every attempt; an attempt the
/// layer stops waiting for (past [`CHARGE_ATTEMPT_TIMEOUT`]) is recorded
/// when the layer drops it.
#[derive(Clone)]
struct TraceGrpcAttempts<S> {
    inner: S,
    hop: &'static str,
    trace: Trace,
    attempts: Arc<Mutex<HashMap<String, u32>>>,
}

impl<S> TraceGrpcAttempts<S> {
    fn new(inner: S, hop: &'static str, trace: &Trace) -> Self {
        Self {
            inner,
            hop,
            trace: trace.clone(),
            attempts: Arc::default(),
        }
    }
}

impl<S> Service<http::Request<Body>> for TraceGrpcAttempts<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let key = metadata(request.headers(), "idempotency-key").unwrap_or_default();
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap();
            let attempt = attempts.entry(key.clone()).or_default();
            *attempt += 1;
            *attempt
        };
        let mut pending = PendingAttempt {
            seq: self.trace.start(),
            trace: self.trace.clone(),
            key,
            who: format!("{} #{attempt}", self.hop),
            done: false,
        };
        Box::pin(async move {
            let result = inner.call(request).await.map_err(Into::into);
            pending.record(match &result {
                Ok(response) => describe_grpc(response),
                // The server's stream was reset (HTTP/2 `RST_STREAM`): no answer.
                Err(_) => Got::NoAnswer {
                    timeout_ms: None,
                    stream_reset: true,
                    then: Then::Retries,
                },
            });
            result
        })
    }
}

/// An attempt in flight: recorded with what it got, or, if it is dropped
/// first, as cut off at its timeout.
struct PendingAttempt {
    seq: u64,
    trace: Trace,
    key: String,
    who: String,
    done: bool,
}

impl PendingAttempt {
    fn record(&mut self, got: Got) {
        self.done = true;
        self.trace
            .record(self.seq, &self.key, std::mem::take(&mut self.who), got);
    }
}

impl Drop for PendingAttempt {
    fn drop(&mut self) {
        if !self.done {
            self.record(Got::NoAnswer {
                timeout_ms: Some(CHARGE_ATTEMPT_TIMEOUT.as_millis()),
                stream_reset: false,
                then: Then::Retries,
            });
        }
    }
}

/// What a gRPC answer means, from its headers: a status there is a
/// trailers-only answer (how idem and tonic send a status); without one, a
/// reply message follows.
fn describe_grpc(response: &http::Response<Body>) -> Got {
    let headers = response.headers();
    let Some(code) = headers
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()))
    else {
        let answer = Answered::Code("OK");
        return if metadata(headers, "idempotent-replayed").as_deref() == Some("true") {
            Got::Replayed { answer }
        } else {
            Got::Executed { answer }
        };
    };
    let problem = metadata(headers, "idempotency-problem").unwrap_or_default();
    match code {
        Code::Aborted if problem == types::IN_PROGRESS => Got::Aborted {
            pushback_ms: metadata(headers, "grpc-retry-pushback-ms").unwrap_or("?".into()),
        },
        Code::FailedPrecondition if problem == types::KEY_REUSED => Got::KeyReused {
            answer: Answered::Code("FAILED_PRECONDITION"),
        },
        code => Got::Other {
            answer: Answered::Code(code_name(code)),
        },
    }
}

/// A gRPC code as the specification spells it.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A payments client on the gRPC server at `url`, through idem-client's
/// retry layer (by `policy`), its attempts traced as `hop #n`.
fn traced_payments(
    url: &str,
    hop: &'static str,
    policy: RetryPolicy,
    trace: &Trace,
) -> Result<PaymentsClient<ChargeChannel>, BoxError> {
    let channel = TraceGrpcAttempts::new(orders::lazy_channel(url)?, hop, trace);
    Ok(orders::payments_client(channel, policy))
}

// ---------------------------------------------------------------------------
// The gateway: a retrying proxy
// ---------------------------------------------------------------------------

/// Forwards every request to `upstream`; when the answer is lost (the
/// connection drops) or late (past `timeout`), sends the same request, with
/// the same key, once more.
#[derive(Clone)]
struct RetryingProxy {
    /// `gateway -> orders`: how the trace names the hop.
    hop: &'static str,
    upstream: String,
    http: ClientWithMiddleware,
}

impl RetryingProxy {
    fn new(hop: &'static str, upstream: String, trace: &Trace) -> Self {
        let policy = RetryPolicy::default()
            .max_attempts(2)
            .attempt_timeout(PROXY_TIMEOUT)
            .backoff(Duration::from_millis(5), Duration::from_millis(20));
        Self {
            hop,
            upstream,
            http: traced_client(policy, trace),
        }
    }

    fn router(self) -> Router {
        Router::new().fallback(forward).with_state(self)
    }
}

/// How a proxy's lost answer reads: it retries once, then gives up.
fn proxy_no_answer(attempt: u32, error: &reqwest_middleware::Error) -> Got {
    let then = if attempt == 1 {
        Then::Retries
    } else {
        Then::GivesUp
    };
    no_answer(error, PROXY_TIMEOUT, then)
}

fn no_answer(error: &reqwest_middleware::Error, timeout: Duration, then: Then) -> Got {
    Got::NoAnswer {
        timeout_ms: error.is_timeout().then_some(timeout.as_millis()),
        stream_reset: false,
        then,
    }
}

async fn forward(State(proxy): State<RetryingProxy>, request: Request) -> Response {
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|value| idem::http::parse_header_value(value).ok());
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 1 << 20).await else {
        return Problem::new(400, "Unreadable body").into_response();
    };
    let url = format!(
        "{}{}",
        proxy.upstream,
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let names = [format!("{} #1", proxy.hop), format!("{} #2", proxy.hop)];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let key_text = key.as_ref().map(|k| k.as_str()).unwrap_or_default();
    let mut upstream = proxy
        .http
        .request(parts.method.clone(), &url)
        .with_extension(Traced::new(key_text, &names, proxy_no_answer))
        .body(body.to_vec());
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "idempotency-key"
        ) {
            upstream = upstream.header(name, value);
        }
    }
    if let Some(key) = key {
        upstream = upstream.idempotency_key(key);
    }
    match upstream.send().await {
        Ok(reply) => relay(reply).await,
        Err(_) => Problem::new(502, "Upstream lost")
            .with_detail("The upstream answer was lost twice; retry with the same Idempotency-Key.")
            .into_response(),
    }
}

/// The upstream's answer, passed on as it came.
async fn relay(reply: reqwest::Response) -> Response {
    let status = StatusCode::from_u16(reply.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = reply.headers().clone();
    let body = reply.bytes().await.unwrap_or_default();
    let mut response = (status, body.to_vec()).into_response();
    for (name, value) in &headers {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response.headers_mut().insert(
                HeaderName::from(name),
                HeaderValue::from_bytes(value.as_bytes()).expect("a valid header value"),
            );
        }
    }
    response
}

/// What an HTTP answer means.
fn describe(reply: &reqwest::Response) -> Got {
    match reply.status().as_u16() {
        status @ 200..300 if reply.replayed() => Got::Replayed {
            answer: Answered::Status(status),
        },
        status @ 200..300 => Got::Executed {
            answer: Answered::Status(status),
        },
        409 => Got::InProgress {
            retry_after: reply
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_owned(),
        },
        422 => Got::KeyReused {
            answer: Answered::Status(422),
        },
        status => Got::Other {
            answer: Answered::Status(status),
        },
    }
}

// ---------------------------------------------------------------------------
// The story
// ---------------------------------------------------------------------------

async fn start(app: Router) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(base)
}

struct Demo {
    /// The client: retries a lost answer, a 5xx or an in-progress 409 with the same key.
    http: ClientWithMiddleware,
    /// The client of the first story: gives up on an attempt after [`CLIENT_TIMEOUT`].
    impatient: ClientWithMiddleware,
    /// A back office's gRPC client of payments, through idem-client's retry layer.
    back_office: PaymentsClient<ChargeChannel>,
    orders_url: String,
    gateway_url: String,
    payments_url: String,
}

impl Demo {
    /// One logical `POST /checkout` at `base`, its attempts traced as `names`.
    async fn checkout(
        &self,
        names: &[&str],
        base: &str,
        key: &str,
        order_ref: &str,
        amount_cents: i64,
    ) -> Result<reqwest::Response, BoxError> {
        let body = json!({"order_ref": order_ref, "amount_cents": amount_cents, "currency": "EUR"});
        Ok(self
            .http
            .post(format!("{base}/checkout"))
            .idempotency_key(IdempotencyKey::new(key)?)
            .with_extension(Traced::new(key, names, client_no_answer))
            .header("x-tenant-id", TENANT)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?)
    }

    /// Like [`Demo::checkout`] at the order service, but each attempt stops
    /// reading after [`CLIENT_TIMEOUT`].
    async fn checkout_impatient(
        &self,
        names: &[&str],
        key: &str,
        order_ref: &str,
        amount_cents: i64,
    ) -> Result<reqwest::Response, BoxError> {
        let body = json!({"order_ref": order_ref, "amount_cents": amount_cents, "currency": "EUR"});
        Ok(self
            .impatient
            .post(format!("{}/checkout", self.orders_url))
            .idempotency_key(IdempotencyKey::new(key)?)
            .with_extension(Traced::new(key, names, client_no_answer))
            .header("x-tenant-id", TENANT)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?)
    }
}

impl Demo {
    /// One charge straight to payments' HTTP `POST /payments`.
    async fn charge_over_http(
        &self,
        names: &[&str],
        key: &str,
        destination: &str,
        amount_cents: i64,
    ) -> Result<reqwest::Response, BoxError> {
        let body =
            json!({"amount_cents": amount_cents, "currency": "EUR", "destination": destination});
        Ok(self
            .http
            .post(format!("{}/payments", self.payments_url))
            .idempotency_key(IdempotencyKey::new(key)?)
            .with_extension(Traced::new(key, names, client_no_answer))
            .header("x-tenant-id", TENANT)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?)
    }

    /// The same charge through payments' gRPC `Charge`: its answer or status.
    async fn charge_over_grpc(
        &self,
        key: &str,
        destination: &str,
        amount_cents: i64,
    ) -> Result<(), BoxError> {
        let mut charge = grpc::with_key(
            tonic::Request::new(ChargeRequest {
                amount_cents,
                currency: "EUR".into(),
                destination: destination.into(),
                ..ChargeRequest::default()
            }),
            IdempotencyKey::new(key)?,
        );
        charge.metadata_mut().insert("x-tenant-id", TENANT.parse()?);
        // The answer is in the trace; a status is an answer too.
        let _ = self.back_office.clone().charge(charge).await;
        Ok(())
    }
}

/// How a lost answer reads for the client, whose retries are its own rows.
fn client_no_answer(_attempt: u32, error: &reqwest_middleware::Error) -> Got {
    let then = if error.is_timeout() {
        Then::ClientGaveUp
    } else {
        Then::Retries
    };
    no_answer(error, CLIENT_TIMEOUT, then)
}

/// Where the demo's two SQLite files live.
enum StoreDir {
    /// Removed when the demo ends.
    Temporary(tempfile::TempDir),
    /// Kept for inspection (`--keep-dbs DIR`).
    Kept(std::path::PathBuf),
}

impl StoreDir {
    fn path(&self) -> &std::path::Path {
        match self {
            StoreDir::Temporary(dir) => dir.path(),
            StoreDir::Kept(dir) => dir,
        }
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
    let started = Instant::now();
    // A cut connection is a panic on purpose; keep its message out of the table.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<ConnectionCut>().is_none() {
            default_hook(info);
        }
    }));

    // `--keep-dbs DIR`: keep orders.db, payments.db and notifications.db in
    // DIR (for `idem inspect`). `--json`: the report as one JSON document.
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let json_report = args.iter().any(|arg| arg == "--json");
    args.retain(|arg| arg != "--json");
    let say = |line: String| {
        if !json_report {
            println!("{line}");
        }
    };
    let dir = match args.as_slice() {
        [] => StoreDir::Temporary(tempfile::tempdir()?),
        [flag, db] if flag == "--relay-process" => return relay_process(db).await,
        [flag, dir] if flag == "--keep-dbs" => {
            std::fs::create_dir_all(dir)?;
            for file in ["orders.db", "payments.db", "notifications.db"] {
                let _ = std::fs::remove_file(std::path::Path::new(dir).join(file));
            }
            StoreDir::Kept(dir.into())
        }
        _ => return Err("usage: checkout [--json] [--keep-dbs DIR]".into()),
    };
    let trace = Trace::default();

    // payments: migrates, validates the step registry, serves gRPC (with the
    // layer that loses answers) and its HTTP API, both from one store.
    let payments_db = dir.path().join("payments.db");
    let payments_store = payments::Store::open_with(
        Some(&payments_db.display().to_string()),
        Policy::default().with_wait_timeout(PAYMENTS_WAIT),
    )
    .await?;
    let payments_faults = LinkFaults::default();
    let payments_grpc_url =
        start_grpc(payments_grpc::routes(&payments_store), &payments_faults).await?;
    let payments_url = start(payments_store.router(payments::Config::default())).await?;

    // notifications: a webhook receiver over an inbox, on its own SQLite file.
    let (notifications_engine, notifications_url) =
        notifications_service(&dir.path().join("notifications.db"), &trace).await?;

    // orders: the same start-up, then the gateway in front of it, and the
    // relay delivering its outbox to notifications. It charges over gRPC,
    // retrying a lost or late answer and idem's in-progress `ABORTED`.
    let orders_db = dir.path().join("orders.db");
    let orders_engine = Engine::<Sqlite>::open_sqlite(&orders_db).await?;
    orders::prepare(&orders_engine).await?;
    let orders_faults = LinkFaults::default();
    // The whole call stays inside the order's 2 s claim lock.
    let charge_policy = RetryPolicy::default()
        .max_attempts(4)
        .deadline(Duration::from_millis(1500))
        .attempt_timeout(CHARGE_ATTEMPT_TIMEOUT)
        .backoff(Duration::from_millis(10), Duration::from_millis(50));
    let orders_app = orders::router(Orders {
        engine: orders_engine.clone(),
        payments: traced_payments(
            &payments_grpc_url,
            "orders -> payments",
            charge_policy.clone(),
            &trace,
        )?,
        notifications_url: notifications_url.clone(),
    })
    .layer(middleware::from_fn_with_state(
        orders_faults.clone(),
        lose_answers,
    ));
    let orders_url = start(orders_app).await?;
    let gateway_url =
        start(RetryingProxy::new("gateway -> orders", orders_url.clone(), &trace).router()).await?;
    let first_relay = outbox_relay(&orders_engine, "relay")?.spawn().await?;

    say(format!(
        "client --> gateway  {gateway_url}   retries once on a lost or late answer"
    ));
    say(format!("       --> orders   {orders_url}   POST /checkout, #[idempotent(http)], step {PLACE_ORDER}, SQLite"));
    say(format!(
        "orders --> payments {payments_grpc_url}   gRPC Charge, #[idempotent(grpc)], step {CHARGE_CARD}, through idem-client's gRPC retry layer"
    ));
    say(format!(
        "           payments {payments_url}   HTTP POST and GET /payments, #[idempotent(http)], step {}: the same SQLite file and payments table",
        payments::CREATE_PAYMENT
    ));
    say(format!("orders --> outbox --> relay --> notifications {notifications_url}   Standard Webhooks, inbox keyed on webhook-id, SQLite"));
    say(format!("the charge's key: order key .child({CHARGE_CARD}) = child_key(order key, \"{CHARGE_CARD}\"), in the idempotency-key metadata entry"));
    say(format!("the notification's id: order key .child({NOTIFY_ORDER}), enqueued in the order's transaction\n"));

    let demo = Demo {
        http: traced_client(RetryPolicy::default(), &trace),
        impatient: traced_client(
            RetryPolicy::default().attempt_timeout(CLIENT_TIMEOUT),
            &trace,
        ),
        back_office: traced_payments(
            &payments_grpc_url,
            "back office -> gRPC",
            charge_policy,
            &trace,
        )?,
        orders_url: orders_url.clone(),
        gateway_url: gateway_url.clone(),
        payments_url: payments_url.clone(),
    };
    let (orders, gateway) = (&demo.orders_url, &demo.gateway_url);
    let mut story: Vec<Planned> = Vec::new();

    // 1. The answer stalls on the way back; the client stops waiting and
    //    retries with the same key.
    let key = "key-ord-1001";
    story.push(Planned::order(
        "client retry after a lost response",
        "ord-1001",
        key,
    ));
    orders_faults.arm(key, Loss::Stall(Duration::from_secs(2)));
    let retries = ["client #1 -> orders", "client #2 -> orders"];
    demo.checkout_impatient(&retries, key, "ord-1001", 2500)
        .await?;

    // 2. The order service's answer to the gateway is lost (the connection
    //    drops after the commit); the gateway retries on its own.
    let key = "key-ord-1002";
    story.push(Planned::order("gateway retry", "ord-1002", key));
    orders_faults.arm(key, Loss::Cut);
    demo.checkout(&["client #1 -> gateway"], gateway, key, "ord-1002", 1800)
        .await?;

    // 3. Payments' gRPC answer is lost (the stream is reset after the
    //    commit); the order service's retry layer sends the charge again
    //    with the same derived key.
    let key = "key-ord-1003";
    story.push(Planned::order(
        "gRPC retry of a lost charge",
        "ord-1003",
        key,
    ));
    let charge_key = IdempotencyKey::new(key)?.child(CHARGE_CARD);
    payments_faults.arm(charge_key.as_str(), Loss::Cut);
    demo.checkout(&["client #1 -> gateway"], gateway, key, "ord-1003", 4200)
        .await?;

    // 4. A double click: the second attempt arrives while the first is still
    //    charging (payments answers slowly), gets 409, waits the Retry-After
    //    it was told, and retries.
    let key = "key-ord-1004";
    story.push(Planned::order(
        "duplicate while the first runs",
        "ord-1004",
        key,
    ));
    let charge_key = IdempotencyKey::new(key)?.child(CHARGE_CARD);
    payments_faults.arm(charge_key.as_str(), Loss::Stall(Duration::from_millis(400)));
    // 5. The gRPC call is dropped while payments is still charging (the card
    //    network is slow); the retry layer's next attempt meets the charge
    //    still running, gets idem's ABORTED with a pushback, waits it, and
    //    gets the charge's reply. It runs while the double click's client
    //    waits its Retry-After, once the first checkout has its charge.
    let slow_key = "key-ord-1005";
    story.push(Planned::order(
        "gRPC retry while the charge runs",
        "ord-1005",
        slow_key,
    ));
    let slow_charge_key = IdempotencyKey::new(slow_key)?.child(CHARGE_CARD);
    let first_then_slow = async {
        demo.checkout(&["client #1 -> orders"], orders, key, "ord-1004", 990)
            .await?;
        payments_faults.arm(
            slow_charge_key.as_str(),
            Loss::CutWhileCharging(Duration::from_millis(400)),
        );
        demo.checkout(&["client #1 -> orders"], orders, slow_key, "ord-1005", 2900)
            .await
    };
    let second = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let retries = ["client #2 -> orders", "client #2 retry -> orders"];
        demo.checkout(&retries, orders, key, "ord-1004", 990).await
    };
    let (a, b) = tokio::join!(first_then_slow, second);
    a?;
    b?;

    // 6. The order service commits, then its connection to the client dies
    //    before the answer leaves; the client retries later.
    let key = "key-ord-1006";
    story.push(Planned::order("crash after commit", "ord-1006", key));
    orders_faults.arm(key, Loss::Cut);
    let retries = ["client #1 -> orders", "client #2 -> orders"];
    demo.checkout(&retries, orders, key, "ord-1006", 3100)
        .await?;

    // 7. A buggy client reuses a key for a different amount.
    let key = "key-ord-1007";
    story.push(Planned::order(
        "key reused with a changed amount",
        "ord-1007",
        key,
    ));
    demo.checkout(&["client #1 -> gateway"], gateway, key, "ord-1007", 5000)
        .await?;
    demo.checkout(&["client #2 -> gateway"], gateway, key, "ord-1007", 7500)
        .await?;

    // 8. One store, two transports: a back office charges over HTTP, then
    //    retries that charge over gRPC with the same key. The key is taken,
    //    by the HTTP request under its own step: the gRPC attempt is refused
    //    and charges nothing; the retry over HTTP gets the replay.
    let key = "key-pay-2001";
    let destination = "merchant/back-office-2001";
    story.push(Planned {
        name: "HTTP charge retried over gRPC",
        order: None,
        key,
        destination: destination.to_owned(),
    });
    demo.charge_over_http(&["back office -> HTTP"], key, destination, 650)
        .await?;
    demo.charge_over_grpc(key, destination, 650).await?;
    demo.charge_over_http(&["back office retry -> HTTP"], key, destination, 650)
        .await?;

    // 9. The first relay stops; relay B, in a process of its own, delivers an
    //    order's notification, then the process dies before marking it sent.
    //    Once B's lease has passed, relay C delivers it again and the
    //    notifications inbox answers from its record.
    drained(&orders_engine).await?;
    first_relay.shutdown().await;
    let key = "key-ord-1008";
    story.push(Planned::order(
        "relay crash after delivery",
        "ord-1008",
        key,
    ));
    demo.checkout(&["client #1 -> orders"], orders, key, "ord-1008", 1200)
        .await?;
    let notification = IdempotencyKey::new(key)?.child(NOTIFY_ORDER);
    let crashed = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::process::Command::new(std::env::current_exe()?)
            .arg("--relay-process")
            .arg(&orders_db)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status(),
    )
    .await??;
    let seq = trace.start();
    trace.record(
        seq,
        notification.as_str(),
        "relay B".to_owned(),
        match crashed.code() {
            None => Got::ProcessDied,
            Some(code) => Got::Exited { code },
        },
    );
    let second_relay = outbox_relay(&orders_engine, "relay C")?.spawn().await?;
    drained(&orders_engine).await?;
    second_relay.shutdown().await;

    // Side effects, per service. The charges are read as payments' HTTP API
    // lists them: those made over gRPC are in the same table.
    let charges: serde_json::Value = demo
        .http
        .get(format!("{payments_url}/payments"))
        .header("x-tenant-id", TENANT)
        .send()
        .await?
        .json()
        .await?;
    let charges = charges["payments"].as_array().cloned().unwrap_or_default();
    let placed: Vec<(String, String)> = sqlx::query_as("SELECT order_id, payment_id FROM orders")
        .fetch_all(orders_engine.pool())
        .await?;

    let notified: Vec<(String,)> = sqlx::query_as("SELECT order_id FROM notifications")
        .fetch_all(notifications_engine.pool())
        .await?;

    let mut stories = Vec::new();
    for planned in &story {
        let key = IdempotencyKey::new(planned.key)?;
        let (charge, notification) = (key.child(CHARGE_CARD), key.child(NOTIFY_ORDER));
        let charged: Vec<&serde_json::Value> = charges
            .iter()
            .filter(|c| c["destination"] == planned.destination.as_str())
            .collect();
        let order = planned.order;
        stories.push(Story {
            name: planned.name,
            order,
            key: planned.key,
            attempts: trace
                .for_keys(&[planned.key, charge.as_str(), notification.as_str()])
                .into_iter()
                .map(|(who, got)| Attempt { who, got })
                .collect(),
            orders: placed
                .iter()
                .filter(|(id, _)| Some(id.as_str()) == order)
                .count(),
            charges: charged.len(),
            notifications: notified
                .iter()
                .filter(|(id,)| Some(id.as_str()) == order)
                .count(),
            // The order's payment is the charge the listing shows.
            paid_by_its_charge: order.is_none_or(|order| {
                placed.iter().any(|(id, payment)| {
                    id == order && charged.iter().any(|c| c["payment_id"] == payment.as_str())
                })
            }),
        });
    }
    let ordered = story.iter().filter(|s| s.order.is_some()).count();
    let report = Report {
        once_per_order: stories.iter().all(Story::once)
            && charges.len() == story.len()
            && placed.len() == ordered
            && notified.len() == ordered,
        orders: placed.len(),
        charges: charges.len(),
        notifications: notified.len(),
        stories,
        millis: started.elapsed().as_millis(),
    };
    if json_report {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(report.once_per_order)
}

/// A logical operation of the story, before its outcome is read.
struct Planned {
    name: &'static str,
    /// The order it places; `None` for a charge made without an order.
    order: Option<&'static str>,
    key: &'static str,
    /// The charge's destination, by which the payments listing is searched.
    destination: String,
}

impl Planned {
    /// A checkout of `order`, whose charge goes to `merchant/<order>`.
    fn order(name: &'static str, order: &'static str, key: &'static str) -> Self {
        Self {
            name,
            order: Some(order),
            key,
            destination: format!("merchant/{order}"),
        }
    }
}

/// What the demo found: every attempt and every side effect, per story.
#[derive(serde::Serialize)]
struct Report<'a> {
    stories: Vec<Story<'a>>,
    orders: usize,
    /// As payments' HTTP `GET /payments` lists them, gRPC charges included.
    charges: usize,
    notifications: usize,
    /// One charge per story, and one order and one notification per story
    /// that places an order, and nothing else.
    once_per_order: bool,
    millis: u128,
}

/// One logical operation: its attempts in the order they started, and what
/// it left in each service's store.
#[derive(serde::Serialize)]
struct Story<'a> {
    name: &'a str,
    /// The order it places (`null`: a charge without an order).
    order: Option<&'a str>,
    key: &'a str,
    attempts: Vec<Attempt>,
    orders: usize,
    charges: usize,
    notifications: usize,
    /// The order records the payment id of the charge payments lists (true
    /// without an order).
    paid_by_its_charge: bool,
}

impl Story<'_> {
    fn once(&self) -> bool {
        let placed = usize::from(self.order.is_some());
        self.orders == placed
            && self.charges == 1
            && self.notifications == placed
            && self.paid_by_its_charge
    }
}

#[derive(serde::Serialize)]
struct Attempt {
    who: String,
    #[serde(flatten)]
    got: Got,
}

impl Report<'_> {
    /// The report as a table.
    fn print(&self) {
        const WIDTH: usize = 104;
        println!("{:<34} {:<26} got", "logical operation", "attempt");
        println!("{}", "-".repeat(WIDTH));
        for story in &self.stories {
            for (i, Attempt { who, got }) in story.attempts.iter().enumerate() {
                let label = match i {
                    0 => story.name.to_string(),
                    1 => match story.order {
                        Some(order) => format!("  {order}, key {}", story.key),
                        None => format!("  no order, key {}", story.key),
                    },
                    _ => String::new(),
                };
                let who = if who.starts_with("client") || who.starts_with("back office") {
                    who.clone()
                } else {
                    format!("  {who}")
                };
                println!("{label:<34} {who:<26} {got}");
            }
            println!(
                "{:<34} {:<26} orders {}, charges {}, notifications {}  [{}]",
                "",
                "  side effects",
                story.orders,
                story.charges,
                story.notifications,
                if story.once() { "ok" } else { "WRONG" }
            );
            println!();
        }
        println!("{}", "-".repeat(WIDTH));
        println!(
            "order service: {} orders | payments service: {} charges (its HTTP listing, gRPC charges included) | notifications service: {} notifications | {} logical operations, one charge each, one order and one notification per order: {} ({} ms)",
            self.orders,
            self.charges,
            self.notifications,
            self.stories.len(),
            if self.once_per_order { "yes" } else { "NO" },
            self.millis
        );
    }
}
