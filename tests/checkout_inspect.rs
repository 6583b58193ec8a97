//! `idem inspect` on the checkout demo's databases: the demo run with
//! `--keep-dbs`, then every order inspected across the order service's and
//! the payments service's stores, as the guide shows, and the stores' tables
//! read: one charge per order (made over gRPC) and one for the back office's
//! key (claimed over HTTP), in the one `payments` table; and the payments
//! example telling `idem steps --declared-by` its declared steps.

use std::process::Command;

use idem_cli::inspect::inspect;
use idem_cli::store::{OpenMode, Place, Store, StoreSpec};
use idem_runtime::Scope;
use idem_test_support::example_binary;

#[tokio::test]
async fn every_order_of_the_demo_was_charged_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("dbs");
    let output = Command::new(example_binary("checkout"))
        .args(["--keep-dbs", &kept.display().to_string()])
        .output()
        .expect("run the checkout demo");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );

    let mut stores = Vec::new();
    for name in ["orders", "payments", "notifications"] {
        let spec: StoreSpec = format!("{name}={}", kept.join(format!("{name}.db")).display())
            .parse()
            .unwrap();
        let store = Store::open(&spec, OpenMode::Existing).await.unwrap();
        stores.push((Place::from(&spec), store));
    }
    let scope = Scope::tenant("shop-1").to_string();
    assert!(kept.join("notifications.db").is_file());
    for order in 1001..=1008 {
        let key = format!("key-ord-{order}");
        let found = inspect(&stores, &scope, &key, &["charge-card.v1".to_owned()])
            .await
            .unwrap();
        let effects = found.effects();
        assert_eq!(effects.len(), 4, "{key}: {effects:#?}");
        assert_eq!(
            effects[0], "K in orders: completed once, response 201 (place-order.v1)",
            "{key}"
        );
        // The order's notification left through the outbox, was delivered,
        // and the notifications service processed it once.
        assert!(
            effects[1].starts_with("K in orders outbox: notify-order.v1 message via webhook to ")
                && effects[1].contains(": sent, ")
                && effects[1].ends_with("receipt HTTP 200"),
            "{key}: {}",
            effects[1]
        );
        assert_eq!(
            effects[2],
            "  notify-order.v1 message in notifications: consumer notifications: processed once (record-notification.v1)",
            "{key}"
        );
        // The charge, over gRPC: its reply is stored with the status 200.
        assert_eq!(
            effects[3],
            "child(K, charge-card.v1) in payments: completed once, response 200 (charge-card.v1)",
            "{key}"
        );
        assert!(!found.needs_attention(), "{key}");
    }
    // The back office's key, claimed over HTTP and retried over gRPC: one
    // record, the HTTP request's.
    let found = inspect(&stores, &scope, "key-pay-2001", &[]).await.unwrap();
    assert_eq!(
        found.effects(),
        ["K in payments: completed once, response 201 (create-payment.v1)"]
    );

    // The tables: one order per checkout, each paid by the one charge for it.
    let url = |name: &str| format!("sqlite://{}", kept.join(format!("{name}.db")).display());
    let orders = sqlx::SqlitePool::connect(&url("orders")).await.unwrap();
    let payments = sqlx::SqlitePool::connect(&url("payments")).await.unwrap();
    let placed: Vec<(String, String)> =
        sqlx::query_as("SELECT order_id, payment_id FROM orders ORDER BY order_id")
            .fetch_all(&orders)
            .await
            .unwrap();
    let charged: Vec<(String, String)> =
        sqlx::query_as("SELECT destination, payment_id FROM payments ORDER BY destination")
            .fetch_all(&payments)
            .await
            .unwrap();
    assert_eq!(placed.len(), 8, "{placed:?}");
    assert_eq!(charged.len(), 9, "{charged:?}");
    for (order, payment) in &placed {
        let charges: Vec<&String> = charged
            .iter()
            .filter(|(destination, _)| *destination == format!("merchant/{order}"))
            .map(|(_, payment)| payment)
            .collect();
        assert_eq!(charges, [payment], "{order}");
    }
    assert!(charged
        .iter()
        .any(|(destination, _)| destination == "merchant/back-office-2001"));
}

#[test]
fn the_payments_example_tells_its_steps() {
    let declared = idem_cli::steps::declared_by(&example_binary("payments")).unwrap();
    // The HTTP handler's step, and the gRPC methods' (`--grpc-listen`).
    assert_eq!(
        declared.keys().collect::<Vec<_>>(),
        ["charge-card.v1", "create-payment.v1", "refund-charge.v1"]
    );
    assert!(declared.values().all(|step| !step.retired));
}
