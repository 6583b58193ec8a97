//! The bounded chaos run: `cargo run --example chaos` with 200 checkouts on
//! each backend over 30 s, the three backends at once, while their services
//! are killed at random, the payments processes (which the order service
//! charges over gRPC) among them. Each run checks its stores itself and exits
//! non-zero on anything lost, duplicated or inconsistent; this also checks
//! that the kills and retries happened, and that every payments process was
//! killed. `cargo test` builds the example; this runs it.

use std::process::Command;

use idem_test_support::example_binary;

/// The number after `label ` in the run's summary line.
fn figure(summary: &str, label: &str) -> u64 {
    let at = summary
        .find(&format!("{label} "))
        .unwrap_or_else(|| panic!("no `{label}` in {summary}"));
    summary[at + label.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{label}` in {summary}"))
}

fn bounded_run(backend: &str, payments_replicas: usize) {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(example_binary("chaos"))
        .args([
            "--backend",
            backend,
            "--checkouts",
            "200",
            "--seconds",
            "30",
        ])
        .current_dir(dir.path())
        .output()
        .expect("run the chaos example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = stdout
        .lines()
        .find(|line| line.starts_with(&format!("{backend}: checkouts ")))
        .unwrap_or_else(|| panic!("no summary in\n{stdout}"));
    assert_eq!(figure(summary, "checkouts"), 200, "{summary}");
    assert_eq!(figure(summary, "(201:"), 200, "{summary}");
    for zero in ["lost", "duplicates", "inconsistencies"] {
        assert_eq!(figure(summary, zero), 0, "{summary}");
    }
    assert!(
        figure(summary, "kills") >= 5,
        "the services were killed: {summary}"
    );
    for replica in 1..=payments_replicas {
        assert!(
            figure(summary, &format!("payments-{replica}")) >= 1,
            "payments-{replica} was killed: {summary}"
        );
    }
    assert!(
        figure(summary, "retries") > 0,
        "the kills cost retries: {summary}"
    );
    // Two answers per checkout during the chaos and one replay after it, at least.
    assert!(figure(summary, "ops") >= 600, "{summary}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "the run leaves nothing in the working directory"
    );
}

/// The three runs at once (each is mostly waiting: on its services'
/// restarts, its clients' backoff, its stores), each checked on its own.
#[test]
fn chaos_on_every_backend_loses_and_duplicates_nothing() {
    std::thread::scope(|runs| {
        // SQLite with one payments process; Postgres and MySQL with two
        // replicas behind the order service.
        for (backend, payments_replicas) in [("sqlite", 1), ("postgres", 2), ("mysql", 2)] {
            std::thread::Builder::new()
                .name(format!("chaos on {backend}"))
                .spawn_scoped(runs, move || bounded_run(backend, payments_replicas))
                .expect("spawn a run");
        }
    });
}
