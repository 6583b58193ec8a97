//! The startup registry check in one program: every problem at once, including
//! live keys in a real store for a step that is no longer declared. (One test
//! binary, because the registry is the whole program's.)

use idem::registry::{self, RegistryProblem};
use idem::{IdempotencyKey, Operation, Scope};

mod billing {
    idem::steps! {
        /// Declared here...
        pub const CHARGE = "charge.v1";
        /// Renamed from `refund.v1`, whose keys are still live (see below).
        pub const REFUND = "refund.v2";
        #[retired]
        pub const OLD_CHARGE = "charge-card.v1";
    }
}

mod payments {
    idem::steps! {
        /// ...and here again: a duplicate.
        pub const CHARGE = "charge.v1";
    }
}

mod handlers {
    use idem::sqlx::SqliteConnection;
    use idem::{idempotent, IdempotencyKey, Problem};

    /// Uses a step nobody declared.
    #[idempotent(scope = "tenant", step = "payout.v1")]
    pub async fn payout(
        tx: &mut SqliteConnection,
        tenant: String,
        key: IdempotencyKey,
        #[fingerprint] amount: i64,
    ) -> Result<i64, Problem> {
        let _ = tx;
        Ok(amount)
    }

    /// Uses a declared step.
    #[idempotent(scope = "tenant", step = super::billing::CHARGE)]
    pub async fn charge(
        tx: &mut SqliteConnection,
        tenant: String,
        key: IdempotencyKey,
        #[fingerprint] amount: i64,
    ) -> Result<i64, Problem> {
        let _ = tx;
        Ok(amount)
    }
}

/// Leaves a completed, unexpired record for `step` in the store.
async fn leave_key<DB: idem::Backend>(engine: &idem::Engine<DB>, step: &'static str) {
    let op = Operation::new(
        Scope::tenant("acme"),
        IdempotencyKey::new(step).unwrap(),
        step,
        &1i64,
    );
    match engine.claim(&op).await.unwrap() {
        idem::Claim::Execute(guard) => {
            guard.commit(Ok::<i64, idem::Problem>(1)).await.unwrap();
        }
        idem::Claim::Replay(_) => unreachable!(),
    }
}

fn expect_everything(problems: &[RegistryProblem], with_store: bool) {
    let names: Vec<String> = problems
        .iter()
        .map(|p| match p {
            RegistryProblem::Malformed { name, .. } => format!("malformed {name}"),
            RegistryProblem::DeclaredTwice { name, at } => {
                assert_eq!(at.len(), 2);
                assert!(
                    at.iter().any(|l| l.item.ends_with("billing::CHARGE")),
                    "{at:?}"
                );
                assert!(
                    at.iter().any(|l| l.item.ends_with("payments::CHARGE")),
                    "{at:?}"
                );
                assert!(
                    at.iter()
                        .all(|l| l.file.ends_with("registry.rs") && l.line > 0),
                    "{at:?}"
                );
                format!("twice {name}")
            }
            RegistryProblem::Undeclared { name, used_at } => {
                assert!(used_at[0].item.ends_with("handlers::payout"), "{used_at:?}");
                format!("undeclared {name}")
            }
            RegistryProblem::LiveKeysForUndeclaredStep { name } => format!("live {name}"),
            RegistryProblem::StoreUnavailable { error } => format!("store {error}"),
        })
        .collect();
    let mut expected = vec![
        "twice charge.v1".to_owned(),
        "undeclared payout.v1".to_owned(),
    ];
    if with_store {
        expected.push("live refund.v1".to_owned());
    }
    assert_eq!(names, expected);
}

#[test]
fn without_a_store() {
    let errors = registry::check().unwrap_err();
    expect_everything(&errors.problems, false);
    let report = errors.to_string();
    assert!(
        report.contains("step `payout.v1` is used but not declared"),
        "{report}"
    );
    assert!(registry::declared()
        .iter()
        .any(|d| d.name == "charge-card.v1" && d.retired));
    assert!(registry::used().iter().any(|u| u.name == "charge.v1"));
}

#[tokio::test]
async fn against_sqlite() {
    let (_dir, path) = idem_test_support::sqlite_file();
    let engine = idem::Engine::<idem::sqlx::Sqlite>::open_sqlite(path)
        .await
        .unwrap();
    engine.migrate().await.unwrap();
    leave_key(&engine, "refund.v1").await; // renamed away: a problem
    leave_key(&engine, "charge-card.v1").await; // retired but declared: fine
    leave_key(&engine, "charge.v1").await; // declared: fine
    let errors = registry::validate(&engine).await.unwrap_err();
    expect_everything(&errors.problems, true);
}

#[tokio::test]
async fn against_postgres() {
    let url = idem_test_support::postgres().fresh_database().await;
    let engine = idem::Engine::<idem::sqlx::Postgres>::connect_postgres(&url)
        .await
        .unwrap();
    engine.migrate().await.unwrap();
    leave_key(&engine, "refund.v1").await;
    leave_key(&engine, "charge-card.v1").await;
    let errors = registry::validate(&engine).await.unwrap_err();
    expect_everything(&errors.problems, true);
}

/// The problem a forgotten `engine.migrate()` leaves says so.
fn expect_migrate_first(errors: &registry::RegistryErrors) {
    let store = errors
        .problems
        .iter()
        .find_map(|problem| match problem {
            RegistryProblem::StoreUnavailable { error } => Some(error.as_str()),
            _ => None,
        })
        .expect("a store problem");
    assert!(store.contains("run `engine.migrate()` first"), "{store}");
    assert!(
        errors.to_string().contains("run `engine.migrate()` first"),
        "{errors}"
    );
}

#[tokio::test]
async fn unmigrated_sqlite_says_migrate_first() {
    let (_dir, path) = idem_test_support::sqlite_file();
    let engine = idem::Engine::<idem::sqlx::Sqlite>::open_sqlite(path)
        .await
        .unwrap();
    expect_migrate_first(&registry::validate(&engine).await.unwrap_err());
}

#[tokio::test]
async fn unmigrated_postgres_says_migrate_first() {
    let url = idem_test_support::postgres().fresh_database().await;
    let engine = idem::Engine::<idem::sqlx::Postgres>::connect_postgres(&url)
        .await
        .unwrap();
    expect_migrate_first(&registry::validate(&engine).await.unwrap_err());
}

#[tokio::test]
async fn against_mysql() {
    let url = idem_test_support::mysql().fresh_database().await;
    let engine = idem::Engine::<idem::sqlx::MySql>::connect_mysql(&url)
        .await
        .unwrap();
    engine.migrate().await.unwrap();
    leave_key(&engine, "refund.v1").await;
    leave_key(&engine, "charge-card.v1").await;
    let errors = registry::validate(&engine).await.unwrap_err();
    expect_everything(&errors.problems, true);
}

#[tokio::test]
async fn unmigrated_mysql_says_migrate_first() {
    let url = idem_test_support::mysql().fresh_database().await;
    let engine = idem::Engine::<idem::sqlx::MySql>::connect_mysql(&url)
        .await
        .unwrap();
    expect_migrate_first(&registry::validate(&engine).await.unwrap_err());
}
