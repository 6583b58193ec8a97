//! The NATS JetStream sink against real nats-server processes: the stream
//! leader of a 3-node R3 cluster SIGKILLed in the middle of a batch (no
//! loss, no duplicate), the startup check of the duplicate window against
//! the retry horizon, and per-subject mode, where a re-publish long after the
//! window still counts as delivered.

mod nats_harness;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use idem::outbox::nats::{DedupeMode, NatsSink};
use idem::outbox::{Delivered, OutgoingMessage, Sink, SinkError};

fn message(id: &str, destination: &str) -> OutgoingMessage {
    OutgoingMessage {
        id: id.to_owned(),
        step: "order-created.v1".to_owned(),
        destination: destination.to_owned(),
        ordering_key: None,
        headers: vec![("Idem-Step".to_owned(), "order-created.v1".to_owned())],
        content_type: "application/json".to_owned(),
        payload: format!(r#"{{"id":"{id}"}}"#).into_bytes(),
        attempt: 1,
    }
}

/// Every message id in the stream, in stream order (read by sequence,
/// retrying while the cluster settles after a failover).
async fn stored_ids(js: &jetstream::Context, name: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let retry = |what: String| {
        assert!(Instant::now() < deadline, "reading the stream: {what}");
    };
    let stream = loop {
        match js.get_stream(name).await {
            Ok(stream) => break stream,
            Err(error) => retry(error.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let state = loop {
        match stream.get_info().await {
            Ok(info) => break info.state,
            Err(error) => retry(error.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut ids = Vec::new();
    if state.messages == 0 {
        return ids;
    }
    for seq in state.first_sequence..=state.last_sequence {
        let stored = loop {
            match stream.get_raw_message(seq).await {
                Ok(stored) => break stored,
                Err(error) => retry(error.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let id = stored
            .headers
            .get("Nats-Msg-Id")
            .map(|v| v.as_str().to_owned())
            .expect("every message has its id");
        ids.push(id);
    }
    assert_eq!(ids.len() as u64, state.messages);
    ids
}

/// (5) A batch of publishes through the sink into an R3 stream; the stream
/// leader is SIGKILLed a third of the way in. The publisher retries each
/// failed message with the same id, as the relay does, through the nodes
/// left: every message is stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_batch_no_loss_no_duplicate() {
    let mut cluster = nats_harness::NatsCluster::start();
    let client = nats_harness::connect(&cluster.urls()).await;
    let mut js = jetstream::new(client);
    js.set_timeout(Duration::from_secs(2));
    let mut created = nats_harness::create_stream(
        &js,
        stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            num_replicas: 3,
            ..Default::default()
        },
    )
    .await;
    let leader = created
        .info()
        .await
        .expect("info")
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("the stream has a leader");

    let sink = NatsSink::new(js.clone(), "ORDERS");
    sink.check(Duration::from_secs(60))
        .await
        .expect("120 s window covers 60 s");
    const BATCH: usize = 200;
    const PUBLISHERS: usize = 4;
    let done = Arc::new(AtomicUsize::new(0));
    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let (sink, done) = (sink.clone(), done.clone());
        publishers.push(tokio::spawn(async move {
            // published, duplicate, transient failures retried
            let mut outcomes = (0usize, 0usize, 0usize);
            for i in (p..BATCH).step_by(PUBLISHERS) {
                let msg = message(&format!("order-{i:04}"), "orders.created");
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    match sink.publish(&msg).await {
                        Ok(Delivered::Published { .. }) => outcomes.0 += 1,
                        Ok(Delivered::Duplicate { .. }) => outcomes.1 += 1,
                        Err(SinkError::Transient { message, .. }) => {
                            assert!(Instant::now() < deadline, "never delivered: {message}");
                            outcomes.2 += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                        Err(error) => panic!("permanent failure: {error}"),
                    }
                    break;
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            outcomes
        }));
    }
    // SIGKILL the leader while publishes are in flight.
    while done.load(Ordering::SeqCst) < BATCH / 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.node_mut(&leader).kill();
    let mut outcomes = (0, 0, 0);
    for publisher in publishers {
        let (published, duplicate, retried) = publisher.await.expect("publisher");
        outcomes = (
            outcomes.0 + published,
            outcomes.1 + duplicate,
            outcomes.2 + retried,
        );
    }
    eprintln!("published, duplicate, retried after the kill: {outcomes:?}");
    assert_eq!(outcomes.0 + outcomes.1, BATCH, "{outcomes:?}");

    let ids = stored_ids(&js, "ORDERS").await;
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), BATCH, "no loss");
    assert_eq!(
        ids.len(),
        BATCH,
        "no duplicate in the stream ({outcomes:?})"
    );
    let new_leader = js
        .get_stream("ORDERS")
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone());
    assert_ne!(new_leader.as_deref(), Some(leader.as_str()));
}

/// (6) A window shorter than the retry horizon is refused at start; in
/// per-subject mode a re-publish after the window is still recognised and
/// counts as delivered, where window mode would store it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_window_refused_and_per_subject_mode() {
    let server = nats_harness::single();
    let js = jetstream::new(nats_harness::connect(&[server.url()]).await);
    nats_harness::create_stream(
        &js,
        stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            duplicate_window: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await;

    let window = NatsSink::new(js.clone(), "ORDERS");
    assert_eq!(window.mode(), DedupeMode::Window);
    let refused = window
        .check(Duration::from_secs(30))
        .await
        .expect_err("a 1 s window cannot cover a 30 s retry horizon");
    assert!(refused.contains("duplicate_window"), "{refused}");
    assert!(refused.contains("per-subject"), "{refused}");
    window
        .check(Duration::from_millis(500))
        .await
        .expect("a 1 s window covers 500 ms");

    // Why: in window mode a late re-publish is stored again.
    let late = message("late-1", "orders.window");
    assert!(matches!(
        window.publish(&late).await,
        Ok(Delivered::Published { .. })
    ));
    assert!(matches!(
        window.publish(&late).await,
        Ok(Delivered::Duplicate { .. })
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        window.publish(&late).await,
        Ok(Delivered::Published { .. })
    ));

    // Per-subject mode: accepted at start, and the late re-publish counts as delivered.
    let per_subject = NatsSink::new(js.clone(), "ORDERS").per_subject();
    per_subject
        .check(Duration::from_secs(30))
        .await
        .expect("a stream without max_age keeps ids for as long as it keeps messages");
    let order = message("order-0001", "orders.subject");
    assert!(matches!(
        per_subject.publish(&order).await,
        Ok(Delivered::Published { .. })
    ));
    assert!(matches!(
        per_subject.publish(&order).await,
        Ok(Delivered::Duplicate { .. })
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        matches!(
            per_subject.publish(&order).await,
            Ok(Delivered::Duplicate { .. })
        ),
        "after the window, the subject still has the message: delivered"
    );
    let ids = stored_ids(&js, "ORDERS").await;
    assert_eq!(ids.iter().filter(|id| *id == "order-0001").count(), 1);
    assert_eq!(ids.iter().filter(|id| *id == "late-1").count(), 2);

    // A stream that ages messages out sooner than the horizon is refused in per-subject mode too.
    nats_harness::create_stream(
        &js,
        stream::Config {
            name: "SHORT".into(),
            subjects: vec!["short.>".into()],
            max_age: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .await;
    let refused = NatsSink::new(js.clone(), "SHORT")
        .per_subject()
        .check(Duration::from_secs(60))
        .await
        .expect_err("max_age 10 s < 60 s");
    assert!(refused.contains("max_age"), "{refused}");

    // A missing stream is a clear error, not a panic.
    let missing = NatsSink::new(js, "NOPE")
        .check(Duration::from_secs(1))
        .await;
    assert!(missing.expect_err("no stream").contains("NOPE"));
}
