//! How many bytes one key record takes, on SQLite and Postgres, for sizing
//! retention (`docs/OPERATIONS.md`).
//!
//! ```text
//! cargo run --release --example row_size -- [--rows N] [--body-bytes B] [--database-url postgres://...]
//! ```
//!
//! Writes `N` completed records through the engine (a typical key: a UUID; a
//! typical stored response: a JSON body of about `B` bytes), then reads the key
//! table's size: on Postgres `pg_total_relation_size('idempotency_keys')`
//! (heap, TOAST and both indexes) after a `VACUUM`, on SQLite the pages of the
//! table and its index from `dbstat` when compiled in, else the whole file's
//! pages after a WAL checkpoint. The empty table's size is subtracted. Without
//! `--database-url` it starts a throwaway Postgres server (idem's test support).

use std::time::Instant;

use idem::{Engine, IdempotencyKey, Operation, Problem, Scope};
use serde_json::json;
use sqlx::{Postgres, Sqlite};

struct Args {
    rows: usize,
    body_bytes: usize,
    database_url: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut parsed = Args {
        rows: 20_000,
        body_bytes: 200,
        database_url: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--rows" => parsed.rows = value("--rows")?.parse().map_err(|e| format!("--rows: {e}"))?,
            "--body-bytes" => {
                parsed.body_bytes = value("--body-bytes")?
                    .parse()
                    .map_err(|e| format!("--body-bytes: {e}"))?
            }
            "--database-url" => parsed.database_url = Some(value("--database-url")?),
            other => {
                return Err(format!(
                    "unknown argument {other:?}\nusage: row_size [--rows N] [--body-bytes B] [--database-url postgres://...]"
                ))
            }
        }
    }
    Ok(parsed)
}

fn operation(i: usize) -> Operation {
    // A UUID-shaped key, as clients send.
    let key = format!("{:08x}-4b2d-4c1e-9a7f-{:012x}", i as u32, i as u64 * 7919);
    Operation::new(
        Scope::tenant("tenant-0042"),
        IdempotencyKey::new(key).expect("a valid key"),
        "create-payment.v1",
        &(i as i64),
    )
}

/// A stored answer whose JSON is about `bytes` long.
fn answer(i: usize, bytes: usize) -> serde_json::Value {
    let base = json!({ "payment_id": format!("pay_{i:032x}"), "amount_cents": 2500, "currency": "EUR", "status": "succeeded", "note": "" });
    let pad = bytes.saturating_sub(base.to_string().len());
    json!({ "payment_id": format!("pay_{i:032x}"), "amount_cents": 2500, "currency": "EUR", "status": "succeeded", "note": "x".repeat(pad) })
}

async fn fill_sqlite(args: &Args) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let engine = Engine::<Sqlite>::open_sqlite(dir.path().join("size.db")).await?;
    engine.migrate().await?;
    let before = sqlite_bytes(&engine).await?;
    for i in 0..args.rows {
        let body = answer(i, args.body_bytes);
        engine
            .run(&operation(i), async |_tx| Ok::<_, Problem>(body))
            .await?;
    }
    let after = sqlite_bytes(&engine).await?;
    Ok((before, after))
}

async fn sqlite_bytes(engine: &Engine<Sqlite>) -> Result<u64, sqlx::Error> {
    let pool = engine.pool();
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(pool)
        .await?;
    let dbstat: Result<i64, _> = sqlx::query_scalar(
        "SELECT CAST(sum(pgsize) AS BIGINT) FROM dbstat WHERE name IN ('idempotency_keys', 'idempotency_keys_expires_at', 'sqlite_autoindex_idempotency_keys_1')",
    )
    .fetch_one(pool)
    .await;
    if let Ok(bytes) = dbstat {
        eprintln!("sqlite: measured with dbstat");
        return Ok(bytes as u64);
    }
    eprintln!("sqlite: no dbstat; measured the file's pages");
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(pool)
        .await?;
    let size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(pool)
        .await?;
    Ok((pages * size) as u64)
}

async fn fill_postgres(args: &Args, url: &str) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let engine = Engine::<Postgres>::connect_postgres(url).await?;
    engine.migrate().await?;
    sqlx::query("TRUNCATE idempotency_keys")
        .execute(engine.pool())
        .await?;
    let before = postgres_bytes(&engine).await?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = (0..8).map(|_| async {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= args.rows {
                return Ok::<_, idem::IdemError>(());
            }
            let body = answer(i, args.body_bytes);
            engine
                .run(&operation(i), async |_tx| Ok::<_, Problem>(body))
                .await?;
        }
    });
    for done in futures::future::join_all(workers).await {
        done?;
    }
    let after = postgres_bytes(&engine).await?;
    Ok((before, after))
}

async fn postgres_bytes(engine: &Engine<Postgres>) -> Result<u64, sqlx::Error> {
    sqlx::query("VACUUM idempotency_keys")
        .execute(engine.pool())
        .await?;
    let bytes: i64 = sqlx::query_scalar("SELECT pg_total_relation_size('idempotency_keys')")
        .fetch_one(engine.pool())
        .await?;
    Ok(bytes as u64)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => idem_test_support::postgres().fresh_database().await,
    };
    println!(
        "{} records, a {}-byte JSON answer each",
        args.rows, args.body_bytes
    );
    println!("| backend | bytes per record | 1 M records |");
    println!("|---|---|---|");
    for backend in ["sqlite", "postgres"] {
        let started = Instant::now();
        let (before, after) = match backend {
            "sqlite" => fill_sqlite(&args).await?,
            _ => fill_postgres(&args, &url).await?,
        };
        let per_row = (after.saturating_sub(before)) as f64 / args.rows as f64;
        println!("| {backend} | {per_row:.0} | {:.0} MB |", per_row);
        eprintln!(
            "{backend}: filled in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
