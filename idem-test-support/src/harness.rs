//! What each test gets: an engine on its own store with a `payments`
//! business table, the tests' operation, and the crash tests' child process.

use std::process::{Command, ExitStatus};

use crate::{TestBackend, TestDb};
use idem_runtime::faults::FaultPoint;
use idem_runtime::{Engine, IdemError, IdempotencyKey, Operation, Policy, Problem, Scope, Via};

/// What each test gets: an engine on its own store.
pub struct Harness<DB: TestBackend> {
    /// The engine under test, on [`Harness::db`].
    pub engine: Engine<DB>,
    /// The store; a SQLite file lives as long as this.
    pub db: TestDb,
}

const CREATE_PAYMENTS: &str =
    "CREATE TABLE IF NOT EXISTS payments (tenant TEXT NOT NULL, amount BIGINT NOT NULL)";

impl<DB: TestBackend> Harness<DB> {
    /// An engine with `policy` on a fresh store, migrated, with the
    /// `payments` table.
    pub async fn new(policy: Policy) -> Self {
        let db = DB::test_db().await;
        let engine = Engine::new(DB::pool(db.url(), &policy).await).with_policy(policy);
        engine.migrate().await.expect("migrate");
        DB::execute(engine.pool(), CREATE_PAYMENTS).await;
        Harness { engine, db }
    }
}

/// The tests' operation: charging `amount` under `key`, scoped by `tenant`.
pub fn operation(tenant: &str, key: &str, amount: i64) -> Operation {
    Operation::new(
        Scope::tenant(tenant),
        IdempotencyKey::new(key).expect("key"),
        "charge-card.v1",
        &amount,
    )
}

/// Runs `op` with one payment row for `acme` as its work; answers how it
/// was answered.
pub async fn charge<DB: TestBackend>(h: &Harness<DB>, op: &Operation) -> Result<Via, IdemError> {
    h.engine
        .run(op, async |tx| {
            DB::insert_payment(tx, "acme", 1).await?;
            Ok::<i64, Problem>(1)
        })
        .await
        .map(|answer| answer.via)
}

impl<DB: TestBackend> Harness<DB> {
    /// The same store behind another engine.
    pub fn with_engine(self, engine: Engine<DB>) -> Self {
        Self { engine, ..self }
    }

    /// Rows in the business table: the side effects.
    pub async fn payments(&self) -> i64 {
        DB::count(self.engine.pool(), "SELECT COUNT(*) FROM payments").await
    }

    /// Rows in the key table.
    pub async fn records(&self) -> i64 {
        DB::count(self.engine.pool(), "SELECT COUNT(*) FROM idempotency_keys").await
    }

    /// Makes every claim fail as if the store were down, while business
    /// tables stay writable.
    pub async fn break_key_table(&self) {
        DB::execute(
            self.engine.pool(),
            "ALTER TABLE idempotency_keys RENAME TO idempotency_keys_gone",
        )
        .await;
    }

    /// Runs one charge in a child process that aborts at `mode`
    /// (`before-commit` or `after-commit`), or [`BATCH_CHILD_CHARGES`]
    /// concurrent ones (keys `{key}-0`…) that abort at a group commit's
    /// fault point (`batch-before-commit`, `batch-after-commit`), and returns
    /// how it exited.
    pub fn run_child(&self, mode: &str, tenant: &str, key: &str, amount: i64) -> ExitStatus {
        let exe = std::env::current_exe().expect("test binary");
        Command::new(exe)
            .args([
                "--exact",
                &format!("{}::child_process_entry", DB::MODULE),
                "--include-ignored",
                "--nocapture",
            ])
            .env("IDEM_CHILD_MODE", mode)
            .env("IDEM_CHILD_URL", self.db.url())
            .env("IDEM_CHILD_TENANT", tenant)
            .env("IDEM_CHILD_KEY", key)
            .env("IDEM_CHILD_AMOUNT", amount.to_string())
            .status()
            .expect("spawn child")
    }
}

/// How many concurrent charges a child started at a group commit's fault
/// point runs.
pub const BATCH_CHILD_CHARGES: usize = 8;

/// The child side of [`Harness::run_child`]: charges once, aborting where told,
/// on the backend `store` opens (only its type is used).
/// Does nothing unless started by `run_child`.
pub async fn child_entry<DB: TestBackend>(_store: impl AsyncFn(Policy) -> Harness<DB>) {
    let Ok(mode) = std::env::var("IDEM_CHILD_MODE") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let (url, tenant, key) = (
        var("IDEM_CHILD_URL"),
        var("IDEM_CHILD_TENANT"),
        var("IDEM_CHILD_KEY"),
    );
    let amount: i64 = var("IDEM_CHILD_AMOUNT").parse().expect("amount");
    let engine = Engine::new(DB::pool(&url, &Policy::default()).await);
    if let Ok(point @ (FaultPoint::BatchBeforeCommit | FaultPoint::BatchAfterCommit)) =
        mode.parse::<FaultPoint>()
    {
        // A group commit's fault point: a batch of concurrent charges,
        // `{key}-0` to `{key}-7`, and the process dies at its commit.
        let engine = engine.with_fault(point);
        let mut charges = tokio::task::JoinSet::new();
        for i in 0..BATCH_CHILD_CHARGES {
            let (engine, op) = (
                engine.clone(),
                operation(&tenant, &format!("{key}-{i}"), amount),
            );
            charges.spawn(async move {
                let scope = op.scope().to_string();
                engine
                    .run(&op, async move |tx| {
                        DB::insert_payment(tx, &scope, amount).await?;
                        Ok::<i64, Problem>(amount)
                    })
                    .await
            });
        }
        while charges.join_next().await.is_some() {}
        panic!("the batch committed without reaching {point}");
    }
    let op = operation(&tenant, &key, amount);
    let abort_before_commit = mode == "before-commit";
    let scope = op.scope().to_string();
    let done = engine
        .run(&op, async move |tx| {
            DB::insert_payment(tx, &scope, amount).await?;
            if abort_before_commit {
                std::process::abort();
            }
            Ok::<i64, Problem>(amount)
        })
        .await
        .expect("child charge");
    assert!(done.value.is_ok());
    // Committed; the response is never sent.
    std::process::abort();
}
