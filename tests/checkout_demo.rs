//! The README's first command, `cargo run --example checkout`, exits 0 with
//! one charge and one notification per order, and the retries it tells of
//! really happened: the gateway and the order service's gRPC retry layer
//! each retried a lost answer and got the replay; the layer's retry that met
//! the charge still running got idem's `ABORTED` with a pushback, then the
//! reply; a key claimed over HTTP and retried over gRPC was refused there
//! and charged once; and a relay process died after delivering a
//! notification and before marking it sent, whose redelivery was answered
//! from the notifications inbox. The charges are counted as payments' HTTP
//! `GET /payments` lists them, the gRPC ones included. The demo's `--json`
//! report is what is checked. `cargo test` builds the example; this runs it.

use std::process::Command;

use idem_test_support::example_binary;
use serde_json::Value;

/// The story named `name` in the report.
fn story<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["stories"]
        .as_array()
        .expect("stories")
        .iter()
        .find(|story| story["name"] == name)
        .unwrap_or_else(|| panic!("no story {name:?} in {report:#}"))
}

/// The first attempt of `story` whose caller starts with `who`.
fn attempt<'a>(story: &'a Value, who: &str) -> &'a Value {
    story["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .find(|attempt| attempt["who"].as_str().is_some_and(|w| w.starts_with(who)))
        .unwrap_or_else(|| panic!("no attempt by {who:?} in {story:#}"))
}

/// What an attempt got, its HTTP status or gRPC code included when there
/// was one: `"replayed 201"`, `"replayed OK"`.
fn got(story: &Value, who: &str) -> String {
    let attempt = attempt(story, who);
    let got = attempt["got"].as_str().expect("got");
    match (attempt["status"].as_u64(), attempt["code"].as_str()) {
        (Some(status), _) => format!("{got} {status}"),
        (None, Some(code)) => format!("{got} {code}"),
        (None, None) => got.to_owned(),
    }
}

#[test]
fn checkout_demo_exits_zero_with_one_charge_per_order() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(example_binary("checkout"))
        .arg("--json")
        .current_dir(dir.path())
        .output()
        .expect("run the checkout demo");
    assert!(
        output.status.success(),
        "exit {:?}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["once_per_order"], true, "{report:#}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "the demo leaves nothing in the working directory"
    );
    let stories = report["stories"].as_array().unwrap();
    assert_eq!(stories.len(), 9);
    // Eight checkouts, and a charge a back office made without an order.
    assert_eq!(report["orders"], 8);
    assert_eq!(report["charges"], 9);
    assert_eq!(report["notifications"], 8);
    for story in stories {
        let placed = u64::from(!story["order"].is_null());
        assert_eq!(story["charges"], 1, "{story:#}");
        assert_eq!(story["orders"], placed, "{story:#}");
        assert_eq!(story["notifications"], placed, "{story:#}");
        assert_eq!(story["paid_by_its_charge"], true, "{story:#}");
    }

    let lost = story(&report, "client retry after a lost response");
    assert_eq!(
        attempt(lost, "client #1")["then"],
        "client_gave_up",
        "{lost:#}"
    );
    assert_eq!(got(lost, "client #2"), "replayed 201", "{lost:#}");

    let gateway = story(&report, "gateway retry");
    let cut = attempt(gateway, "gateway -> orders #1");
    assert_eq!(
        (&cut["got"], &cut["then"]),
        (&"no_answer".into(), &"retries".into())
    );
    assert_eq!(
        cut["timeout_ms"],
        Value::Null,
        "the connection dropped: {cut}"
    );
    assert_eq!(got(gateway, "gateway -> orders #2"), "replayed 201");
    assert_eq!(got(gateway, "client #1"), "replayed 201");

    // The order service charges over gRPC, through idem-client's layer.
    for story in stories.iter().filter(|story| !story["order"].is_null()) {
        assert!(
            story["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["who"] == "orders -> payments #1"),
            "{story:#}"
        );
    }
    let lost_charge = story(&report, "gRPC retry of a lost charge");
    let cut = attempt(lost_charge, "orders -> payments #1");
    assert_eq!(
        (&cut["got"], &cut["stream_reset"], &cut["then"]),
        (&"no_answer".into(), &true.into(), &"retries".into()),
        "{lost_charge:#}"
    );
    assert_eq!(got(lost_charge, "orders -> payments #2"), "replayed OK");
    assert_eq!(got(lost_charge, "client #1"), "executed 201");

    let duplicate = story(&report, "duplicate while the first runs");
    assert_eq!(got(duplicate, "client #1"), "executed 201");
    assert_eq!(got(duplicate, "orders -> payments #1"), "executed OK");
    let told = attempt(duplicate, "client #2 -> orders");
    assert_eq!(told["got"], "in_progress", "{duplicate:#}");
    assert!(
        told["retry_after"].as_str().unwrap().parse::<u64>().is_ok(),
        "the duplicate is told to come back later: {told}"
    );
    assert_eq!(got(duplicate, "client #2 retry"), "replayed 201");

    let running = story(&report, "gRPC retry while the charge runs");
    assert_eq!(
        attempt(running, "orders -> payments #1")["stream_reset"],
        true,
        "{running:#}"
    );
    let aborted = attempt(running, "orders -> payments #2");
    assert_eq!(aborted["got"], "aborted", "{running:#}");
    assert!(
        aborted["pushback_ms"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0,
        "idem's in-progress ABORTED carries a pushback: {aborted}"
    );
    assert_eq!(got(running, "orders -> payments #3"), "replayed OK");
    assert_eq!(got(running, "client #1"), "executed 201");

    let crash = story(&report, "crash after commit");
    let cut = attempt(crash, "client #1");
    assert_eq!(
        (&cut["got"], &cut["timeout_ms"]),
        (&"no_answer".into(), &Value::Null)
    );
    assert_eq!(got(crash, "client #2"), "replayed 201");

    let reused = story(&report, "key reused with a changed amount");
    assert_eq!(got(reused, "client #2"), "key_reused 422");

    // One store, two transports: the key the HTTP request claimed is refused
    // over gRPC (another step's request) and charges nothing; the HTTP retry
    // is replayed; the listing shows one charge.
    let transports = story(&report, "HTTP charge retried over gRPC");
    assert_eq!(got(transports, "back office -> HTTP"), "executed 201");
    assert_eq!(
        got(transports, "back office -> gRPC #1"),
        "key_reused FAILED_PRECONDITION"
    );
    assert_eq!(got(transports, "back office retry"), "replayed 201");
    assert_eq!(transports["attempts"].as_array().unwrap().len(), 3);

    let relay = story(&report, "relay crash after delivery");
    assert_eq!(got(relay, "client #1"), "executed 201");
    assert_eq!(got(relay, "relay B -> notifications"), "recorded");
    let died = relay["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["who"] == "relay B" && a["got"] == "process_died");
    assert!(died, "{relay:#}");
    assert_eq!(got(relay, "relay C -> notifications"), "recorded_before");
}
