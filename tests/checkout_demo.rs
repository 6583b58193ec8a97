//! The README's first command, `cargo run --example checkout`, exits 0 with
//! one charge and one notification per order, and the retries it tells of
//! really happened: the gateway and the mesh each retried a lost answer and
//! got the replay, and a relay process died after delivering a notification
//! and before marking it sent, whose redelivery was answered from the
//! notifications inbox. The demo's `--json` report is what is checked.
//! `cargo test` builds the example; this runs it.

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

/// What an attempt got, `status` included when there was one: `"replayed 201"`.
fn got(story: &Value, who: &str) -> String {
    let attempt = attempt(story, who);
    let got = attempt["got"].as_str().expect("got");
    match attempt["status"].as_u64() {
        Some(status) => format!("{got} {status}"),
        None => got.to_owned(),
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
    assert_eq!(stories.len(), 7);
    assert_eq!(report["orders"], 7);
    assert_eq!(report["charges"], 7);
    assert_eq!(report["notifications"], 7);
    for story in stories {
        for effect in ["orders", "charges", "notifications"] {
            assert_eq!(story[effect], 1, "{story:#}");
        }
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

    let mesh = story(&report, "mesh retry of the charge");
    let cut = attempt(mesh, "mesh -> payments #1");
    assert_eq!(
        (&cut["got"], &cut["then"]),
        (&"no_answer".into(), &"retries".into())
    );
    assert_eq!(got(mesh, "mesh -> payments #2"), "replayed 201");
    assert_eq!(got(mesh, "client #1"), "executed 201");

    let duplicate = story(&report, "duplicate while the first runs");
    assert_eq!(got(duplicate, "client #1"), "executed 201");
    let told = attempt(duplicate, "client #2 -> orders");
    assert_eq!(told["got"], "in_progress", "{duplicate:#}");
    assert!(
        told["retry_after"].as_str().unwrap().parse::<u64>().is_ok(),
        "the duplicate is told to come back later: {told}"
    );
    assert_eq!(got(duplicate, "client #2 retry"), "replayed 201");

    let crash = story(&report, "crash after commit");
    let cut = attempt(crash, "client #1");
    assert_eq!(
        (&cut["got"], &cut["timeout_ms"]),
        (&"no_answer".into(), &Value::Null)
    );
    assert_eq!(got(crash, "client #2"), "replayed 201");

    let reused = story(&report, "key reused with a changed amount");
    assert_eq!(got(reused, "client #2"), "key_reused");

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
