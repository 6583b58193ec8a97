//! `idem tenant move`, run as a process against three shard databases on
//! the throwaway Postgres server: a tenant's keys and outbox messages moved
//! and replayed from the target, the command's errors and exit codes, and a
//! move killed at each of its fault points, which leaves the tenant routed
//! to one shard and the other fenced, and is finished by running it again.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::outbox::{self, Message};
use idem_runtime::shard::{DirectoryRouter, Shards};
use idem_runtime::{Engine, IdemError, IdempotencyKey, Operation, Problem, Scope, Step, Via};
use idem_test_support::postgres;
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
