//! The README's first command, `cargo run --example checkout`, exits 0 and
//! reports one charge and one notification per order, and the retries it
//! tells of really happened: the gateway and the mesh each retried a lost
//! answer and got the replay, and a relay process died after delivering a
//! notification and before marking it sent, whose redelivery was answered
//! from the notifications inbox.
//! `cargo test` builds the example; this runs it.

use std::process::Command;

use idem_runtime::test_support::example_binary;

/// The table's rows for one logical operation: from its name to the blank line.
fn rows<'a>(stdout: &'a str, story: &str) -> Vec<&'a str> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with(story));
    let mut rows = Vec::new();
    for line in lines.by_ref() {
        if line.trim().is_empty() {
            break;
        }
        rows.push(line);
    }
    assert!(!rows.is_empty(), "{story} missing from\n{stdout}");
    rows
}

/// The `got` column of the row whose attempt column starts with `who`.
fn got<'a>(rows: &[&'a str], who: &str) -> &'a str {
    let row = rows
        .iter()
        .find(|row| {
            row.get(35..)
                .is_some_and(|r| r.trim_start().starts_with(who))
        })
        .unwrap_or_else(|| panic!("no `{who}` row in\n{}", rows.join("\n")));
    row[35 + 27..].trim()
}

#[test]
fn checkout_demo_exits_zero_with_one_charge_per_order() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(example_binary("checkout"))
        .current_dir(dir.path())
        .output()
        .expect("run the checkout demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("one charge and one notification per order: yes"),
        "{stdout}"
    );
    assert!(!stdout.contains("WRONG"), "{stdout}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "the demo leaves nothing in the working directory"
    );

    let lost = rows(&stdout, "client retry after a lost response");
    assert!(
        got(&lost, "client #1").contains("client gave up"),
        "{stdout}"
    );
    assert_eq!(got(&lost, "client #2"), "201 replayed", "{stdout}");

    let gateway = rows(&stdout, "gateway retry");
    assert!(got(&gateway, "gateway -> orders #1").contains("connection dropped -> retries"));
    assert_eq!(
        got(&gateway, "gateway -> orders #2"),
        "201 replayed",
        "{stdout}"
    );
    assert_eq!(got(&gateway, "client #1"), "201 replayed", "{stdout}");

    let mesh = rows(&stdout, "mesh retry");
    assert!(got(&mesh, "mesh -> payments #1").contains("connection dropped -> retries"));
    assert_eq!(
        got(&mesh, "mesh -> payments #2"),
        "201 replayed",
        "{stdout}"
    );
    assert_eq!(got(&mesh, "client #1"), "201 executed", "{stdout}");

    let duplicate = rows(&stdout, "duplicate while the first runs");
    assert_eq!(got(&duplicate, "client #1"), "201 executed", "{stdout}");
    assert!(
        got(&duplicate, "client #2").starts_with("409 in progress, Retry-After "),
        "the duplicate is told to come back later: {stdout}"
    );
    assert_eq!(
        got(&duplicate, "client #2 retry"),
        "201 replayed",
        "{stdout}"
    );

    let crash = rows(&stdout, "crash after commit");
    assert!(
        got(&crash, "client #1").contains("connection dropped"),
        "{stdout}"
    );
    assert_eq!(got(&crash, "client #2"), "201 replayed", "{stdout}");

    let reused = rows(&stdout, "key reused with a changed amount");
    assert_eq!(
        got(&reused, "client #2"),
        "422 key reused with a different request"
    );

    let relay = rows(&stdout, "relay crash after delivery");
    assert_eq!(got(&relay, "client #1"), "201 executed", "{stdout}");
    assert_eq!(
        got(&relay, "relay B -> notifications"),
        "200 recorded",
        "{stdout}"
    );
    assert!(
        relay
            .iter()
            .any(|row| row.get(35..62).map(str::trim) == Some("relay B")
                && row[62..].trim() == "process died after the 200, before marking sent"),
        "{stdout}"
    );
    assert_eq!(
        got(&relay, "relay C -> notifications"),
        "200 replayed: recorded before",
        "{stdout}"
    );

    for story in [&lost, &gateway, &mesh, &duplicate, &crash, &reused, &relay] {
        assert!(
            got(story, "side effects").contains("orders 1, charges 1, notifications 1  [ok]"),
            "{}",
            story.join("\n")
        );
    }
}
