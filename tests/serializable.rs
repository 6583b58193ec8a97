//! Postgres at `default_transaction_isolation = serializable`, with business
//! writes that conflict (each reads the account's ledger and rewrites its
//! balance, so concurrent claims of different keys are a write skew the
//! database refuses): a serialization failure raised by the claim, the work
//! or the `COMMIT` commits nothing, never answers 500, never leaves a key
//! stuck, and never lets a key's work commit twice. [`Engine::run`] answers
//! it 503 + `Retry-After` for the client to retry; [`Engine::run_repeatable`]
//! runs the claim and the work again, at most `Policy::conflict_retries`
//! times.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{ClaimMode, Engine, IdemError, Operation, Policy, Problem, Via};
use sqlx::{PgPool, Postgres};

const KEYS: usize = 24;
/// Each key is sent by this many clients at once.
const COPIES: usize = 2;
/// The most attempts one client makes for one key before the test fails.
const ATTEMPTS: usize = 60;

async fn serializable_engine(policy: Policy) -> Engine<Postgres> {
    let server = idem_test_support::postgres();
    let url = server.fresh_database().await;
    let name = url.rsplit('/').next().unwrap().to_owned();
    let admin = PgPool::connect(&server.url("postgres")).await.unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE {name} SET default_transaction_isolation = 'serializable'"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let pool = idem_runtime::store::postgres::connect(&url, &policy, 12)
        .await
        .unwrap();
    let isolation: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(isolation, "serializable");
    let engine = Engine::new(pool).with_policy(policy);
    engine.migrate().await.unwrap();
    for sql in [
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)",
        "INSERT INTO accounts VALUES (1, 0)",
        "CREATE TABLE ledger (account int NOT NULL, key text NOT NULL, amount bigint NOT NULL)",
    ] {
        sqlx::query(sql).execute(engine.pool()).await.unwrap();
    }
    engine
}

/// The business write: read the ledger, append to it, rewrite the balance.
async fn debit(conn: &mut sqlx::PgConnection, key: &str) -> Result<i64, Problem> {
    let total: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(amount), 0)::int8 FROM ledger WHERE account = 1")
            .fetch_one(&mut *conn)
            .await?;
    sqlx::query("INSERT INTO ledger VALUES (1, $1, 5)")
        .bind(key)
        .execute(&mut *conn)
        .await?;
    sqlx::query("UPDATE accounts SET balance = $1 WHERE id = 1")
        .bind(total + 5)
        .execute(&mut *conn)
        .await?;
    Ok(total + 5)
}

#[derive(Default)]
struct Tally {
    /// Work started (the handler's body entered).
    worked: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    /// 503 + Retry-After for a conflict (the engine's or the work's).
    conflicts: AtomicU64,
    /// 409 while a duplicate ran.
    in_progress: AtomicU64,
}

/// One client's attempts for `key` until an answer that is not a 503 or a
/// 409; panics on anything else (a 500, the store unavailable).
async fn client(engine: Engine<Postgres>, key: String, repeatable: bool, tally: Arc<Tally>) {
    let op = Operation::new(
        idem_runtime::Scope::tenant("acme"),
        idem_runtime::IdempotencyKey::new(key.clone()).unwrap(),
        "debit.v1",
        &5i64,
    );
    for _ in 0..ATTEMPTS {
        let work = async |conn: &mut sqlx::PgConnection| {
            tally.worked.fetch_add(1, Ordering::Relaxed);
            debit(conn, &key).await
        };
        let answer = if repeatable {
            engine.run_repeatable(&op, work).await
        } else {
            engine.run(&op, work).await
        };
        match answer {
            Ok(answer) => match (&answer.value, answer.via) {
                (Ok(_), Via::Executed) => {
                    tally.executed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                (Ok(_), Via::Replayed) => {
                    tally.replayed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                (Err(problem), _)
                    if problem.status == 503
                        && problem.type_.ends_with("#transaction-conflict") =>
                {
                    tally.conflicts.fetch_add(1, Ordering::Relaxed);
                }
                other => panic!("{key}: unexpected answer {other:?}"),
            },
            Err(error @ IdemError::Conflict { .. }) => {
                assert_eq!(error.http_status(), 503);
                assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
                tally.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            Err(IdemError::InProgress { .. }) => {
                tally.in_progress.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => panic!(
                "{key}: unexpected error {error:?} ({})",
                error.http_status()
            ),
        }
        // The client honours Retry-After, shortened: the test is about
        // outcomes, not waiting.
        tokio::time::sleep(Duration::from_millis(5 + fastrand::u64(0..20))).await;
    }
    panic!("{key}: no answer after {ATTEMPTS} attempts (a stuck key)");
}

/// Runs `KEYS` keys, each sent by `COPIES` clients at once, and checks the
/// store after: one ledger row and one completed record per key, the
/// balance the ledger's sum, nothing in progress.
async fn conflicting_claims(policy: Policy, repeatable: bool) -> Arc<Tally> {
    let engine = serializable_engine(policy).await;
    let tally = Arc::new(Tally::default());
    let mut clients = Vec::new();
    for k in 0..KEYS {
        for _ in 0..COPIES {
            clients.push(client(
                engine.clone(),
                format!("k-{k}"),
                repeatable,
                tally.clone(),
            ));
        }
    }
    // Concurrent on one task: each client's transaction waits on the
    // database, not on the runtime.
    futures::future::join_all(clients).await;
    let pool = engine.pool();
    let count = async |sql: &str| -> i64 { sqlx::query_scalar(sql).fetch_one(pool).await.unwrap() };
    assert_eq!(count("SELECT count(*) FROM ledger").await, KEYS as i64);
    assert_eq!(
        count("SELECT count(DISTINCT key) FROM ledger").await,
        KEYS as i64
    );
    assert_eq!(
        count("SELECT balance FROM accounts WHERE id = 1").await,
        count("SELECT sum(amount)::int8 FROM ledger").await,
    );
    assert_eq!(
        count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'").await,
        KEYS as i64
    );
    assert_eq!(
        count("SELECT count(*) FROM idempotency_keys WHERE status = 'in_progress'").await,
        0
    );
    // Each key executed once; its other client replayed it.
    assert_eq!(tally.executed.load(Ordering::Relaxed), KEYS as u64);
    assert_eq!(
        tally.replayed.load(Ordering::Relaxed),
        (KEYS * (COPIES - 1)) as u64
    );
    eprintln!(
        "work started {}, executed {}, replayed {}, 503 conflicts {}, 409 {}",
        tally.worked.load(Ordering::Relaxed),
        tally.executed.load(Ordering::Relaxed),
        tally.replayed.load(Ordering::Relaxed),
        tally.conflicts.load(Ordering::Relaxed),
        tally.in_progress.load(Ordering::Relaxed),
    );
    tally
}

/// `run`: a conflict is answered 503 + `Retry-After`, and the client's
/// retry runs the key once or replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serialization_failure_is_a_503_and_nothing_commits() {
    let tally = conflicting_claims(Policy::default(), false).await;
    assert!(
        tally.conflicts.load(Ordering::Relaxed) > 0,
        "the workload raised no serialization failure"
    );
}

/// `run_repeatable`: the engine runs the claim and the work again itself,
/// so the clients see few conflicts or none, and still one commit per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serialization_failure_reruns_the_claim_and_work_within_the_bound() {
    let tally = conflicting_claims(Policy::default().with_conflict_retries(20), true).await;
    // The work ran more often than it committed: the engine re-ran it.
    assert!(tally.worked.load(Ordering::Relaxed) > KEYS as u64);
    assert_eq!(tally.conflicts.load(Ordering::Relaxed), 0);
}

/// A durable claim is never re-run in process (its work calls other
/// systems): its conflict is a 503, its in-progress row is released at
/// once, so the retry is not told 409 until the lock expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_durable_claims_conflict_frees_its_key() {
    let policy = Policy::default()
        .with_claim_mode(ClaimMode::Durable)
        .with_lock_ttl(Duration::from_secs(600));
    let tally = conflicting_claims(policy, true).await;
    assert!(tally.conflicts.load(Ordering::Relaxed) > 0);
}
