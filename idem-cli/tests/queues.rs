//! `idem outbox …`, `idem inbox …` and the outbox/inbox rows of `idem
//! inspect`, run as a process against real stores (a temporary SQLite file,
//! a fresh database on the throwaway Postgres server). The rows are written
//! by the runtime: an order's claim enqueues messages, a relay delivers them
//! through an in-process sink that refuses one, and a consumer downstream
//! processes one and poisons another.

use std::process::{Command, Output};

use idem_runtime::inbox::{Inbox, Incoming, Verdict};
use idem_runtime::outbox::{self, Delivered, InProcessSink, Message, Relay, SinkError};
use idem_runtime::Backend;
use idem_runtime::{Engine, IdempotencyKey, Operation, Problem, Scope, Step};
use serde_json::Value;
use sqlx::{MySql, Postgres, Sqlite};

const TENANT: &str = "shop-1";
const ORDER_KEY: &str = "key-ord-2001";
const NOTIFY: Step = Step::new("notify-customer.v1");
const AUDIT: Step = Step::new("audit.v1");
const SHIP: Step = Step::new("ship.v1");

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

/// The ids of the order's three messages: the notification (refused by the
/// sink, so dead), the shipment behind it on the same ordering key (blocked),
/// and the audit event (delivered).
struct Ids {
    notify: String,
    ship: String,
    audit: String,
}

/// Places the order: one claim enqueues three messages.
async fn place<DB>(engine: &Engine<DB>) -> Ids
where
    DB: Backend,
{
    let scope = Scope::tenant(TENANT);
    let parent = IdempotencyKey::new(ORDER_KEY).unwrap();
    let message = |step: Step| {
        Message::to("events", "orders")
            .json(&serde_json::json!({ "order": "ord-2001", "step": step.name() }))
            .unwrap()
            .for_step(&parent, step)
            .scope(&scope)
            .max_attempts(1)
    };
    let notify = message(NOTIFY).ordering_key("ord-2001");
    let ship = message(SHIP).ordering_key("ord-2001");
    let audit = message(AUDIT);
    let op = Operation::new(scope.clone(), parent.clone(), "place-order.v1", &1i64);
    let ids = Ids {
        notify: notify.id().unwrap().to_owned(),
        ship: ship.id().unwrap().to_owned(),
        audit: audit.id().unwrap().to_owned(),
    };
    engine
        .run(&op, async |tx| {
            for message in [&notify, &ship, &audit] {
                outbox::enqueue(&mut *tx, message).await?;
            }
            Ok::<_, Problem>(())
        })
        .await
        .unwrap();
    ids
}

/// A relay whose sink refuses the notification for good and takes the rest.
fn relay<DB: Backend>(engine: &Engine<DB>) -> Relay<DB> {
    Relay::new(engine).sink(InProcessSink::new("events", |message| async move {
        if message.step == NOTIFY.name() {
            Err(SinkError::Permanent {
                message: "422 from the mailer: no such customer".into(),
            })
        } else {
            Ok(Delivered::Published {
                receipt: Some(format!("rcpt-{}", message.step)),
            })
        }
    }))
}

async fn deliver<DB: Backend>(engine: &Engine<DB>) {
    let relay = relay(engine);
    while relay.run_once().await.unwrap() > 0 {}
}

/// The consumer downstream: processes the audit event, poisons a malformed one.
async fn consume<DB: Backend>(engine: &Engine<DB>, audit_id: &str) {
    let inbox = Inbox::new(engine.clone(), "ledger", "record-audit.v1").unwrap();
    let ok = inbox
        .handle(
            &Incoming::new(audit_id, b"{}".to_vec()).source("orders"),
            async |_tx, _message| Ok::<_, Problem>(()),
        )
        .await;
    assert!(matches!(ok, Verdict::Processed(_)), "{ok:?}");
    let bad = inbox
        .handle(
            &Incoming::new("m-malformed", b"not json".to_vec()).source("orders"),
            async |_tx, _message| Err::<(), _>(Problem::new(422, "payload is not JSON")),
        )
        .await;
    assert!(matches!(bad, Verdict::Poisoned { .. }), "{bad:?}");
}

async fn locations(kind: &str) -> (Vec<tempfile::TempDir>, String, String) {
    match kind {
        "sqlite" => {
            let dir = tempfile::tempdir().unwrap();
            let orders = dir.path().join("orders.db").display().to_string();
            let ledger = dir.path().join("ledger.db").display().to_string();
            (vec![dir], orders, ledger)
        }
        "postgres" => {
            let server = idem_test_support::postgres();
            (
                Vec::new(),
                server.fresh_database().await,
                server.fresh_database().await,
            )
        }
        _ => {
            let server = idem_test_support::mysql();
            (
                Vec::new(),
                server.fresh_database().await,
                server.fresh_database().await,
            )
        }
    }
}

async fn fill(kind: &str, orders: &str, ledger: &str) -> Ids {
    for store in [orders, ledger] {
        let out = idem(&["migrate", "--store", store]);
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    if kind == "sqlite" {
        let engine = Engine::<Sqlite>::open_sqlite(orders).await.unwrap();
        let ids = place(&engine).await;
        deliver(&engine).await;
        let downstream = Engine::<Sqlite>::open_sqlite(ledger).await.unwrap();
        consume(&downstream, &ids.audit).await;
        ids
    } else if kind == "postgres" {
        let engine = Engine::<Postgres>::connect_postgres(orders).await.unwrap();
        let ids = place(&engine).await;
        deliver(&engine).await;
        let downstream = Engine::<Postgres>::connect_postgres(ledger).await.unwrap();
        consume(&downstream, &ids.audit).await;
        ids
    } else {
        let engine = Engine::<MySql>::connect_mysql(orders).await.unwrap();
        let ids = place(&engine).await;
        deliver(&engine).await;
        let downstream = Engine::<MySql>::connect_mysql(ledger).await.unwrap();
        consume(&downstream, &ids.audit).await;
        ids
    }
}

async fn redeliver(kind: &str, orders: &str) {
    if kind == "sqlite" {
        deliver(&Engine::<Sqlite>::open_sqlite(orders).await.unwrap()).await;
    } else if kind == "postgres" {
        deliver(&Engine::<Postgres>::connect_postgres(orders).await.unwrap()).await;
    } else {
        deliver(&Engine::<MySql>::connect_mysql(orders).await.unwrap()).await;
    }
}

async fn outbox_and_inbox_commands(kind: &str) {
    let (_dirs, orders, ledger) = locations(kind).await;
    let ids = fill(kind, &orders, &ledger).await;

    // inspect: the order's record, its three messages, and downstream the
    // ledger's record of the audit event.
    let orders_store = format!("orders={orders}");
    let ledger_store = format!("ledger={ledger}");
    let args = [
        "inspect",
        "--key",
        ORDER_KEY,
        "--scope",
        TENANT,
        "--store",
        &orders_store,
        "--store",
        &ledger_store,
    ];
    let out = idem(&args);
    let shown = text(&out);
    assert_eq!(code(&out), 1, "a dead message needs attention: {shown}");
    assert!(
        shown.contains(
            "audit.v1 message via events to orders: sent, 1 attempt(s), receipt rcpt-audit.v1"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("notify-customer.v1 message via events to orders: dead, 1 attempt(s), last error: 422 from the mailer: no such customer"),
        "{shown}"
    );
    assert!(
        shown.contains("ship.v1 message via events to orders: pending, 0 attempt(s)"),
        "{shown}"
    );
    assert!(
        shown.contains("ledger inbox: consumer ledger: processed once (record-audit.v1)"),
        "{shown}"
    );
    assert!(!shown.contains(ORDER_KEY), "the key leaked: {shown}");
    let mut as_json = vec!["--json"];
    as_json.extend(args);
    let out = idem(&as_json);
    let value = json(&out);
    let outbox = value["root"]["outbox"].as_array().unwrap();
    assert_eq!(outbox.len(), 3, "{value}");
    let audit = outbox
        .iter()
        .find(|m| m["message_id"] == ids.audit.as_str())
        .unwrap();
    assert_eq!(audit["store"], "orders");
    assert_eq!(audit["state"], "sent");
    assert_eq!(audit["inbox"][0]["store"], "ledger");
    assert_eq!(audit["inbox"][0]["consumer"], "ledger");
    assert_eq!(audit["inbox"][0]["status"], "completed");
    assert!(audit["poison"].as_array().unwrap().is_empty());
    assert!(!String::from_utf8_lossy(&out.stdout).contains(ORDER_KEY));

    // status: one pending (blocked behind the dead one), one dead.
    let out = idem(&["outbox", "status", "--store", &orders]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("blocked ordering keys  1"),
        "{}",
        text(&out)
    );
    let out = idem(&["--json", "outbox", "status", "--store", &orders]);
    let status = json(&out);
    assert_eq!(status["pending"], 1, "{status}");
    assert_eq!(status["dead"], 1, "{status}");
    assert_eq!(status["blocked_ordering_keys"], 1, "{status}");
    assert!(status["oldest_pending_seconds"].as_f64().unwrap() >= 0.0);

    // list: the dead one with its error, the sent one with its receipt.
    let out = idem(&[
        "--json", "outbox", "list", "--state", "dead", "--store", &orders,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let dead = json(&out)["messages"].as_array().unwrap().clone();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["message_id"], ids.notify.as_str());
    assert_eq!(dead[0]["attempts"], 1);
    assert!(dead[0]["last_error"]
        .as_str()
        .unwrap()
        .contains("no such customer"));
    assert!(dead[0].get("parent_key").is_none());
    let out = idem(&["outbox", "list", "--store", &orders]);
    let shown = text(&out);
    assert!(
        shown.contains("rcpt-audit.v1") && shown.contains("3 message(s)"),
        "{shown}"
    );
    assert!(!shown.contains(ORDER_KEY), "the key leaked: {shown}");
    assert!(shown.contains(&IdempotencyKey::new(ORDER_KEY).unwrap().log_tag()));

    // requeue: only a dead message.
    let out = idem(&["outbox", "requeue", "--id", &ids.audit, "--store", &orders]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("it is sent, not dead"),
        "{}",
        text(&out)
    );
    let out = idem(&[
        "outbox",
        "requeue",
        "--id",
        "no-such-id",
        "--store",
        &orders,
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let out = idem(&["outbox", "requeue", "--id", &ids.notify, "--store", &orders]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = idem(&["--json", "outbox", "status", "--store", &orders]);
    assert_eq!(json(&out)["pending"], 2);
    assert_eq!(code(&out), 0, "nothing dead or blocked now: {}", text(&out));
    redeliver(kind, &orders).await; // refused again: dead again

    // skip: shown without --yes, done with it; the blocked one then goes out.
    let out = idem(&["outbox", "skip", "--id", &ids.notify, "--store", &orders]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("Pass --yes"), "{}", text(&out));
    let out = idem(&[
        "outbox",
        "skip",
        "--yes",
        "--id",
        &ids.notify,
        "--store",
        &orders,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = idem(&[
        "outbox",
        "skip",
        "--yes",
        "--id",
        &ids.notify,
        "--store",
        &orders,
    ]);
    assert_eq!(code(&out), 1, "already sent: {}", text(&out));
    redeliver(kind, &orders).await;
    let out = idem(&[
        "--json",
        "outbox",
        "status",
        "--max-age",
        "1h",
        "--store",
        &orders,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let status = json(&out);
    assert_eq!(status["pending"], 0);
    assert_eq!(status["dead"], 0);
    assert_eq!(status["blocked_ordering_keys"], 0);
    assert!(status["oldest_pending_seconds"].is_null());
    let out = idem(&[
        "--json", "outbox", "list", "--state", "sent", "--store", &orders,
    ]);
    let sent = json(&out)["messages"].as_array().unwrap().clone();
    assert_eq!(sent.len(), 3);
    let receipt = |id: &str| {
        sent.iter()
            .find(|m| m["message_id"] == id)
            .map(|m| m["receipt"].clone())
            .unwrap()
    };
    assert_eq!(receipt(&ids.notify), "skipped");
    assert_eq!(receipt(&ids.ship), "rcpt-ship.v1");

    // inbox poison / requeue.
    let out = idem(&["inbox", "poison", "--store", &ledger]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains("m-malformed"), "{}", text(&out));
    let out = idem(&[
        "--json",
        "inbox",
        "poison",
        "--consumer",
        "other",
        "--store",
        &ledger,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(json(&out)["poisoned"].as_array().unwrap().is_empty());
    let out = idem(&[
        "--json",
        "inbox",
        "poison",
        "--consumer",
        "ledger",
        "--store",
        &ledger,
    ]);
    let poisoned = json(&out)["poisoned"].as_array().unwrap().clone();
    assert_eq!(poisoned.len(), 1);
    assert_eq!(poisoned[0]["message_id"], "m-malformed");
    assert!(poisoned[0]["error"].as_str().unwrap().contains("not JSON"));
    let out = idem(&[
        "inbox",
        "requeue",
        "--consumer",
        "ledger",
        "--id",
        "m-malformed",
        "--store",
        &ledger,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = idem(&[
        "inbox",
        "requeue",
        "--consumer",
        "ledger",
        "--id",
        "m-malformed",
        "--store",
        &ledger,
    ]);
    assert_eq!(
        code(&out),
        0,
        "a requeued row can be requeued again: {}",
        text(&out)
    );
    let out = idem(&[
        "inbox",
        "requeue",
        "--consumer",
        "ledger",
        "--id",
        "m-unknown",
        "--store",
        &ledger,
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let out = idem(&["inbox", "poison", "--store", &ledger]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // A store without the tables, or none at all.
    let out = idem(&["outbox", "status", "--store", "/nonexistent/dir/x.db"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
}

#[tokio::test]
async fn sqlite_outbox_and_inbox_commands() {
    outbox_and_inbox_commands("sqlite").await;
}

#[tokio::test]
async fn postgres_outbox_and_inbox_commands() {
    outbox_and_inbox_commands("postgres").await;
}

#[tokio::test]
async fn mysql_outbox_and_inbox_commands() {
    outbox_and_inbox_commands("mysql").await;
}
