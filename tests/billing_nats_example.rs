//! `cargo run --example billing_nats` against a real nats-server: exits 0,
//! one invoice per order, the retried order replayed, the re-published event
//! dropped by JetStream and the late copy caught by the inbox.
//! `cargo test` builds the example; this runs it.

mod nats_harness;

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    // Tests run from target/<profile>/deps; examples are built into target/<profile>/examples.
    let exe = std::env::current_exe().expect("test binary");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("profile dir");
    let binary = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: `cargo test` builds it; with `--test billing_nats_example` alone run `cargo build --example {name}` first",
        binary.display()
    );
    binary
}

#[test]
fn billing_example_bills_each_order_once() {
    let server = nats_harness::single();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(example("billing_nats"))
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
