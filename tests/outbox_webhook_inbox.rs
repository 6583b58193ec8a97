//! The outbox and the inbox end to end over real HTTP, on SQLite and
//! Postgres: messages enqueued in a publisher's outbox and delivered by a
//! [`Relay`] through the [`WebhookSink`] (signed per Standard Webhooks) to a
//! [`WebhookReceiver`] on a loopback socket. The guide's four test-plan
//! cases, each counted in effects per message id:
//!
//! 1. first request: delivered once, one effect, marked sent;
//! 2. replay: a relay that lost its lease mid-delivery is overtaken by
//!    another; the second delivery is answered from the inbox's record
//!    (counted as a duplicate, sent), the stale relay's mark-sent is fenced;
//! 3. concurrent duplicate: two publishers' relays deliver the same id at
//!    once; one runs, the other is told 409 and retries later into the
//!    replay;
//! 4. the same id with a different payload: 422, the message is dead at the
//!    publisher, nothing runs;
//!
//! and a relay signing with the wrong secret is refused (401, the message is
//! dead, no claim stored).

mod inbox_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use idem::faults::FaultPoint;
use idem::inbox::webhook::WebhookReceiver;
use idem::inbox::Inbox;
use idem::outbox::{self, Message, MessageState, Relay, WebhookSink};
use idem::signature::SigningSecret;
use idem::{Policy, Problem};
use idem_test_support::{on_each_store, Harness, TestBackend};
use inbox_support::Effects;

idem::steps! {
    const ORDER_EVENT = "order-event.v1";
    const RECORD_EVENT = "record-event.v1";
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const FORGED: &str = "whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==";

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
            DB::insert_payment(tx, &message.id, 1).await?;
            if event["slow"] == true {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            Ok::<_, Problem>(serde_json::json!({ "received": message.id }))
        })
        .await
}

/// The receiver on `h`'s store, served on a loopback port; its URL.
async fn serve<DB: TestBackend>(h: &Harness<DB>) -> String {
    let inbox = Inbox::new(h.engine.clone(), "order-events", RECORD_EVENT.name()).expect("inbox");
    let receiver = WebhookReceiver::new(inbox, SigningSecret::new(SECRET).expect("secret"));
    let app = Router::new()
        .route("/hooks/orders", post(hook::<DB>))
        .with_state(Arc::new(receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "http://{}/hooks/orders",
        listener.local_addr().expect("addr")
    );
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    url
}

/// A relay of `h`'s outbox through the webhook sink, signing with `secret`.
fn relay<DB: TestBackend>(h: &Harness<DB>, secret: &str) -> Relay<DB> {
    Relay::new(&h.engine)
        .sink(WebhookSink::new(
            SigningSecret::new(secret).expect("secret"),
        ))
        .lease(Duration::from_millis(800))
        .publish_timeout(Duration::from_millis(700))
}

/// Enqueues one event with an explicit id (outside a claim).
async fn enqueue<DB: TestBackend>(h: &Harness<DB>, url: &str, id: &str, event: &str) {
    let message = Message::webhook(url)
        .body("application/json", event.as_bytes().to_vec())
        .with_id(id, ORDER_EVENT);
    let mut conn = h.engine.pool().acquire().await.expect("connection");
    outbox::enqueue(&mut *conn, &message)
        .await
        .expect("enqueue");
}

async fn state<DB: TestBackend>(h: &Harness<DB>, id: &str) -> outbox::OutboxEntry {
    outbox::entry(h.engine.pool(), id)
        .await
        .expect("entry")
        .expect("the message exists")
}

/// Runs `relay` until message `id` is no longer pending (at most 15 s).
async fn deliver<DB: TestBackend>(
    h: &Harness<DB>,
    relay: &Relay<DB>,
    id: &str,
) -> outbox::OutboxEntry {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        relay.run_once().await.expect("relay");
        let entry = state(h, id).await;
        if entry.state != MessageState::Pending {
            return entry;
        }
        assert!(Instant::now() < deadline, "{id} still pending: {entry:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn outbox_through_webhooks_into_the_inbox<DB>(harness: impl AsyncFn(Policy) -> Harness<DB>)
where
    DB: TestBackend + Effects,
{
    let receiver = harness(Policy::default()).await;
    let other = harness(Policy::default()).await;
    // The receiver's store is also the first publisher's outbox; `other` is
    // a second publisher (its own store) sending to the same receiver.
    let url = serve(&receiver).await;
    let publisher = &receiver;
    let effects = async |id: &str| DB::effects(receiver.engine.pool(), id).await;

    // A relay signing with the wrong secret: 401, dead at once, nothing stored.
    enqueue(publisher, &url, "evt-forged", r#"{"order":0}"#).await;
    let forged = relay(publisher, FORGED);
    let entry = deliver(publisher, &forged, "evt-forged").await;
    assert_eq!(entry.state, MessageState::Dead, "{entry:?}");
    assert!(
        entry.last_error.as_deref().unwrap_or("").contains("401"),
        "{entry:?}"
    );
    assert_eq!(forged.stats().dead, 1);
    assert_eq!(receiver.records().await, 0, "no claim was made");
    assert_eq!(receiver.payments().await, 0);

    // 1. First request: delivered, one effect, sent.
    let body = r#"{"order":1}"#;
    enqueue(publisher, &url, "evt-1", body).await;
    let first = relay(publisher, SECRET);
    let entry = deliver(publisher, &first, "evt-1").await;
    assert_eq!(entry.state, MessageState::Sent, "{entry:?}");
    assert_eq!(entry.attempts, 1);
    assert_eq!(first.stats().published, 1);
    assert_eq!(first.stats().duplicates, 0);
    assert_eq!(effects("evt-1").await, 1);

    // 2. Replay: relay A delivers, then stalls past its lease before
    //    marking sent; relay B leases the message again and delivers it;
    //    the receiver answers from its record; A's mark-sent is fenced.
    enqueue(publisher, &url, "evt-2", r#"{"order":2}"#).await;
    let stalled = Arc::new(relay(publisher, SECRET).fault(Some(
        FaultPoint::RelayStallAfterPublish(Duration::from_millis(2000)),
    )));
    let a = tokio::spawn({
        let stalled = stalled.clone();
        async move { stalled.run_once().await.expect("relay A") }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while effects("evt-2").await == 0 {
        assert!(Instant::now() < deadline, "relay A never delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = relay(publisher, SECRET);
    let entry = deliver(publisher, &b, "evt-2").await;
    assert_eq!(entry.state, MessageState::Sent, "{entry:?}");
    assert_eq!(
        b.stats().duplicates,
        1,
        "the receiver replayed: {:?}",
        b.stats()
    );
    assert_eq!(b.stats().published, 0);
    a.await.expect("relay A");
    assert_eq!(stalled.stats().fenced, 1, "{:?}", stalled.stats());
    assert_eq!(state(publisher, "evt-2").await.state, MessageState::Sent);
    assert_eq!(effects("evt-2").await, 1);

    // 3. Concurrent duplicate: both publishers send evt-3 at once; the
    //    second delivery finds the claim held and is told 409, retries after
    //    the Retry-After it was given, and gets the replay.
    let slow = r#"{"order":3,"slow":true}"#;
    enqueue(publisher, &url, "evt-3", slow).await;
    enqueue(&other, &url, "evt-3", slow).await;
    let here = relay(publisher, SECRET)
        .lease(Duration::from_secs(3))
        .publish_timeout(Duration::from_millis(2500));
    let there = relay(&other, SECRET)
        .lease(Duration::from_secs(3))
        .publish_timeout(Duration::from_millis(2500));
    let (one, two) = tokio::join!(here.run_once(), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        there.run_once().await
    });
    one.expect("relay here");
    two.expect("relay there");
    assert_eq!(effects("evt-3").await, 1);
    let busy = state(&other, "evt-3").await;
    assert_eq!(busy.state, MessageState::Pending, "{busy:?}");
    assert!(
        busy.last_error.as_deref().unwrap_or("").contains("409"),
        "{busy:?}"
    );
    assert_eq!(there.stats().retried, 1, "{:?}", there.stats());
    assert_eq!(state(publisher, "evt-3").await.state, MessageState::Sent);
    let entry = deliver(&other, &there, "evt-3").await;
    assert_eq!(entry.state, MessageState::Sent, "{entry:?}");
    assert_eq!(there.stats().duplicates, 1, "{:?}", there.stats());
    assert_eq!(effects("evt-3").await, 1);

    // 4. The same id with a different payload (the other publisher reuses
    //    evt-1): 422, dead at the publisher, nothing runs.
    enqueue(&other, &url, "evt-1", r#"{"order":99}"#).await;
    let entry = deliver(&other, &there, "evt-1").await;
    assert_eq!(entry.state, MessageState::Dead, "{entry:?}");
    assert!(
        entry.last_error.as_deref().unwrap_or("").contains("422"),
        "{entry:?}"
    );
    assert_eq!(effects("evt-1").await, 1);
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    outbox_through_webhooks_into_the_inbox,
}
