//! Cost as work grows (Postgres): `idem` and `replay` throughput with the key
//! table pre-filled, and `purge_expired` on expired rows while claims run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::measure::{drive, median};
use crate::pg::Pg;
use crate::target::{BenchError, Target, TENANT};
use crate::throughput::{self, Scenario};

/// Throughput at one table size.
#[derive(Debug, Clone, Serialize)]
pub struct GrowthPoint {
    /// Rows in `idempotency_keys` before the measurement.
    pub rows: u64,
    /// `idem` throughput, ops/s (median of rounds).
    pub idem: f64,
    /// `replay` throughput, ops/s (median of rounds).
    pub replay: f64,
    /// `idem` p99, microseconds.
    pub idem_p99_us: f64,
}

/// Purging expired rows while claims run.
#[derive(Debug, Clone, Serialize)]
pub struct PurgeResult {
    /// Expired rows present when purging started.
    pub expired_rows: u64,
    /// Rows purged.
    pub purged: u64,
    /// Seconds the purger ran (it runs in every other round of claims).
    pub secs: f64,
    /// Rows purged per second.
    pub rows_per_sec: f64,
    /// Batch size.
    pub batch: u32,
    /// Claims' p99 without purging, microseconds (median over the rounds
    /// between the purging ones).
    pub claims_p99_us_without: f64,
    /// Claims' p99 during purging, microseconds (median over the rounds that
    /// ran entirely while the purger was busy).
    pub claims_p99_us_during: f64,
    /// Claims' throughput without and during purging.
    pub claims_throughput_without: f64,
    /// Claims' throughput during purging.
    pub claims_throughput_during: f64,
}

/// Both parts.
#[derive(Debug, Clone, Serialize)]
pub struct GrowthResult {
    /// Client count used.
    pub clients: usize,
    /// One point per table size.
    pub points: Vec<GrowthPoint>,
    /// The purge measurement.
    pub purge: PurgeResult,
}

/// Rows `$1..=$2` of scope `$3`, expiring `$4` seconds from now, one
/// microsecond apart (as records written over time are, rather than all at
/// one instant).
const FILL: &str =
    "INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, \
     response_content_type, response_body, created_at, locked_until, expires_at) \
     SELECT $3, 'k' || g, 'charge-card.v1', sha256(convert_to(g::text, 'UTF8')), 'completed', 200, \
            'application/json', convert_to('{\"payment_id\": 1}', 'UTF8'), now(), now(), \
            now() + $4 * interval '1 second' + g * interval '1 microsecond' \
     FROM generate_series($1::int8, $2::int8) g";

async fn fill(
    pg: &Pg,
    scope: &str,
    from: u64,
    to: u64,
    expires_in_secs: f64,
) -> Result<(), BenchError> {
    let chunk = 1_000_000;
    let mut start = from;
    while start < to {
        let end = (start + chunk).min(to);
        sqlx::query(FILL)
            .bind(start as i64 + 1)
            .bind(end as i64)
            .bind(scope)
            .bind(expires_in_secs)
            .execute(&pg.pool)
            .await
            .map_err(|e| format!("prefill: {e}"))?;
        start = end;
    }
    // Settle before measuring: the fill's dead tuples, statistics and dirty
    // pages are the fill's cost, not the measured scenario's.
    for settle in ["VACUUM ANALYZE idempotency_keys", "CHECKPOINT"] {
        sqlx::query(settle)
            .execute(&pg.pool)
            .await
            .map_err(|e| format!("{settle}: {e}"))?;
    }
    Ok(())
}

async fn point(
    pg: &Pg,
    rows: u64,
    clients: usize,
    ops: u64,
    rounds: usize,
    run_id: &str,
) -> Result<GrowthPoint, BenchError> {
    let target: Arc<dyn Target> = Arc::new(pg.clone());
    let cells = throughput::run(
        target,
        &[Scenario::Idem, Scenario::Replay],
        &[clients],
        ops,
        rounds,
        &format!("{run_id}-g{rows}"),
    )
    .await?;
    let get = |s: &str| cells.iter().find(|c| c.scenario == s).cloned();
    let idem = get("idem").ok_or("no idem cell")?;
    let replay = get("replay").ok_or("no replay cell")?;
    Ok(GrowthPoint {
        rows,
        idem: idem.throughput,
        replay: replay.throughput,
        idem_p99_us: idem.p99_us,
    })
}

/// What the growth scenario measures.
#[derive(Debug, Clone)]
pub struct GrowthPlan {
    /// Key-table sizes to measure at, ascending.
    pub sizes: Vec<u64>,
    /// Expired rows to purge while claims run.
    pub purge_rows: u64,
    /// At most this long purging.
    pub purge_limit: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// Operations per measurement.
    pub ops: u64,
}

/// Measures at each of `plan.sizes` rows, then purges `plan.purge_rows`
/// expired rows while claims run, for at most `plan.purge_limit`.
pub async fn run(
    pg: &Pg,
    plan: &GrowthPlan,
    rounds: usize,
    run_id: &str,
) -> Result<GrowthResult, BenchError> {
    let GrowthPlan {
        sizes,
        purge_rows,
        purge_limit,
        clients,
        ops,
    } = plan.clone();
    let sizes = &sizes[..];
    let mut points = Vec::new();
    let mut filled = 0;
    for &rows in sizes {
        if rows > filled {
            let t = Instant::now();
            fill(pg, "tenant:prefill", filled, rows, 86_400.0).await?;
            eprintln!(
                "  prefilled {} rows in {:.1}s",
                rows - filled,
                t.elapsed().as_secs_f64()
            );
            filled = rows;
        }
        points.push(point(pg, rows, clients, ops, rounds, run_id).await?);
    }
    fill(pg, "tenant:expired", 0, purge_rows, -3600.0).await?;

    let claims = |tag: String| {
        let t: Arc<dyn Target> = Arc::new(pg.clone());
        crate::measure::op(move |i| {
            let fut = t.idem(format!("{tag}-{i}"), TENANT.to_string());
            async move { fut.await.map(|_| ()).map_err(Into::into) }
        })
    };
    // Rounds without and with the purger alternate, so both kinds see the
    // same server (checkpoint cycle, cache, table and index sizes). The
    // purger runs through each "during" round and is stopped after it; the
    // next call continues with what is left.
    let batch = 1000;
    let (mut without, mut during) = (Vec::new(), Vec::new());
    let mut purging = Duration::ZERO;
    let mut finished = false;
    let mut r = 0;
    while !finished && purging < purge_limit {
        let (s, _) = drive(clients, ops, claims(format!("{run_id}-nopurge-{r}"))).await;
        without.push(s);
        let engine = pg.engine.clone();
        let started = Instant::now();
        let purger = tokio::spawn(async move { engine.purge_expired(batch).await });
        let (s, _) = drive(clients, ops, claims(format!("{run_id}-purge-{r}"))).await;
        finished = purger.is_finished();
        if !finished {
            purger.abort();
        }
        match purger.await {
            Ok(Err(e)) => return Err(format!("purge_expired: {e}").into()),
            Ok(Ok(_)) => {}
            Err(e) if e.is_cancelled() => {}
            Err(e) => return Err(e.into()),
        }
        purging += started.elapsed();
        // A round the purge finished within ran partly without it.
        if !finished || during.is_empty() {
            during.push(s);
        }
        r += 1;
    }
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE scope = 'tenant:expired'")
            .fetch_one(&pg.pool)
            .await?;
    let purged = purge_rows.saturating_sub(left as u64);
    let secs = purging.as_secs_f64();
    Ok(GrowthResult {
        clients,
        points,
        purge: PurgeResult {
            expired_rows: purge_rows,
            purged,
            secs,
            rows_per_sec: purged as f64 / secs.max(1e-9),
            batch,
            claims_p99_us_without: median(&without.iter().map(|s| s.p99_us).collect::<Vec<_>>()),
            claims_p99_us_during: median(&during.iter().map(|s| s.p99_us).collect::<Vec<_>>()),
            claims_throughput_without: median(
                &without.iter().map(|s| s.throughput).collect::<Vec<_>>(),
            ),
            claims_throughput_during: median(
                &during.iter().map(|s| s.throughput).collect::<Vec<_>>(),
            ),
        },
    })
}
