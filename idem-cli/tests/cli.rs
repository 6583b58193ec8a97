//! The built `idem` binary, run as a process against real stores: temporary
//! SQLite files and fresh databases on the throwaway Postgres server. Records
//! are written by the runtime's engine, as a service would write them.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use idem_runtime::{
    child_key, ClaimMode, Engine, IdempotencyKey, Operation, Policy, Problem, Scope,
};
use idem_test_support::{on_each_store, Harness, TestBackend, TestDb};

const TENANT: &str = "shop-1";
const ORDER_KEY: &str = "key-ord-1003";

/// The stores of one test: `orders` and `payments`, on one backend.
struct Stores {
    orders: TestDb,
    payments: TestDb,
}

/// Two empty, unmigrated stores.
async fn empty_stores<DB: TestBackend>() -> Stores {
    Stores {
        orders: DB::test_db().await,
        payments: DB::test_db().await,
    }
}

/// Two migrated stores holding the checkout demo's shape: the order under
/// `place-order.v1` in orders, its charge under `child(K, charge-card.v1)` in payments.
async fn checkout_stores<DB: TestBackend>() -> Stores {
    let stores = empty_stores::<DB>().await;
    for store in [&stores.orders, &stores.payments] {
        let out = idem(&["migrate", "--store", store.url()]);
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    run(
        &open::<DB>(&stores.orders).await,
        op(ORDER_KEY, "place-order.v1", 2500),
        r#"{"order_id":"ord-1003"}"#,
    )
    .await;
    run(
        &open::<DB>(&stores.payments).await,
        op(
            &child_key(ORDER_KEY, "charge-card.v1"),
            "create-payment.v1",
            2500,
        ),
        r#"{"payment_id":"pay_1"}"#,
    )
    .await;
    stores
}

fn op(key: &str, step: &'static str, amount: i64) -> Operation {
    Operation::new(
        Scope::tenant(TENANT),
        IdempotencyKey::new(key).unwrap(),
        step,
        &amount,
    )
}

/// An engine on `db`, as a service would open it.
async fn open<DB: TestBackend>(db: &TestDb) -> Engine<DB> {
    Engine::new(DB::pool(db.url(), &Policy::default()).await)
}

/// Runs `op` to completion, storing `answer`.
async fn run<DB: TestBackend>(engine: &Engine<DB>, op: Operation, answer: &str) {
    let answer: serde_json::Value = serde_json::from_str(answer).unwrap();
    engine
        .run(&op, async |_tx| Ok::<_, Problem>(answer))
        .await
        .unwrap();
}

/// Claims `op` durably and walks away: an `in_progress` record whose lock holds a minute.
async fn abandon<DB: TestBackend>(engine: &Engine<DB>, op: Operation) {
    let policy = Policy {
        claim_mode: ClaimMode::Durable,
        lock_ttl: Duration::from_secs(60),
        ..Policy::default()
    };
    drop(engine.claim(&op.with_policy(policy)).await.unwrap());
}

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

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

on_each_store! {
    stores: sqlite, postgres, mysql;
    #[tokio::test]
    migrate_reports_pending_then_applies,
    #[tokio::test]
    inspect_answers_was_i_charged_twice,
    #[tokio::test]
    inspect_flags_what_is_missing_or_running,
    #[tokio::test]
    keys_list_show_delete,
    #[tokio::test]
    purge_deletes_only_expired_records,
    #[tokio::test]
    steps_flags_live_keys_of_undeclared_steps,
}

async fn migrate_reports_pending_then_applies<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    // The schema as SQL, for other migration tools: no store needed.
    let script = idem_runtime::migrations::sql::<DB>();
    let out = idem(&["migrate", "--sql", DB::MODULE]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), script);
    assert!(script.contains("CREATE TABLE IF NOT EXISTS idempotency_keys"));
    let out = idem(&["migrate"]);
    assert_eq!(code(&out), 2, "{}", text(&out));

    let stores = empty_stores::<DB>().await;
    if let Some(path) = stores.orders.url().strip_prefix("sqlite://") {
        // A file that is not there is not created by a check.
        let out = idem(&["migrate", "--check", "--store", path]);
        assert_eq!(code(&out), 3, "{}", text(&out));
        assert!(!PathBuf::from(path).exists());
        let out = idem(&["migrate", "--store", path]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(text(&out).contains("applied"), "{}", text(&out));
        let out = idem(&["migrate", "--check", "--store", path]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(text(&out).contains("up to date"));
        return;
    }
    let expected = idem_runtime::migrations::migrator::<DB>().iter().count();
    let out = idem(&[
        "--json",
        "migrate",
        "--check",
        "--store",
        stores.orders.url(),
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert_eq!(json(&out)["pending"].as_array().unwrap().len(), expected);
    let out = idem(&["migrate", "--store", stores.orders.url()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = idem(&[
        "--json",
        "migrate",
        "--check",
        "--store",
        stores.orders.url(),
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(json(&out)["pending"].as_array().unwrap().is_empty());
}

async fn inspect_answers_was_i_charged_twice<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let stores = checkout_stores::<DB>().await;
    let orders = format!("orders={}", stores.orders.url());
    let payments = format!("payments={}", stores.payments.url());
    let args = [
        "inspect",
        "--key",
        ORDER_KEY,
        "--scope",
        TENANT,
        "--step",
        "charge-card.v1",
        "--store",
        &orders,
        "--store",
        &payments,
    ];
    let out = idem(&args);
    let shown = text(&out);
    assert_eq!(code(&out), 0, "{shown}");
    assert!(
        shown.contains("K in orders: completed once, response 200 (place-order.v1)"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "child(K, charge-card.v1) in payments: completed once, response 200 (create-payment.v1)"
        ),
        "{shown}"
    );
    assert!(shown.contains(r#"{"payment_id":"pay_1"}"#), "{shown}");
    assert!(
        !shown.contains(ORDER_KEY),
        "the key leaked without --show-keys: {shown}"
    );
    assert!(!shown.contains(&child_key(ORDER_KEY, "charge-card.v1")));
    let tag = IdempotencyKey::new(ORDER_KEY).unwrap().log_tag();
    assert!(shown.contains(&tag), "{shown}");

    let mut shown_keys = vec!["--show-keys"];
    shown_keys.extend(args);
    assert!(text(&idem(&shown_keys)).contains(ORDER_KEY));

    let mut as_json = vec!["--json"];
    as_json.extend(args);
    let out = idem(&as_json);
    let value = json(&out);
    assert_eq!(value["needs_attention"], false);
    let child = &value["root"]["children"][0];
    assert_eq!(child["path"], "child(K, charge-card.v1)");
    assert_eq!(child["records"][0]["store"], "payments");
    assert_eq!(child["records"][0]["status"], "completed");
    assert_eq!(child["records"][0]["response_status"], 200);
    assert!(value["root"].get("key").is_none());
    assert!(!String::from_utf8_lossy(&out.stdout).contains(ORDER_KEY));
}

async fn inspect_flags_what_is_missing_or_running<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let stores = checkout_stores::<DB>().await;
    let orders = format!("orders={}", stores.orders.url());
    let payments = format!("payments={}", stores.payments.url());
    // An order whose charge never reached payments, and whose own claim is still held.
    let engine = open::<DB>(&stores.orders).await;
    abandon(&engine, op("key-ord-2000", "place-order.v1", 10)).await;
    let out = idem(&[
        "inspect",
        "--key",
        "key-ord-2000",
        "--scope",
        TENANT,
        "--step",
        "charge-card.v1",
        "--store",
        &orders,
        "--store",
        &payments,
    ]);
    let shown = text(&out);
    assert_eq!(code(&out), 1, "{shown}");
    assert!(
        shown.contains("K in orders: in progress, the claim holds the key"),
        "{shown}"
    );
    assert!(
        shown.contains("child(K, charge-card.v1): no record in any store"),
        "{shown}"
    );
    // A key no store knows, and usage errors.
    let out = idem(&[
        "inspect", "--key", "nope", "--scope", TENANT, "--store", &orders,
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let out = idem(&["inspect", "--key", "k", "--store", &orders]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let out = idem(&[
        "inspect", "--key", "k", "--scope", TENANT, "--step", "Charge", "--store", &orders,
    ]);
    assert_eq!(code(&out), 2, "{}", text(&out));
}

async fn keys_list_show_delete<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let stores = checkout_stores::<DB>().await;
    let store = stores.orders.url();
    let engine = open::<DB>(&stores.orders).await;
    run(&engine, op("key-ord-1004", "place-order.v1", 990), "{}").await;

    let out = idem(&["--json", "keys", "list", "--store", store]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let records = json(&out)["records"].as_array().unwrap().clone();
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r["step"] == "place-order.v1"
        && r["status"] == "completed"
        && r.get("key").is_none()));
    let out = idem(&["keys", "list", "--store", store, "--status", "in_progress"]);
    assert!(text(&out).contains("0 record(s)"), "{}", text(&out));
    let out = idem(&["keys", "list", "--store", store, "--scope", "other-tenant"]);
    assert!(text(&out).contains("0 record(s)"), "{}", text(&out));

    let out = idem(&[
        "keys", "show", "--store", store, "--key", ORDER_KEY, "--scope", TENANT,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains(r#"{"order_id":"ord-1003"}"#));
    assert!(!text(&out).contains(ORDER_KEY));
    let out = idem(&[
        "keys", "show", "--store", store, "--key", "nope", "--scope", TENANT,
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));

    // Without --yes nothing goes.
    let out = idem(&[
        "keys", "delete", "--store", store, "--key", ORDER_KEY, "--scope", TENANT,
    ]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let out = idem(&[
        "keys", "show", "--store", store, "--key", ORDER_KEY, "--scope", TENANT,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = idem(&[
        "keys", "delete", "--store", store, "--key", ORDER_KEY, "--scope", TENANT, "--yes",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = idem(&[
        "keys", "show", "--store", store, "--key", ORDER_KEY, "--scope", TENANT,
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let out = idem(&["--json", "keys", "list", "--store", store]);
    assert_eq!(json(&out)["records"].as_array().unwrap().len(), 1);
}

async fn purge_deletes_only_expired_records<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let stores = checkout_stores::<DB>().await;
    let store = stores.orders.url();
    let engine = open::<DB>(&stores.orders).await;
    let short = Policy {
        retention: Duration::from_millis(1),
        ..Policy::default()
    };
    for i in 0..7 {
        run(
            &engine,
            op(&format!("gone-{i}"), "place-order.v1", i).with_policy(short),
            "{}",
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let out = idem(&["--json", "purge", "--dry-run", "--store", store]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["expired_records"], 7);
    let out = idem(&["--json", "purge", "--batch", "3", "--store", store]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["expired_records"], 7);
    let out = idem(&["purge", "--dry-run", "--store", store]);
    assert!(text(&out).contains("would delete 0"), "{}", text(&out));
    let out = idem(&["--json", "keys", "list", "--expired", "--store", store]);
    assert_eq!(json(&out)["records"].as_array().unwrap().len(), 1);
    let out = idem(&["purge", "--batch", "0", "--store", store]);
    assert_eq!(code(&out), 2, "{}", text(&out));
}

async fn steps_flags_live_keys_of_undeclared_steps<DB: TestBackend>(
    _store: impl AsyncFn(Policy) -> Harness<DB>,
) {
    let stores = checkout_stores::<DB>().await;
    let orders = format!("orders={}", stores.orders.url());
    let payments = format!("payments={}", stores.payments.url());
    let out = idem(&["steps", "--store", &orders, "--store", &payments]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("create-payment.v1"));

    let out = idem(&[
        "--json",
        "steps",
        "--store",
        &orders,
        "--store",
        &payments,
        "--declared",
        "place-order.v1",
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let value = json(&out);
    let problems = value["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1);
    assert!(problems[0].as_str().unwrap().contains("create-payment.v1"));

    let out = idem(&[
        "steps",
        "--store",
        &orders,
        "--store",
        &payments,
        "--declared",
        "place-order.v1,create-payment.v1",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // The example declares place-order.v1 and a retired charge-card.v1.
    let example = example_binary("declares_steps");
    let out = idem(&[
        "steps",
        "--store",
        &orders,
        "--declared-by",
        &example.display().to_string(),
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("declared"), "{}", text(&out));
    let out = idem(&[
        "steps",
        "--store",
        &payments,
        "--declared-by",
        &example.display().to_string(),
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains("LIVE KEYS, NOT DECLARED"));
}

#[tokio::test]
async fn an_unreachable_store_exits_3() {
    let out = idem(&[
        "keys",
        "list",
        "--store",
        "postgres://idem@127.0.0.1:1/none",
    ]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let out = idem(&["keys", "list", "--store", "/nonexistent/dir/idem.db"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let dir = tempfile::tempdir().unwrap();
    let unmigrated = dir.path().join("plain.db");
    std::fs::write(&unmigrated, b"").unwrap();
    let out = idem(&["keys", "list", "--store", &unmigrated.display().to_string()]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(text(&out).contains("idem migrate"), "{}", text(&out));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(code(&idem(&[])), 2);
    assert_eq!(code(&idem(&["keys", "list"])), 2);
    assert_eq!(code(&idem(&["inspect", "--key", "k"])), 2);
}

/// An example of this package; `cargo test` builds them next to the tests.
fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test -p idem-cli` builds it",
        path.display()
    );
    path
}
