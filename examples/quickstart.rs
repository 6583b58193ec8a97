//! A retried charge runs once: the engine API on an embedded SQLite file.
//!
//! `cargo run --example quickstart`

use idem::{Engine, IdemError, IdempotencyKey, Operation, Problem, Scope, Via};
use sqlx::Sqlite;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let engine = Engine::<Sqlite>::open_sqlite(dir.path().join("quickstart.db")).await?;
    engine.migrate().await?;
    sqlx::query("CREATE TABLE payments (tenant TEXT NOT NULL, amount_cents BIGINT NOT NULL)")
        .execute(engine.pool())
        .await?;

    let key = IdempotencyKey::new("3f6c1a2e-8b4d-4e7a-9c11-5d2f0b7e6a90")?;
    let charge = |amount_cents: i64| {
        Operation::new(
            Scope::tenant("acme"),
            key.clone(),
            "charge-card.v1",
            &amount_cents,
        )
    };

    println!("{:<34} answer", "attempt");
    for attempt in [
        "first attempt",
        "client retry (response lost)",
        "gateway retry",
    ] {
        let done = engine
            .run(&charge(2500), async |tx| {
                sqlx::query("INSERT INTO payments (tenant, amount_cents) VALUES ('acme', 2500)")
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, Problem>("charged 2500 cents".to_string())
            })
            .await?;
        let how = match done.via {
            Via::Replayed => "replayed",
            _ => "executed",
        };
        println!(
            "{attempt:<34} {how}: {}",
            done.value.unwrap_or_else(|p| p.to_string())
        );
    }

    let reused = engine
        .run(&charge(9999), async |_tx| {
            Ok::<_, Problem>("never runs".to_string())
        })
        .await;
    match reused {
        Err(error @ IdemError::Mismatch) => println!(
            "{:<34} {} ({error})",
            "same key, different amount",
            error.http_status()
        ),
        other => return Err(format!("expected a mismatch, got {other:?}").into()),
    }

    let charges: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments")
        .fetch_one(engine.pool())
        .await?;
    println!("\npayments rows: {charges} (three attempts, one charge)");
    if charges != 1 {
        return Err("expected exactly one charge".into());
    }
    Ok(())
}
