//! `idem tenant move`, run as a process against three shard databases on
//! the throwaway Postgres server: a tenant's keys and outbox messages moved
//! and replayed from the target, the command's errors and exit codes, and a
//! move killed at each of its fault points, which leaves the tenant routed
//! to one shard and the other fenced, and is finished by running it again.
//! Then `idem keys` and `idem inspect` over the shards of a config file:
//! one service routed by the directory, one by the hash router.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::outbox::{self, Message};
use idem_runtime::shard::{DirectoryRouter, HashRouter, Router, Shards, TenantMove};
use idem_runtime::{
    child_key, Engine, IdemError, IdempotencyKey, Operation, Problem, Scope, Step, Via,
};
use idem_test_support::postgres;
use serde_json::Value;
use sqlx::Postgres;

const NOTIFY: Step = Step::new("notify.v1");
const KEYS: [&str; 3] = ["k-0", "k-1", "k-2"];

/// Three migrated shard databases, the directory on the first, and the
/// tenant `acme` on shard 0 with three completed keys, each with an outbox
/// message.
struct Fixture {
    urls: Vec<String>,
    shards: Shards<Postgres, DirectoryRouter>,
    executed: AtomicUsize,
}

impl Fixture {
    async fn new() -> Self {
        let mut urls = Vec::new();
        let mut engines = Vec::new();
        for _ in 0..3 {
            let url = postgres().fresh_database().await;
            let engine = Engine::<Postgres>::connect_postgres(&url).await.unwrap();
            engine.migrate().await.unwrap();
            urls.push(url);
            engines.push(engine);
        }
        let directory = DirectoryRouter::new(engines[0].pool().clone());
        directory.create_table().await.unwrap();
        directory.assign("acme", 0).await.unwrap();
        let fixture = Self {
            urls,
            shards: Shards::new(engines, directory),
            executed: AtomicUsize::new(0),
        };
        for key in KEYS {
            let (answer, via) = fixture.charge(key).await.unwrap();
            assert_eq!((answer, via), (format!("paid {key}"), Via::Executed));
        }
        fixture
    }

    /// A charge of `acme` under `key` on its shard, enqueuing one message.
    async fn charge(&self, key: &str) -> Result<(String, Via), IdemError> {
        let op = Operation::new(
            Scope::tenant("acme"),
            IdempotencyKey::new(key).unwrap(),
            "charge.v1",
            &2500,
        );
        let engine = self.shards.engine(op.scope()).await?;
        let message = Message::to("events", "ledger")
            .body("text/plain", key.as_bytes().to_vec())
            .for_step(op.key(), NOTIFY)
            .scope(op.scope());
        let done = engine
            .run(&op, async |tx| {
                self.executed.fetch_add(1, Ordering::SeqCst);
                outbox::enqueue(&mut *tx, &message)
                    .await
                    .map_err(|e| Problem::new(500, "enqueue failed").with_detail(e.to_string()))?;
                Ok::<_, Problem>(format!("paid {key}"))
            })
            .await?;
        Ok((done.value.unwrap(), done.via))
    }

    /// `idem tenant move --tenant acme --to 2` on the fixture's databases, then `extra`.
    fn move_acme(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "tenant",
            "move",
            "--tenant",
            "acme",
            "--to",
            "2",
            "--directory",
            &self.urls[0],
        ];
        for url in &self.urls {
            args.extend(["--shard", url.as_str()]);
        }
        args.extend(extra);
        idem(&args)
    }

    /// `acme`'s (key records, unsent outbox messages) on each shard.
    async fn rows(&self) -> Vec<(i64, i64)> {
        let scope = Scope::tenant("acme");
        let mut rows = Vec::new();
        for engine in self.shards.engines() {
            let keys: i64 =
                sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE scope = $1")
                    .bind(scope.as_stored())
                    .fetch_one(engine.pool())
                    .await
                    .unwrap();
            let messages: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM idem_outbox WHERE scope = $1 AND state <> 'sent'",
            )
            .bind(scope.as_stored())
            .fetch_one(engine.pool())
            .await
            .unwrap();
            rows.push((keys, messages));
        }
        rows
    }

    /// The stored response bodies of `acme` on shard `index`, by key.
    async fn bodies(&self, index: usize) -> Vec<Vec<u8>> {
        sqlx::query_scalar(
            "SELECT response_body FROM idempotency_keys WHERE scope = $1 ORDER BY key",
        )
        .bind(Scope::tenant("acme").as_stored())
        .fetch_all(self.shards.engines()[index].pool())
        .await
        .unwrap()
    }

    /// Whether shard `index` refuses a new write of `acme` (its fence).
    async fn refuses_writes(&self, index: usize) -> bool {
        let op = Operation::new(
            Scope::tenant("acme"),
            IdempotencyKey::new("stale-route").unwrap(),
            "charge.v1",
            &1,
        );
        match self.shards.engines()[index]
            .run(&op, async |_tx| Ok::<_, Problem>(1))
            .await
        {
            Err(error @ IdemError::Unavailable { .. }) => error.http_status() == 503,
            Ok(_) => false,
            Err(error) => panic!("{error}"),
        }
    }

    /// After a completed move: acme served by shard 2 alone, every key
    /// replayed from there byte for byte, nothing run again, nothing left
    /// on shard 0, every message on shard 2 once.
    async fn assert_moved(&self, bodies_before: &[Vec<u8>]) {
        assert_eq!(self.shards.index(&Scope::tenant("acme")).await.unwrap(), 2);
        assert_eq!(self.rows().await, vec![(0, 0), (0, 0), (3, 3)]);
        assert_eq!(self.bodies(2).await, bodies_before);
        let executed = self.executed.load(Ordering::SeqCst);
        for key in KEYS {
            let (answer, via) = self.charge(key).await.unwrap();
            assert_eq!((answer, via), (format!("paid {key}"), Via::Replayed));
        }
        assert_eq!(self.executed.load(Ordering::SeqCst), executed);
        assert!(self.refuses_writes(0).await, "the old shard still fenced");
    }
}

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_CONFIG")
        .env_remove("IDEM_DIRECTORY")
        .output()
        .expect("run idem")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_move_moves_a_tenant_and_its_retries_replay() {
    let fixture = Fixture::new().await;
    let bodies = fixture.bodies(0).await;
    let out = fixture.move_acme(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report,
        serde_json::json!({"tenant": "acme", "from": 0, "to": 2, "keys": 3, "messages": 3,
                           "already_there": false})
    );
    fixture.assert_moved(&bodies).await;

    // Again: nothing to do.
    let out = fixture.move_acme(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("tenant acme: already on shard 2"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_move_refuses_bad_arguments_with_exit_codes() {
    let fixture = Fixture::new().await;
    let shards: Vec<&str> = fixture
        .urls
        .iter()
        .flat_map(|url| ["--shard", url.as_str()])
        .collect();
    let run = |tenant: &str, to: &str, directory: &str, extra: &[&str]| {
        let mut args = vec![
            "tenant",
            "move",
            "--tenant",
            tenant,
            "--to",
            to,
            "--directory",
            directory,
        ];
        args.extend(&shards);
        args.extend(extra);
        idem(&args)
    };
    let directory = fixture.urls[0].as_str();

    let out = run("acme", "3", directory, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("shard 3 does not exist: there are 3 shards"),
        "{}",
        text(&out)
    );

    let out = run("nobody", "1", directory, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("\"nobody\" is not in the directory"),
        "{}",
        text(&out)
    );

    let out = run("acme", "1", "mysql://127.0.0.1/idem", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("is not a postgres:// URL"),
        "{}",
        text(&out)
    );

    let out = run("acme", "1", "postgres://idem@127.0.0.1:1/none", &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("directory: cannot open"),
        "{}",
        text(&out)
    );

    let out = idem(&["tenant", "move", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out).contains("--shard <URL>"), "{}", text(&out));

    // Nothing moved.
    assert_eq!(fixture.rows().await, vec![(3, 3), (0, 0), (0, 0)]);
    assert_eq!(
        fixture.shards.index(&Scope::tenant("acme")).await.unwrap(),
        0
    );
}

/// The move killed at `point`, checked, then run again to its end.
async fn killed_at(point: &str) {
    let fixture = Fixture::new().await;
    let bodies = fixture.bodies(0).await;
    let out = fixture.move_acme(&["--fault", point]);
    assert!(
        !out.status.success(),
        "{point}: the move was not killed: {}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("idem fault injection: aborting {point}")),
        "{point}: {}",
        text(&out)
    );

    // One shard serves the tenant; the other refuses its writes.
    let routed = fixture.shards.index(&Scope::tenant("acme")).await;
    let rows = fixture.rows().await;
    match point {
        "tenant-move-after-fence" | "tenant-move-after-copy" => {
            // Still routed to shard 0, fenced there: every request a 503.
            assert!(
                matches!(routed, Err(IdemError::Unavailable { .. })),
                "{point}: {routed:?}"
            );
            assert!(matches!(
                fixture.charge("k-0").await,
                Err(IdemError::Unavailable { .. })
            ));
            assert!(
                fixture.refuses_writes(0).await,
                "{point}: shard 0 not fenced"
            );
            let copied = if point == "tenant-move-after-copy" {
                (3, 3)
            } else {
                (0, 0)
            };
            assert_eq!(rows, vec![(3, 3), (0, 0), copied], "{point}");
        }
        "tenant-move-after-flip" => {
            assert_eq!(routed.unwrap(), 2);
            assert_eq!(rows, vec![(3, 3), (0, 0), (3, 3)], "{point}");
            assert!(
                fixture.refuses_writes(0).await,
                "{point}: shard 0 not fenced"
            );
            let (_, via) = fixture.charge("k-0").await.unwrap();
            assert_eq!(via, Via::Replayed, "{point}: served by the target");
        }
        "tenant-move-after-delete" => {
            assert_eq!(routed.unwrap(), 2);
            assert_eq!(rows, vec![(0, 0), (0, 0), (3, 3)], "{point}");
            assert!(
                fixture.refuses_writes(0).await,
                "{point}: shard 0 not fenced"
            );
        }
        other => panic!("no checks for {other}"),
    }

    let out = fixture.move_acme(&[]);
    assert_eq!(out.status.code(), Some(0), "{point}: {}", text(&out));
    fixture.assert_moved(&bodies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_fence_is_finished_by_running_it_again() {
    killed_at("tenant-move-after-fence").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_copy_is_finished_by_running_it_again() {
    killed_at("tenant-move-after-copy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_flip_is_finished_by_running_it_again() {
    killed_at("tenant-move-after-flip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_delete_is_finished_by_running_it_again() {
    killed_at("tenant-move-after-delete").await;
}

/// Three migrated databases, as one service's shards.
async fn shard_engines() -> (Vec<String>, Vec<Engine<Postgres>>) {
    let mut urls = Vec::new();
    let mut engines = Vec::new();
    for _ in 0..3 {
        let url = postgres().fresh_database().await;
        let engine = Engine::<Postgres>::connect_postgres(&url).await.unwrap();
        engine.migrate().await.unwrap();
        urls.push(url);
        engines.push(engine);
    }
    (urls, engines)
}

/// Runs `step` of `tenant` under `key` on the shard `shards` route it to; that shard.
async fn write<R: Router>(
    shards: &Shards<Postgres, R>,
    tenant: &str,
    key: &str,
    step: &'static str,
) -> usize {
    let op = Operation::new(
        Scope::tenant(tenant),
        IdempotencyKey::new(key).unwrap(),
        step,
        &1,
    );
    let shard = shards.index(op.scope()).await.unwrap();
    shards.engines()[shard]
        .run(&op, async |_tx| Ok::<_, Problem>(format!("{tenant} {key}")))
        .await
        .unwrap();
    // Distinct creation times, so the newest-first order is one order.
    tokio::time::sleep(Duration::from_millis(5)).await;
    shard
}

/// `idem.toml` in `dir`: `orders` on `hashed` (the hash router), `payments`
/// on the fixture's shards and its directory.
fn write_config(dir: &Path, hashed: &[String], fixture: &Fixture) -> PathBuf {
    let list = |urls: &[String]| {
        let quoted: Vec<String> = urls.iter().map(|url| format!("{url:?}")).collect();
        quoted.join(", ")
    };
    let path = dir.join("idem.toml");
    let text = format!(
        "[services.orders]\nshards = [{}]\n\n[services.payments]\nshards = [{}]\ndirectory = {:?}\n",
        list(hashed),
        list(&fixture.urls),
        fixture.urls[0]
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_inspect_read_every_shard_of_a_config() {
    let fixture = Fixture::new().await;
    let (hashed_urls, engines) = shard_engines().await;
    let orders = Shards::new(engines, HashRouter);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &hashed_urls, &fixture);
    let config = config.to_str().unwrap();

    // Six tenants of orders, two per shard, written so that the newest
    // three are on three different shards.
    let mut by_shard: [Vec<String>; 3] = Default::default();
    for n in 0.. {
        let tenant = format!("t-{n}");
        let shard = HashRouter::index(&tenant, 3);
        if by_shard[shard].len() < 2 {
            by_shard[shard].push(tenant);
        }
        if by_shard.iter().all(|tenants| tenants.len() == 2) {
            break;
        }
    }
    let mut written = Vec::new();
    for round in 0..2 {
        for tenants in &by_shard {
            let tenant = &tenants[round];
            let shard = write(&orders, tenant, "order-1", "place-order.v1").await;
            written.push((tenant.clone(), shard));
        }
    }

    // One listing across the shards, each row with its shard.
    let list = |extra: &[&str]| {
        let mut args = vec![
            "--json",
            "keys",
            "list",
            "--config",
            config,
            "--service",
            "orders",
        ];
        args.extend(extra);
        let out = idem(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        stdout_json(&out)
    };
    let rows = |listing: &Value| -> Vec<(String, u64)> {
        listing["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["scope"].as_str().unwrap().to_owned(),
                    r["shard"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let newest_first: Vec<(String, u64)> = written
        .iter()
        .rev()
        .map(|(tenant, shard)| (Scope::tenant(tenant).as_stored().to_owned(), *shard as u64))
        .collect();
    let all = list(&[]);
    assert_eq!(all["shards"], 3);
    assert_eq!(rows(&all), newest_first);
    // --limit holds across the shards: the three newest, one per shard.
    assert_eq!(rows(&list(&["--limit", "3"])), newest_first[..3]);
    let out = idem(&[
        "keys",
        "list",
        "--config",
        config,
        "--service",
        "orders",
        "--limit",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.starts_with("shard  key"), "{shown}");
    assert!(
        shown.contains("2 record(s) in orders (3 shards)"),
        "{shown}"
    );

    // show: found on the tenant's shard, named.
    let (tenant, shard) = &written[4];
    let show = |service: &str, tenant: &str, key: &str| {
        idem(&[
            "keys",
            "show",
            "--config",
            config,
            "--service",
            service,
            "--scope",
            tenant,
            "--key",
            key,
        ])
    };
    let out = show("orders", tenant, "order-1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("tenant {tenant}: shard {shard} (hash router)")),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("shard        {shard} (the tenant's shard)")),
        "{}",
        text(&out)
    );
    let out = show("orders", tenant, "order-2");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    // The directory service: acme listed on shard 0, initech not listed.
    let out = show("payments", "acme", "k-1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("tenant acme: shard 0 (directory)"),
        "{}",
        text(&out)
    );
    let initech = write(&fixture.shards, "initech", "k-9", "charge.v1").await;
    let out = show("payments", "initech", "k-9");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "tenant initech: shard {initech} (not in the directory: placed by the hash of its name)"
        )),
        "{}",
        text(&out)
    );

    // inspect over both sharded services and a store of one: the order in
    // orders on acme's hash shard, its charge in payments on acme's
    // directory shard, with its outbox message, and a ledger entry.
    let order = "order-acme-1";
    let acme_orders = write(&orders, "acme", order, "place-order.v1").await;
    let charge = child_key(order, "charge-card.v1");
    fixture.charge(&charge).await.unwrap();
    let ledger_url = postgres().fresh_database().await;
    let ledger = Engine::<Postgres>::connect_postgres(&ledger_url)
        .await
        .unwrap();
    ledger.migrate().await.unwrap();
    let ledger_store = format!("ledger={ledger_url}");
    let inspect = |extra: &[&str]| {
        let mut args = vec![
            "inspect",
            "--config",
            config,
            "--store",
            &ledger_store,
            "--scope",
            "acme",
            "--key",
            order,
            "--step",
            "charge-card.v1",
        ];
        args.extend(extra);
        idem(&args)
    };
    let out = inspect(&[]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    for line in [
        format!("orders: tenant acme: shard {acme_orders} (hash router)"),
        "payments: tenant acme: shard 0 (directory)".to_owned(),
        format!("orders shard {acme_orders}: completed place-order.v1"),
        format!("K in orders shard {acme_orders}: completed once, response 200 (place-order.v1)"),
        "child(K, charge-card.v1) in payments shard 0: completed once, response 200 (charge.v1)"
            .to_owned(),
        "child(K, charge-card.v1) in payments shard 0 outbox: notify.v1 message".to_owned(),
    ] {
        assert!(shown.contains(&line), "no {line:?} in\n{shown}");
    }
    let value = stdout_json(&inspect(&["--json"]));
    assert_eq!(value["routes"]["payments"]["shard"], 0);
    let child = &value["root"]["children"][0];
    assert_eq!(child["records"][0]["store"], "payments");
    assert_eq!(child["records"][0]["shard"], 0);
    assert_eq!(child["outbox"][0]["shard"], 0);
    assert_eq!(value["root"]["records"][0]["shard"], acme_orders);

    // acme moved by the library to shard 2: found there, listed there.
    TenantMove::new("acme", 2)
        .run(&fixture.shards)
        .await
        .unwrap();
    let out = show("payments", "acme", "k-1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("tenant acme: shard 2 (directory)"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("shard        2 (the tenant's shard)"),
        "{}",
        text(&out)
    );
    let scope = Scope::tenant("acme");
    let listing = stdout_json(&idem(&[
        "--json",
        "keys",
        "list",
        "--config",
        config,
        "--service",
        "payments",
        "--scope",
        "acme",
    ]));
    let shards: Vec<&Value> = listing["records"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|r| assert_eq!(r["scope"], scope.as_stored()))
        .map(|r| &r["shard"])
        .collect();
    assert_eq!(shards, vec![&Value::from(2); 4]);
    let out = inspect(&[]);
    assert!(
        text(&out).contains("child(K, charge-card.v1) in payments shard 2: completed once"),
        "{}",
        text(&out)
    );

    // The directory put back by hand: the records are off the tenant's
    // route, which is said, with exit 1, and they are not deleted.
    fixture.shards.router().assign("acme", 0).await.unwrap();
    let out = show("payments", "acme", "k-1");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("shard        0 (the tenant's shard): no record"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(
            "is on shard 2, and tenant acme is routed to shard 0: a move was interrupted"
        ),
        "{}",
        text(&out)
    );
    let out = idem(&[
        "keys",
        "delete",
        "--config",
        config,
        "--service",
        "payments",
        "--scope",
        "acme",
        "--key",
        "k-1",
        "--yes",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not deleted there"), "{}", text(&out));
    assert_eq!(fixture.bodies(2).await.len(), 4);
    fixture.shards.router().assign("acme", 2).await.unwrap();

    // A move run from the config and killed after its flip: both shards
    // hold the tenant's records, each said why; running it again finishes.
    let globex = |extra: &[&str]| {
        let mut args = vec![
            "tenant",
            "move",
            "--tenant",
            "globex",
            "--to",
            "1",
            "--config",
            config,
            "--service",
            "payments",
        ];
        args.extend(extra);
        idem(&args)
    };
    fixture.shards.router().assign("globex", 0).await.unwrap();
    write(&fixture.shards, "globex", "g-1", "charge.v1").await;
    let out = globex(&["--fault", "tenant-move-after-copy"]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = show("payments", "globex", "g-1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for line in [
        "tenant globex: shard 0 (directory), moving to shard 1",
        "shard        0 (the tenant's shard)",
        "shard        1 (the target of the tenant's unfinished move)",
    ] {
        assert!(text(&out).contains(line), "no {line:?} in\n{}", text(&out));
    }
    let out = globex(&["--fault", "tenant-move-after-flip"]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = show("payments", "globex", "g-1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for line in [
        "tenant globex: shard 1 (directory), moved from shard 0",
        "shard        1 (the tenant's shard)",
        "shard        0 (the source of the tenant's unfinished move: the move deletes this copy)",
    ] {
        assert!(text(&out).contains(line), "no {line:?} in\n{}", text(&out));
    }
    let out = globex(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = show("payments", "globex", "g-1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("shard        0"), "{}", text(&out));

    // delete on the tenant's shard.
    let (tenant, shard) = &written[0];
    let out = idem(&[
        "--json",
        "keys",
        "delete",
        "--config",
        config,
        "--service",
        "orders",
        "--scope",
        tenant,
        "--key",
        "order-1",
        "--yes",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(stdout_json(&out)["shards"], serde_json::json!([shard]));
    assert_eq!(show("orders", tenant, "order-1").status.code(), Some(1));

    // A record of a hash-routed tenant on another shard: said, exit 1.
    let (tenant, shard) = &written[1];
    let elsewhere = (shard + 1) % 3;
    let op = Operation::new(
        Scope::tenant(tenant),
        IdempotencyKey::new("order-9").unwrap(),
        "place-order.v1",
        &1,
    );
    orders.engines()[elsewhere]
        .run(&op, async |_tx| Ok::<_, Problem>(1))
        .await
        .unwrap();
    let out = show("orders", tenant, "order-9");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "is on shard {elsewhere}, and tenant {tenant} is routed to shard {shard}: the shards \
             were listed in another order"
        )),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn a_bad_config_is_exit_2_and_an_unreachable_shard_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let list = |config: &str| idem(&["keys", "list", "--config", config]);

    let malformed = write("malformed.toml", "[services.orders\nstore = 1\n");
    let out = list(&malformed);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("idem: config "), "{}", text(&out));

    let no_store = write(
        "empty.toml",
        "[services.orders]\ndirectory = \"postgres://h/d\"\n",
    );
    let out = list(&no_store);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("service orders names no store"),
        "{}",
        text(&out)
    );

    let out = list(&dir.path().join("missing.toml").to_string_lossy());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("cannot read it"), "{}", text(&out));

    let reachable = postgres().fresh_database().await;
    Engine::<Postgres>::connect_postgres(&reachable)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let down = write(
        "down.toml",
        &format!(
            "[services.orders]\nshards = [{reachable:?}, \"postgres://idem@127.0.0.1:1/none\"]\n"
        ),
    );
    let out = list(&down);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("store orders shard 1: cannot open"),
        "{}",
        text(&out)
    );
    // inspect reads the tenant's shard only: exit 3 when it is the one down.
    let tenant_on = |shard: usize| {
        (0..)
            .map(|n| format!("t-{n}"))
            .find(|tenant| HashRouter::index(tenant, 2) == shard)
            .unwrap()
    };
    let inspect = |tenant: &str| {
        idem(&[
            "inspect", "--config", &down, "--scope", tenant, "--key", "k",
        ])
    };
    let out = inspect(&tenant_on(1));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("store orders shard 1: cannot open"),
        "{}",
        text(&out)
    );
    let out = inspect(&tenant_on(0));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("K: no record in any store"),
        "{}",
        text(&out)
    );
}
