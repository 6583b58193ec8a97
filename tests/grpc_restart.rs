//! The client retrying through a server killed and restarted, on SQLite and
//! Postgres: the payments example (`--grpc-listen`) as a child process, an
//! idem-client gRPC client (`IdempotentRetryLayer`) sending `Charge` calls,
//! each with a key of its own; the process is SIGKILLed while calls are in
//! flight and started again on the same port and store. Every call ends with
//! its reply, the `payments` table holds exactly one charge per key (the one
//! the reply names), and the replays after the restart are byte-identical.
//! `cargo test` builds the example; this runs it.

#[path = "../examples/services/payments.rs"]
mod payments;
#[path = "../examples/services/payments_grpc.rs"]
mod payments_grpc;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::join_all;
use idem::{IdempotencyKey, Policy};
use idem_client::grpc::{self, IdempotentRetry, IdempotentRetryLayer};
use idem_client::{ResponseExt, RetryPolicy};
use idem_test_support::{example_binary, on_each_store, Harness, TestBackend};
use payments::Ledger;
use payments_grpc::{ChargeRequest, PaymentsClient};
use prost::Message;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint};
use tower::Layer;

const TENANT: &str = "acme";
/// Charges sent, one key each.
const CALLS: usize = 48;
/// The calls start this far apart: the load lasts `CALLS * PACE`.
const PACE: Duration = Duration::from_millis(25);
/// When the server is killed, after the first call.
const KILL_AT: Duration = Duration::from_millis(400);
/// How long it stays down before it is started again.
const DOWN_FOR: Duration = Duration::from_millis(300);

/// The payments example on `store`, serving gRPC on `grpc_port`.
async fn start(store: &str, grpc_port: u16) -> Child {
    let mut child = Command::new(example_binary("payments"))
        .args(["--listen", "127.0.0.1:0", "--database-url", store])
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc_port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the payments example");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("listening on ") {
                return;
            }
        }
        panic!("the payments example exited before listening");
    };
    tokio::time::timeout(Duration::from_secs(60), ready)
        .await
        .expect("the payments example did not start within 60 s");
    child
}

/// A client whose calls keep their key across retries, long enough to ride
/// out the restart.
fn client(grpc_port: u16) -> PaymentsClient<IdempotentRetry<Channel>> {
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{grpc_port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    let policy = RetryPolicy::default()
        .max_attempts(50)
        .deadline(Duration::from_secs(60))
        .attempt_timeout(Duration::from_secs(5))
        .backoff(Duration::from_millis(50), Duration::from_millis(400))
        .retry_after_cap(Duration::from_secs(1));
    PaymentsClient::new(IdempotentRetryLayer::new(policy).layer(channel))
}

fn charge(i: usize) -> tonic::Request<ChargeRequest> {
    let mut request = grpc::with_key(
        tonic::Request::new(ChargeRequest {
            amount_cents: 100 + i as i64,
            currency: "EUR".into(),
            destination: format!("acct-{i}"),
            ..ChargeRequest::default()
        }),
        IdempotencyKey::new(format!("restart-{i}")).unwrap(),
    );
    request
        .metadata_mut()
        .insert("x-tenant-id", TENANT.parse().unwrap());
    request
}

/// One call's reply: its encoding, whether it was replayed, its attempts,
/// and when it came.
struct Replied {
    encoded: Vec<u8>,
    charge_id: String,
    replayed: bool,
    attempts: u32,
    at: Duration,
}

async fn call(
    client: &PaymentsClient<IdempotentRetry<Channel>>,
    i: usize,
    started: Instant,
) -> Replied {
    let reply = client
        .clone()
        .charge(charge(i))
        .await
        .unwrap_or_else(|status| panic!("call {i} failed: {status:?}"));
    Replied {
        encoded: reply.get_ref().encode_to_vec(),
        charge_id: reply.get_ref().charge_id.clone(),
        replayed: reply.replayed(),
        attempts: reply.attempts(),
        at: started.elapsed(),
    }
}

async fn client_retries_through_a_restart<DB: TestBackend + Ledger>(
    _: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let db = DB::test_db().await;
    let port = idem_test_support::free_port().expect("free port");
    let mut server = start(db.url(), port).await;
    let client = client(port);

    // The load, and the kill and restart in the middle of it.
    let started = Instant::now();
    let calls = join_all((0..CALLS).map(|i| {
        let client = &client;
        async move {
            tokio::time::sleep(PACE * i as u32).await;
            call(client, i, started).await
        }
    }));
    let chaos = async {
        tokio::time::sleep(KILL_AT).await;
        server.start_kill().expect("SIGKILL the payments example");
        server.wait().await.unwrap();
        let killed = started.elapsed();
        tokio::time::sleep(DOWN_FOR).await;
        (killed, start(db.url(), port).await)
    };
    let (first, (killed, _restarted)) = tokio::join!(calls, chaos);

    // The kill landed mid-load: calls answered before it, calls retried
    // through it, and none failed.
    assert!(
        first.iter().any(|r| r.at < killed),
        "answers before the kill"
    );
    assert!(
        first.iter().filter(|r| r.attempts > 1).count() > 0,
        "some calls were retried through the restart"
    );
    assert!(
        first.iter().any(|r| r.at > killed),
        "answers after the kill"
    );

    // Exactly one charge per key, the one its reply names.
    let pool = DB::pool(db.url(), &Policy::default()).await;
    let charges = DB::list(&pool, TENANT).await.unwrap();
    assert_eq!(charges.len(), CALLS, "one charge per key");
    let by_destination: HashMap<&str, &str> = charges
        .iter()
        .map(|c| (c.destination.as_str(), c.payment_id.as_str()))
        .collect();
    for (i, replied) in first.iter().enumerate() {
        assert_eq!(
            by_destination.get(format!("acct-{i}").as_str()),
            Some(&replied.charge_id.as_str()),
            "call {i}"
        );
    }

    // Every key again, to the restarted process: its stored reply, byte for
    // byte, marked as a replay; nothing charged again.
    let replays = join_all((0..CALLS).map(|i| call(&client, i, started))).await;
    for (i, (first, replay)) in first.iter().zip(&replays).enumerate() {
        assert!(replay.replayed, "call {i}");
        assert_eq!(replay.attempts, 1, "call {i}");
        assert_eq!(replay.encoded, first.encoded, "call {i}");
    }
    assert_eq!(DB::list(&pool, TENANT).await.unwrap().len(), CALLS);
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    client_retries_through_a_restart,
}
