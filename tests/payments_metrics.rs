//! The payments example's `GET /metrics`, scraped over a real socket after a
//! known sequence of requests (executed, replayed, mismatch), on a SQLite
//! file and on a Postgres database.

#[path = "../examples/services/client.rs"]
mod client;

use std::process::Stdio;
use std::time::Duration;

use client::HttpClient;
use idem_test_support::example_binary;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const STEP: &str = "create-payment.v1";

async fn start(database_url: &str) -> (Child, String) {
    let mut child = Command::new(example_binary("payments"))
        .args(["--listen", "127.0.0.1:0", "--database-url", database_url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the payments example");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the example did not start within 30 s")
        .unwrap()
        .expect("the example exited before listening");
    let base = line
        .strip_prefix("listening on ")
        .expect("the ready line")
        .to_owned();
    (child, base)
}

/// The value of the series `name` whose labels include all of `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| {
            let Some(rest) = line.strip_prefix(name) else {
                return false;
            };
            (rest.starts_with('{') || rest.starts_with(' '))
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

async fn scrape_after_known_requests(database_url: &str) {
    let (_child, base) = start(database_url).await;
    let http = HttpClient::new();
    let pay = |key: &'static str, amount: i64| {
        let http = &http;
        let url = format!("{base}/payments");
        async move {
            http.post_json(
                &url,
                &[("idempotency-key", key), ("x-tenant-id", "acme")],
                &json!({ "amount_cents": amount, "currency": "EUR", "destination": "acct-1" }),
            )
            .await
            .unwrap()
            .status
        }
    };
    assert_eq!(pay("k-1", 100).await, 201);
    assert_eq!(pay("k-1", 100).await, 201);
    assert_eq!(pay("k-1", 100).await, 201);
    assert_eq!(pay("k-1", 999).await, 422);
    assert_eq!(pay("k-2", 100).await, 201);

    let reply = http.get(&format!("{base}/metrics"), &[]).await.unwrap();
    assert_eq!(reply.status, 200);
    let text = String::from_utf8(reply.body).unwrap();
    let claims = |outcome| {
        value(
            &text,
            "idem_claims_total",
            &[("step", STEP), ("outcome", outcome)],
        )
    };
    assert_eq!(claims("executed"), Some(2.0), "{text}");
    assert_eq!(claims("replayed"), Some(2.0), "{text}");
    assert_eq!(claims("mismatch"), Some(1.0), "{text}");
    assert_eq!(claims("in_progress"), None, "{text}");
    assert_eq!(
        value(&text, "idem_claim_wait_seconds_count", &[("step", STEP)]),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "idem_handler_duration_seconds_count",
            &[("step", STEP)]
        ),
        Some(2.0),
        "{text}"
    );
    // No key and no tenant is ever a label.
    assert!(!text.contains("k-1") && !text.contains("acme"), "{text}");
}

#[tokio::test]
async fn sqlite_metrics_are_scraped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    scrape_after_known_requests(&path.display().to_string()).await;
}

#[tokio::test]
async fn postgres_metrics_are_scraped() {
    let url = idem_test_support::postgres().fresh_database().await;
    scrape_after_known_requests(&url).await;
}

#[tokio::test]
async fn mysql_metrics_are_scraped() {
    let url = idem_test_support::mysql().fresh_database().await;
    scrape_after_known_requests(&url).await;
}
