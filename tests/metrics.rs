//! Every metric the engine records (`idem_runtime::metrics`), after a known
//! sequence of claims, on a real SQLite file and a real Postgres database;
//! and the series a real relay (through an in-process sink) and a real
//! inbox consumer record on each backend.
//! One recorder serves the whole process, so the scenarios run in one test,
//! each backend under its own step names (the `step` label keeps them apart).

use std::collections::HashMap;
use std::time::Duration;

use idem_runtime::inbox::{Inbox, Incoming, Verdict};
use idem_runtime::metrics::{
    CLAIMS, CLAIM_WAIT, HANDLER_DURATION, INBOX_MESSAGES, OUTBOX_DEAD, OUTBOX_OLDEST_PENDING,
    OUTBOX_PENDING, OUTBOX_PUBLISHED, OUTBOX_RELAY_LAG, PURGE_DURATION, PURGE_ROWS,
};
use idem_runtime::outbox::{self, Delivered, InProcessSink, Message, Relay, SinkError};
use idem_runtime::Backend;
use idem_runtime::{
    Claim, ClaimMode, FailureMode, IdemError, IdempotencyKey, Operation, Policy, Problem, Scope,
    Step, StoredResponse,
};
use idem_test_support::{Harness, TestBackend};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

fn operation(step: &'static str, key: &str, amount: i64) -> Operation {
    Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new(key).unwrap(),
        step,
        &amount,
    )
}

async fn charge<DB: TestBackend>(h: &Harness<DB>, op: &Operation) -> Result<i64, IdemError> {
    h.engine
        .run(op, async move |_tx| Ok::<i64, Problem>(1))
        .await
        .map(|done| done.value.unwrap())
}

/// Plays each outcome once (executed twice), then a purge of three records.
async fn play<DB: TestBackend>(h: Harness<DB>, step: &'static str) {
    // executed, replayed, mismatch
    charge(&h, &operation(step, "a", 1)).await.unwrap();
    charge(&h, &operation(step, "a", 1)).await.unwrap();
    assert!(matches!(
        charge(&h, &operation(step, "a", 2)).await,
        Err(IdemError::Mismatch)
    ));
    // in_progress: a durable claim holds the key
    let durable = Policy::default()
        .with_claim_mode(ClaimMode::Durable)
        .with_lock_ttl(Duration::from_millis(300));
    let held = operation(step, "held", 1).with_policy(durable);
    let Ok(Claim::Execute(first)) = h.engine.claim(&held).await else {
        panic!("the first claim executes")
    };
    assert!(matches!(
        h.engine.claim(&held).await,
        Err(IdemError::InProgress { .. })
    ));
    // took_over, then the first attempt is fenced
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Ok(Claim::Execute(second)) = h.engine.claim(&held).await else {
        panic!("the second claim takes over")
    };
    let stored = StoredResponse {
        status: 200,
        content_type: "application/json".into(),
        body: b"1".to_vec(),
        headers: Vec::new(),
    };
    second.commit(stored.clone()).await.unwrap();
    assert!(matches!(
        first.commit(stored).await,
        Err(IdemError::LockLost)
    ));
    // a purge of three expired records
    let short = Policy::default().with_retention(Duration::from_millis(1));
    for key in ["x1", "x2", "x3"] {
        charge(&h, &operation(step, key, 1).with_policy(short))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(h.engine.purge_expired(2).await.unwrap(), 3);
    // failed_open, unavailable: the store's table is gone
    h.break_key_table().await;
    let open = Policy::default().with_failure_mode(FailureMode::Open);
    charge(&h, &operation(step, "down", 1).with_policy(open))
        .await
        .unwrap();
    assert!(matches!(
        charge(&h, &operation(step, "down", 1)).await,
        Err(IdemError::Unavailable { .. })
    ));
}

const DELIVERED: Step = Step::new("metrics-delivered.v1");
const RETRIED: Step = Step::new("metrics-retried.v1");
const REFUSED: Step = Step::new("metrics-refused.v1");

/// One claim enqueues three messages; one relay round delivers the first,
/// retries the second and gives up on the third (sink `sink`). Then `consumer`
/// processes a message, sees it again, and poisons another. Returns the
/// backlog gauges the relay set: pending, oldest pending seconds.
async fn play_queues<DB>(
    h: Harness<DB>,
    sink: &'static str,
    consumer: &str,
    seen: &mut Seen,
    snapshotter: &Snapshotter,
) -> (f64, f64)
where
    DB: TestBackend + Backend + Backend,
{
    let scope = Scope::tenant("acme");
    let parent = IdempotencyKey::new(format!("order-{sink}")).unwrap();
    let messages: Vec<Message> = [DELIVERED, RETRIED, REFUSED]
        .into_iter()
        .map(|step| {
            Message::to(sink, "orders")
                .body("text/plain", step.name())
                .for_step(&parent, step)
                .scope(&scope)
                .max_attempts(3)
        })
        .collect();
    let op = Operation::new(scope.clone(), parent.clone(), "metrics-order.v1", &1i64);
    h.engine
        .run(&op, async |tx| {
            for message in &messages {
                outbox::enqueue(&mut *tx, message).await?;
            }
            Ok::<_, Problem>(())
        })
        .await
        .unwrap();
    let relay = Relay::new(&h.engine).sink(InProcessSink::new(sink, |message| async move {
        if message.step == DELIVERED.name() {
            Ok(Delivered::Published { receipt: None })
        } else if message.step == RETRIED.name() {
            Err(SinkError::Transient {
                message: "busy".into(),
                retry_after: Some(Duration::from_secs(60)),
            })
        } else {
            Err(SinkError::Permanent {
                message: "refused".into(),
            })
        }
    }));
    assert_eq!(relay.run_once().await.unwrap(), 3);
    absorb(seen, snapshotter);
    let gauges = (
        seen.gauges[OUTBOX_PENDING],
        seen.gauges[OUTBOX_OLDEST_PENDING],
    );

    let inbox = Inbox::new(h.engine.clone(), consumer, "metrics-consume.v1").unwrap();
    let first = Incoming::new("m-1", b"{}".to_vec());
    for expected in ["processed", "duplicate"] {
        let verdict = inbox
            .handle(&first, async |_tx, _m| Ok::<_, Problem>(()))
            .await;
        assert_eq!(verdict.as_str(), expected, "{verdict:?}");
    }
    let bad = inbox
        .handle(&Incoming::new("m-2", b"x".to_vec()), async |_tx, _m| {
            Err::<(), _>(Problem::new(422, "malformed"))
        })
        .await;
    assert!(matches!(bad, Verdict::Poisoned { .. }), "{bad:?}");
    gauges
}

fn check_queues(seen: &Seen, sink: &str, consumer: &str) {
    for result in ["ok", "retry", "dead"] {
        let id = (
            OUTBOX_PUBLISHED.to_owned(),
            labels(&[("sink", sink), ("result", result)]),
        );
        assert_eq!(seen.counters.get(&id), Some(&1), "{result}: {seen:#?}");
    }
    let dead = (OUTBOX_DEAD.to_owned(), labels(&[("sink", sink)]));
    assert_eq!(seen.counters.get(&dead), Some(&1), "{seen:#?}");
    let lag = (OUTBOX_RELAY_LAG.to_owned(), labels(&[("sink", sink)]));
    assert_eq!(seen.histograms.get(&lag), Some(&1), "{seen:#?}");
    for result in ["processed", "duplicate", "poison"] {
        let id = (
            INBOX_MESSAGES.to_owned(),
            labels(&[("consumer", consumer), ("result", result)]),
        );
        assert_eq!(seen.counters.get(&id), Some(&1), "{result}: {seen:#?}");
    }
}

#[derive(Default, Debug)]
struct Seen {
    counters: HashMap<(String, Vec<(String, String)>), u64>,
    histograms: HashMap<(String, Vec<(String, String)>), usize>,
    gauges: HashMap<String, f64>,
}

/// Adds what the recorder holds to `seen` (a snapshot drains counters and
/// histograms; gauges keep their last value).
fn absorb(seen: &mut Seen, snapshotter: &Snapshotter) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let id = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *seen.counters.entry(id).or_default() += n,
            DebugValue::Histogram(values) => {
                *seen.histograms.entry(id).or_default() += values.len()
            }
            DebugValue::Gauge(value) => {
                seen.gauges.insert(id.0, value.into_inner());
            }
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<_> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    labels
}

fn check(seen: &Seen, step: &str) {
    let claims = |outcome: &str| {
        seen.counters
            .get(&(
                CLAIMS.to_owned(),
                labels(&[("step", step), ("outcome", outcome)]),
            ))
            .copied()
            .unwrap_or(0)
    };
    // a, the first claim of `held`, x1, x2, x3
    assert_eq!(claims("executed"), 5, "{seen:#?}");
    for outcome in [
        "replayed",
        "mismatch",
        "in_progress",
        "took_over",
        "fenced",
        "failed_open",
        "unavailable",
    ] {
        assert_eq!(claims(outcome), 1, "{outcome}: {seen:#?}");
    }
    let histogram = |name: &str| {
        seen.histograms
            .get(&(name.to_owned(), labels(&[("step", step)])))
            .copied()
            .unwrap_or(0)
    };
    // Every claim's answer is timed: 5 executed + 6 others (fenced is a finish).
    assert_eq!(histogram(CLAIM_WAIT), 11, "{seen:#?}");
    // Every finished claim's work: a, x1-x3, the taken-over one, the fenced one, the failed-open one.
    assert_eq!(histogram(HANDLER_DURATION), 7, "{seen:#?}");
}

#[tokio::test]
async fn every_metric_is_recorded_on_every_backend() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder in this process");

    let mut seen = Seen::default();
    play(
        idem_test_support::stores::sqlite(Policy::default()).await,
        "metrics-sqlite.v1",
    )
    .await;
    play(
        idem_test_support::stores::postgres(Policy::default()).await,
        "metrics-postgres.v1",
    )
    .await;
    play(
        idem_test_support::stores::mysql(Policy::default()).await,
        "metrics-mysql.v1",
    )
    .await;

    // What the outbox relay and the inbox consumer record. After the round,
    // one message waits (the retried one), enqueued moments ago.
    for (pending, oldest) in [
        play_queues(
            idem_test_support::stores::sqlite(Policy::default()).await,
            "events-sqlite",
            "ledger-sqlite",
            &mut seen,
            &snapshotter,
        )
        .await,
        play_queues(
            idem_test_support::stores::postgres(Policy::default()).await,
            "events-postgres",
            "ledger-postgres",
            &mut seen,
            &snapshotter,
        )
        .await,
        play_queues(
            idem_test_support::stores::mysql(Policy::default()).await,
            "events-mysql",
            "ledger-mysql",
            &mut seen,
            &snapshotter,
        )
        .await,
    ] {
        assert_eq!(pending, 1.0);
        assert!((0.0..60.0).contains(&oldest), "{oldest}");
    }

    absorb(&mut seen, &snapshotter);
    check(&seen, "metrics-sqlite.v1");
    check(&seen, "metrics-postgres.v1");
    check(&seen, "metrics-mysql.v1");
    assert_eq!(
        seen.counters[&(PURGE_ROWS.to_owned(), vec![])],
        9,
        "{seen:#?}"
    );
    assert_eq!(
        seen.histograms[&(PURGE_DURATION.to_owned(), labels(&[("result", "ok")]))],
        3,
        "{seen:#?}"
    );

    check_queues(&seen, "events-sqlite", "ledger-sqlite");
    check_queues(&seen, "events-postgres", "ledger-postgres");
    check_queues(&seen, "events-mysql", "ledger-mysql");
}
