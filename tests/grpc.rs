//! `#[idempotent(grpc)]` through real sockets, on SQLite and Postgres: the
//! example's payments service (`examples/services/payments_grpc.rs`) for the
//! protocol, and a service of this file whose charge waits on a gate for
//! deadlines, stored codes and kept metadata.

#[path = "../examples/services/payments.rs"]
mod payments;
#[path = "../examples/services/payments_grpc.rs"]
mod payments_grpc;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::grpc::HasEngine;
use idem::http::{HeaderScope, XTenantId};
use idem::{
    idempotent, Backend, Claim, ClaimMode, Engine, IdempotencyKey, Operation, Policy, Scope,
};
use idem_test_support::{on_each_store, Harness, TestBackend};
use payments::Ledger;
use payments_grpc::{
    ChargeReply, ChargeRequest, GrpcPayments, Payments, PaymentsClient, PaymentsServer,
    RefundReply, RefundRequest, CHARGE_CARD,
};
use tokio::sync::Semaphore;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};

fn test_policy() -> Policy {
    Policy::default().with_wait_timeout(Duration::from_secs(2))
}

/// A fresh store with idem's tables and the `payments` table.
async fn store<DB: TestBackend + Ledger>() -> Harness<DB> {
    let db = DB::test_db().await;
    let policy = test_policy();
    let engine = Engine::new(DB::pool(db.url(), &policy).await).with_policy(policy);
    engine.migrate().await.unwrap();
    DB::create_table(engine.pool()).await.unwrap();
    Harness { engine, db }
}

/// Serves `service` on an ephemeral loopback port; a client connected to it.
async fn serve<S: Payments>(service: S) -> PaymentsClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        Server::builder()
            .add_service(PaymentsServer::new(service))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    PaymentsClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap())
}

fn message(amount_cents: i64, destination: &str) -> ChargeRequest {
    ChargeRequest {
        amount_cents,
        currency: "EUR".into(),
        destination: destination.into(),
        labels: [
            ("order".to_owned(), "o-1".to_owned()),
            ("channel".to_owned(), "web".to_owned()),
        ]
        .into(),
        requested_at: "2026-01-01T00:00:00Z".into(),
    }
}

/// A `Charge` call with `entries` as its metadata.
fn with_metadata<M>(message: M, entries: &[(&'static str, &str)]) -> Request<M> {
    let mut request = Request::new(message);
    for (name, value) in entries {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    request
}

fn charge(tenant: &str, key: &str, amount_cents: i64) -> Request<ChargeRequest> {
    with_metadata(
        message(amount_cents, "acct_42"),
        &[("idempotency-key", key), ("x-tenant-id", tenant)],
    )
}

fn replayed<T>(response: &Response<T>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

fn problem(status: &Status) -> &str {
    status
        .metadata()
        .get("idempotency-problem")
        .expect("idempotency-problem")
        .to_str()
        .unwrap()
}

fn pushback_ms(status: &Status) -> u64 {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("grpc-retry-pushback-ms")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// First call, replay, reuse with another request, a stored refusal.
async fn state_table<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = store::<DB>().await;
    let mut client = serve(GrpcPayments::new(h.engine.clone())).await;

    let first = client.charge(charge("acme", "k-1", 500)).await.unwrap();
    assert!(!replayed(&first));
    assert_eq!(
        (
            first.get_ref().amount_cents,
            first.get_ref().currency.as_str()
        ),
        (500, "EUR")
    );

    // The retry: the same reply, marked; a fresh client timestamp and the
    // map in another order are the same request.
    let mut retry = message(500, "acct_42");
    retry.requested_at = "2026-01-01T00:00:09Z".into();
    retry.labels = [
        ("channel".to_owned(), "web".to_owned()),
        ("order".to_owned(), "o-1".to_owned()),
    ]
    .into();
    let again = client
        .charge(with_metadata(
            retry,
            &[("idempotency-key", "k-1"), ("x-tenant-id", "acme")],
        ))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(first.get_ref(), again.get_ref());
    assert_eq!(h.payments().await, 1);

    // The same key with another amount, or another label: refused, nothing runs.
    let reused = client.charge(charge("acme", "k-1", 501)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert_eq!(problem(&reused), idem::http::problem::types::KEY_REUSED);
    assert!(reused.message().contains("different request"), "{reused:?}");
    let mut relabelled = message(500, "acct_42");
    relabelled.labels.insert("order".into(), "o-2".into());
    let reused = client
        .charge(with_metadata(
            relabelled,
            &[("idempotency-key", "k-1"), ("x-tenant-id", "acme")],
        ))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);

    // Another tenant's k-1 is another operation.
    let other = client.charge(charge("globex", "k-1", 500)).await.unwrap();
    assert!(!replayed(&other));
    assert_ne!(other.get_ref().charge_id, first.get_ref().charge_id);
    assert_eq!(h.payments().await, 2);

    // A deterministic refusal is stored and replayed, with its message.
    let invalid = client
        .charge(charge("acme", "k-neg", -5))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid
        .message()
        .contains("amount_cents must be a positive integer"));
    assert!(invalid.metadata().get("idempotent-replayed").is_none());
    let replayed_invalid = client
        .charge(charge("acme", "k-neg", -5))
        .await
        .unwrap_err();
    assert_eq!(replayed_invalid.code(), Code::InvalidArgument);
    assert_eq!(replayed_invalid.message(), invalid.message());
    assert_eq!(
        replayed_invalid
            .metadata()
            .get("idempotent-replayed")
            .unwrap(),
        "true"
    );
    assert_eq!(h.records().await, 3);
}

/// Keys and scopes the protocol refuses before anything is claimed.
async fn refused_before_claiming<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = store::<DB>().await;
    let mut client = serve(GrpcPayments::new(h.engine.clone())).await;

    let missing = client
        .charge(with_metadata(
            message(500, "acct_42"),
            &[("x-tenant-id", "acme")],
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert_eq!(problem(&missing), idem::http::problem::types::KEY_MISSING);
    assert!(missing.message().contains("idempotency-key"), "{missing:?}");

    let too_long = "k".repeat(256);
    for bad in [too_long.as_str(), "two words", "\"unterminated"] {
        let malformed = client.charge(charge("acme", bad, 500)).await.unwrap_err();
        assert_eq!(malformed.code(), Code::InvalidArgument, "{bad:?}");
        assert_eq!(
            problem(&malformed),
            idem::http::problem::types::KEY_MALFORMED,
            "{bad:?}"
        );
    }

    let mut binary = with_metadata(message(500, "acct_42"), &[("x-tenant-id", "acme")]);
    binary.metadata_mut().insert_bin(
        "idempotency-key-bin",
        tonic::metadata::MetadataValue::from_bytes(b"k-1"),
    );
    let binary = client.charge(binary).await.unwrap_err();
    assert_eq!(binary.code(), Code::InvalidArgument);
    assert!(
        binary
            .message()
            .contains("send it as the ASCII entry `idempotency-key`"),
        "{binary:?}"
    );

    let no_tenant = client
        .charge(with_metadata(
            message(500, "acct_42"),
            &[("idempotency-key", "k-1")],
        ))
        .await
        .unwrap_err();
    assert_eq!(no_tenant.code(), Code::InvalidArgument);
    assert!(no_tenant.message().contains("x-tenant-id"), "{no_tenant:?}");

    let empty_request_id = client
        .refund(with_metadata(
            RefundRequest {
                request_id: String::new(),
                charge_id: "pay_1".into(),
                amount_cents: 1,
            },
            &[("x-tenant-id", "acme")],
        ))
        .await
        .unwrap_err();
    assert_eq!(empty_request_id.code(), Code::InvalidArgument);
    assert!(
        empty_request_id.message().contains("`request_id` field"),
        "{empty_request_id:?}"
    );

    assert_eq!((h.records().await, h.payments().await), (0, 0));
}

/// `Refund` keys on its `request_id` field; its refusals are stored.
async fn key_in_a_field<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = store::<DB>().await;
    let mut client = serve(GrpcPayments::new(h.engine.clone())).await;
    let charge_id = client
        .charge(charge("acme", "k-1", 500))
        .await
        .unwrap()
        .into_inner()
        .charge_id;
    let refund = |request_id: &str, amount_cents| {
        with_metadata(
            RefundRequest {
                request_id: request_id.into(),
                charge_id: charge_id.clone(),
                amount_cents,
            },
            &[("x-tenant-id", "acme")],
        )
    };

    let first = client.refund(refund("r-1", 200)).await.unwrap();
    let again = client.refund(refund("r-1", 200)).await.unwrap();
    assert!(!replayed(&first) && replayed(&again));
    assert_eq!(first.get_ref(), again.get_ref());
    assert_eq!(h.payments().await, 2);

    let too_much = client.refund(refund("r-2", 9_999)).await.unwrap_err();
    assert_eq!(too_much.code(), Code::OutOfRange);
    assert_eq!(
        client
            .refund(refund("r-2", 9_999))
            .await
            .unwrap_err()
            .metadata()
            .get("idempotent-replayed")
            .unwrap(),
        "true"
    );

    // The `idempotency-key` entry is not what keys a refund.
    let mut keyed = refund("r-1", 200);
    keyed
        .metadata_mut()
        .insert("idempotency-key", "something-else".parse().unwrap());
    assert!(replayed(&client.refund(keyed).await.unwrap()));

    let unknown = client
        .refund(with_metadata(
            RefundRequest {
                request_id: "r-3".into(),
                charge_id: "pay_nope".into(),
                amount_cents: 1,
            },
            &[("x-tenant-id", "acme")],
        ))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert_eq!(h.payments().await, 2);
}

/// 64 concurrent calls with one key: one charge; every other caller gets
/// its reply or `ABORTED` with a pushback.
async fn concurrent_duplicates<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = store::<DB>().await;
    let client = serve(GrpcPayments::new(h.engine.clone())).await;
    let calls = (0..64).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move { client.charge(charge("acme", "k-dup", 4200)).await })
    });
    let results: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let replies: Vec<&Response<ChargeReply>> =
        results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(
        replies.iter().filter(|r| !replayed(r)).count(),
        1,
        "exactly one call executes"
    );
    for result in &results {
        match result {
            Ok(reply) => assert_eq!(reply.get_ref(), replies[0].get_ref()),
            Err(status) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert!(pushback_ms(status) > 0);
            }
        }
    }
    assert_eq!(h.payments().await, 1);
}

/// A call whose key is held by another attempt: `ABORTED`, with the lock's
/// time left as `grpc-retry-pushback-ms` and in whole seconds as `retry-after`.
async fn in_progress<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = store::<DB>().await;
    let mut client = serve(GrpcPayments::new(h.engine.clone())).await;
    let op = Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new("k-held").unwrap(),
        CHARGE_CARD.name(),
        &message(500, "acct_42"),
    )
    .with_policy(test_policy().with_claim_mode(ClaimMode::Durable));
    let Claim::Execute(guard) = h.engine.claim(&op).await.unwrap() else {
        panic!("a fresh claim")
    };

    let status = client
        .charge(charge("acme", "k-held", 500))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(problem(&status), idem::http::problem::types::IN_PROGRESS);
    let pushback = pushback_ms(&status);
    assert!(
        pushback > 0 && pushback <= test_policy().lock_ttl.as_millis() as u64 + 1000,
        "{pushback}"
    );
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry_after, pushback.div_ceil(1000).max(1));

    // The holder gives up: the next call runs.
    guard.commit(rolled_back()).await.unwrap();
    let reply = client.charge(charge("acme", "k-held", 500)).await.unwrap();
    assert!(!replayed(&reply));
    assert_eq!(h.payments().await, 1);
}

/// With the key table gone, every call is `UNAVAILABLE` with a pushback and
/// nothing is charged.
async fn store_down<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let h = store::<DB>().await;
    let mut client = serve(GrpcPayments::new(h.engine.clone())).await;
    h.break_key_table().await;
    let status = client.charge(charge("acme", "k-1", 500)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        problem(&status),
        idem::http::problem::types::STORE_UNAVAILABLE
    );
    assert!(pushback_ms(&status) > 0);
    assert_eq!(h.payments().await, 0);
}

/// An answer stored under the step by something other than a gRPC method
/// (here an HTTP handler's JSON) is refused with a clear status, not
/// decoded as a reply.
async fn answer_stored_by_another_transport<DB: TestBackend + Ledger>(
    _: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let h = store::<DB>().await;
    let mut client = serve(GrpcPayments::new(h.engine.clone())).await;
    let op = Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new("k-http").unwrap(),
        CHARGE_CARD.name(),
        &message(500, "acct_42"),
    );
    let Claim::Execute(guard) = h.engine.claim(&op).await.unwrap() else {
        panic!("a fresh claim")
    };
    let json = idem::StoredResponse {
        status: 201,
        content_type: "application/json".into(),
        body: br#"{"payment_id":"pay_1"}"#.to_vec(),
        headers: vec![],
    };
    guard.commit(json).await.unwrap();
    let status = client
        .charge(charge("acme", "k-http", 500))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("not a gRPC reply"), "{status:?}");
    assert!(status.message().contains("application/json"), "{status:?}");
    assert_eq!(problem(&status), idem::http::problem::types::REPLAY_FAILED);
}

/// An answer that is not kept: committing it releases a claim.
fn rolled_back() -> idem::StoredResponse {
    idem::StoredResponse {
        status: 503,
        content_type: "application/json".into(),
        body: Vec::new(),
        headers: vec![],
    }
}

idem::steps! {
    /// The gated service's charge.
    const GATED_CHARGE = "gated-charge.v1";
    /// The gated service's refund.
    const GATED_REFUND = "gated-refund.v1";
}

/// A payments service whose charge writes a row, then acts on its
/// destination: `wait` waits for a permit of `gate`; `deny`, `invalid` and
/// `exhausted` fail with that status after the write.
struct Gated<DB: Backend> {
    engine: Engine<DB>,
    gate: Arc<Semaphore>,
    runs: Arc<AtomicUsize>,
}

impl<DB: Backend> HasEngine<DB> for Gated<DB> {
    fn engine(&self) -> &Engine<DB> {
        &self.engine
    }
}

#[tonic::async_trait]
impl<DB: Ledger> Payments for Gated<DB> {
    #[idempotent(
        grpc,
        scope = "tenant",
        step = GATED_CHARGE,
        store = [PERMISSION_DENIED],
        never_store = [INVALID_ARGUMENT],
        metadata = ["ledger-entry"],
    )]
    async fn charge(
        &self,
        tenant: HeaderScope<XTenantId>,
        request: Request<ChargeRequest>,
        tx: &mut DB::Connection,
    ) -> Result<Response<ChargeReply>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let charge = request.into_inner();
        let payment = payments::Payment {
            payment_id: payments::new_payment_id(),
            amount_cents: charge.amount_cents,
            currency: charge.currency,
            destination: charge.destination,
        };
        DB::insert(tx, &tenant, &payment)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        match payment.destination.as_str() {
            "wait" => self.gate.acquire().await.unwrap().forget(),
            "deny" => return Err(Status::permission_denied("acct is frozen")),
            "invalid" => return Err(Status::invalid_argument("acct is closed")),
            "exhausted" => {
                let mut status = Status::resource_exhausted("quota");
                status
                    .metadata_mut()
                    .insert("grpc-retry-pushback-ms", "250".parse().unwrap());
                return Err(status);
            }
            _ => {}
        }
        let mut reply = Response::new(ChargeReply {
            charge_id: payment.payment_id,
            amount_cents: payment.amount_cents,
            currency: payment.currency,
        });
        reply
            .metadata_mut()
            .insert("ledger-entry", "le_1".parse().unwrap());
        reply
            .metadata_mut()
            .insert("x-charge-region", "eu".parse().unwrap());
        reply
            .metadata_mut()
            .insert("server-id", "replica-1".parse().unwrap());
        Ok(reply)
    }

    /// Fingerprinted by the request's protobuf encoding, not its derive.
    #[idempotent(grpc, scope = "tenant", step = GATED_REFUND, key = request_id, fingerprint = encoding)]
    async fn refund(
        &self,
        tenant: HeaderScope<XTenantId>,
        request: Request<RefundRequest>,
        tx: &mut DB::Connection,
    ) -> Result<Response<RefundReply>, Status> {
        let refund = request.into_inner();
        let payment = payments::Payment {
            payment_id: payments::new_payment_id(),
            amount_cents: -refund.amount_cents,
            currency: "EUR".into(),
            destination: refund.charge_id,
        };
        DB::insert(tx, &tenant, &payment)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(RefundReply {
            refund_id: payment.payment_id,
            amount_cents: refund.amount_cents,
        }))
    }
}

struct GatedService<DB: TestBackend> {
    h: Harness<DB>,
    client: PaymentsClient<Channel>,
    gate: Arc<Semaphore>,
    runs: Arc<AtomicUsize>,
}

async fn gated<DB: TestBackend + Ledger>() -> GatedService<DB> {
    let h = store::<DB>().await;
    let (gate, runs) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let client = serve(Gated {
        engine: h.engine.clone(),
        gate: gate.clone(),
        runs: runs.clone(),
    })
    .await;
    GatedService {
        h,
        client,
        gate,
        runs,
    }
}

fn gated_charge(key: &str, destination: &str) -> Request<ChargeRequest> {
    with_metadata(
        message(100, destination),
        &[("idempotency-key", key), ("x-tenant-id", "acme")],
    )
}

/// A deadline that expires while the body works rolls the work back: the
/// row it wrote and the claim are gone, and the retry runs once.
async fn deadline_mid_work<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let mut s = gated::<DB>().await;
    let mut call = gated_charge("k-slow", "wait");
    call.set_timeout(Duration::from_millis(300));
    let status = s.client.charge(call).await.unwrap_err();
    // tonic reports an expired deadline as `CANCELLED` "Timeout expired"
    // (client side) or `DEADLINE_EXCEEDED`, whichever side notices first.
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    // The server dropped the call's future: its transaction rolled back.
    let rolled_back = async {
        while s.h.records().await != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), rolled_back)
        .await
        .expect("the claim rolls back");
    assert_eq!(
        (s.runs.load(Ordering::SeqCst), s.h.payments().await),
        (1, 0)
    );

    s.gate.add_permits(1);
    let reply = s
        .client
        .charge(gated_charge("k-slow", "wait"))
        .await
        .unwrap();
    assert!(!replayed(&reply));
    assert!(replayed(
        &s.client
            .charge(gated_charge("k-slow", "wait"))
            .await
            .unwrap()
    ));
    assert_eq!(
        (s.runs.load(Ordering::SeqCst), s.h.payments().await),
        (2, 1)
    );
}

/// A client that cancels mid-work (drops the call) rolls the work back too.
async fn cancelled_mid_work<DB: TestBackend + Ledger>(_: impl AsyncFn(Policy) -> Harness<DB>) {
    let s = gated::<DB>().await;
    let mut client = s.client.clone();
    let call = tokio::spawn(async move { client.charge(gated_charge("k-cancel", "wait")).await });
    while s.runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    call.abort();
    let rolled_back = async {
        while s.h.records().await != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), rolled_back)
        .await
        .expect("the claim rolls back");
    assert_eq!(s.h.payments().await, 0);
}

/// `store = [PERMISSION_DENIED]` stores that code, `never_store =
/// [INVALID_ARGUMENT]` rolls that one back, `RESOURCE_EXHAUSTED` rolls back
/// by default; `metadata = ["ledger-entry"]` keeps that entry with the
/// `x-…` ones, and other entries are not replayed.
async fn stored_codes_and_metadata<DB: TestBackend + Ledger>(
    _: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let mut s = gated::<DB>().await;

    for _ in 0..2 {
        let denied = s
            .client
            .charge(gated_charge("k-deny", "deny"))
            .await
            .unwrap_err();
        assert_eq!(denied.code(), Code::PermissionDenied);
    }
    assert_eq!(
        (s.runs.load(Ordering::SeqCst), s.h.payments().await),
        (1, 1),
        "stored: ran once, row kept"
    );

    for code in ["invalid", "exhausted"] {
        let before = s.runs.load(Ordering::SeqCst);
        for _ in 0..2 {
            let status = s
                .client
                .charge(gated_charge(&format!("k-{code}"), code))
                .await
                .unwrap_err();
            assert!(
                status.metadata().get("idempotent-replayed").is_none(),
                "{status:?}"
            );
            if code == "exhausted" {
                // A rolled-back answer reaches the caller as the method gave it.
                assert_eq!(pushback_ms(&status), 250);
            }
        }
        assert_eq!(
            s.runs.load(Ordering::SeqCst),
            before + 2,
            "{code}: rolled back, ran again"
        );
    }
    assert_eq!(s.h.payments().await, 1);

    let first = s
        .client
        .charge(gated_charge("k-ok", "acct_42"))
        .await
        .unwrap();
    let again = s
        .client
        .charge(gated_charge("k-ok", "acct_42"))
        .await
        .unwrap();
    for reply in [&first, &again] {
        assert_eq!(reply.metadata().get("ledger-entry").unwrap(), "le_1");
        assert_eq!(reply.metadata().get("x-charge-region").unwrap(), "eu");
        assert!(
            reply.metadata().get("server-id").is_none(),
            "not kept, on the first answer either"
        );
    }
    assert!(replayed(&again));
}

/// `fingerprint = encoding`: the same message replays, another one under
/// the same `request_id` is refused as a reused key.
async fn fingerprint_of_the_encoding<DB: TestBackend + Ledger>(
    _: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let mut s = gated::<DB>().await;
    let refund = |amount_cents| {
        with_metadata(
            RefundRequest {
                request_id: "r-enc".into(),
                charge_id: "pay_1".into(),
                amount_cents,
            },
            &[("x-tenant-id", "acme")],
        )
    };
    let first = s.client.refund(refund(300)).await.unwrap();
    let again = s.client.refund(refund(300)).await.unwrap();
    assert!(!replayed(&first) && replayed(&again));
    assert_eq!(first.get_ref(), again.get_ref());
    let reused = s.client.refund(refund(301)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert_eq!(problem(&reused), idem::http::problem::types::KEY_REUSED);
    assert_eq!(s.h.payments().await, 1);
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fingerprint_of_the_encoding,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    state_table,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    refused_before_claiming,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    key_in_a_field,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    concurrent_duplicates,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    in_progress,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store_down,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    answer_stored_by_another_transport,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    deadline_mid_work,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    cancelled_mid_work,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    stored_codes_and_metadata,
}
