//! `cargo run --example billing_nats` against a real nats-server: exits 0,
//! one invoice per order, the retried order replayed, the re-published event
//! dropped by JetStream and the late copy caught by the inbox.
//! `cargo test` builds the example; this runs it.

mod nats_harness;

use std::process::Command;

use idem_runtime::test_support::example_binary;

#[test]
fn billing_example_bills_each_order_once() {
    let server = nats_harness::single();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(example_binary("billing_nats"))
        .args(["--nats", &server.url(), "--orders", "4", "--dir"])
        .arg(dir.path())
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("retried order: replayed"), "{stdout}");
    assert!(stdout.contains("re-published event: Duplicate"), "{stdout}");
    assert!(stdout.contains("billing processed 4 events"), "{stdout}");
    assert!(stdout.contains("acknowledged as a duplicate"), "{stdout}");
    assert!(
        stdout.contains("orders: 4, invoices: 4 (4 distinct orders), poisoned: 0"),
        "{stdout}"
    );
}
