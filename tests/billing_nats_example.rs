//! `cargo run --example billing_nats` against a real nats-server: exits 0,
//! and its stores show one invoice per order, every event sent, nothing
//! poisoned. The retried order's replay, the re-published event JetStream
//! dropped and the late copy the inbox caught are checked by the example
//! itself, which exits non-zero when one of them did not happen.
//! `cargo test` builds the example; this runs it.

mod nats_harness;

use std::process::Command;

use idem::outbox::{self, MessageState};
use idem_test_support::example_binary;
use sqlx::SqlitePool;

#[tokio::test]
async fn billing_example_bills_each_order_once() {
    let server = nats_harness::single();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(example_binary("billing_nats"))
        .args(["--nats", &server.url(), "--orders", "4", "--dir"])
        .arg(dir.path())
        .output()
        .expect("run the example");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let orders = SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.path().join("orders.db").display()
    ))
    .await
    .expect("orders.db");
    let billing = SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.path().join("billing.db").display()
    ))
    .await
    .expect("billing.db");
    let count = async |pool: &SqlitePool, sql: &str| -> i64 {
        sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
    };
    assert_eq!(count(&orders, "SELECT COUNT(*) FROM orders").await, 4);
    let sent = outbox::list(&orders, Some(MessageState::Sent), 100)
        .await
        .expect("the outbox");
    assert_eq!(sent.len(), 4, "one event per order, each sent: {sent:?}");
    let backlog = outbox::backlog(&orders).await.expect("backlog");
    assert_eq!((backlog.pending, backlog.dead), (0, 0));

    assert_eq!(count(&billing, "SELECT COUNT(*) FROM invoices").await, 4);
    assert_eq!(
        count(&billing, "SELECT COUNT(DISTINCT order_id) FROM invoices").await,
        4
    );
    let poisoned = idem::inbox::poisoned(&billing, None, 100)
        .await
        .expect("poisoned");
    assert!(poisoned.is_empty(), "{poisoned:?}");
}
