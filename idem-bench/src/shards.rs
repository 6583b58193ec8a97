//! Throughput through [`Shards`]: the `idem` fresh-key scenario ([`keyed`])
//! at a fixed number of clients through `Shards` over three Postgres
//! servers, through `Shards` over one, and through the bare engine of that
//! one server (what routing costs), in interleaved rounds. Operation `i`
//! belongs to tenant `i % TENANTS`, so the tenants spread over the shards;
//! each operation is counted against the shard it ran on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idem_runtime::shard::{HashRouter, Shards};
use idem_runtime::Via;
use idem_test_support::PgServer;
use serde::Serialize;
use sqlx::Postgres;

use crate::charge::keyed;
use crate::measure::{drive, median, op, OpFn};
use crate::pg::Pg;
use crate::target::BenchError;

/// Tenants the operations cycle through.
const TENANTS: u64 = 30;

/// The medians over rounds of one way of reaching the store.
#[derive(Debug, Clone, Serialize)]
pub struct ShardCell {
    /// `bare-engine`, `shards-1` or `shards-3`.
    pub setup: &'static str,
    /// Median throughput over rounds, operations per second.
    pub throughput: f64,
    /// Median p50 latency, microseconds.
    pub p50_us: f64,
    /// Median p99 latency, microseconds.
    pub p99_us: f64,
    /// Operations each shard ran, over all rounds, by shard index.
    pub ops_per_shard: Vec<u64>,
    /// Errors over all rounds.
    pub errors: u64,
}

/// The shards scenario's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ShardsResult {
    /// Concurrent clients.
    pub clients: usize,
    /// Tenants the operations cycle through.
    pub tenants: u64,
    /// One cell per setup.
    pub cells: Vec<ShardCell>,
    /// `shards-3` throughput over `shards-1`.
    pub three_over_one: f64,
    /// `shards-1` throughput over the bare engine: the routing cost.
    pub one_over_bare: f64,
}

/// One way of reaching the store: through `Shards` or the bare engine.
struct Setup {
    label: &'static str,
    shards: Option<Arc<Shards<Postgres>>>,
    bare: Pg,
    ran: Arc<Vec<AtomicU64>>,
}

impl Setup {
    fn op(&self, prefix: String) -> OpFn {
        let (shards, engine, ran) = (
            self.shards.clone(),
            self.bare.engine.clone(),
            self.ran.clone(),
        );
        op(move |i| {
            let (shards, engine, ran) = (shards.clone(), engine.clone(), ran.clone());
            let key = format!("{prefix}-{i}");
            let tenant = format!("tenant-{}", i % TENANTS);
            async move {
                let (index, engine) = match &shards {
                    Some(shards) => {
                        let scope = idem_runtime::Scope::tenant(&tenant);
                        let index = shards.index(&scope).await?;
                        (index, shards.engines()[index].clone())
                    }
                    None => (0, engine),
                };
                match keyed(&engine, key, tenant).await? {
                    Via::Executed => {
                        ran[index].fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    via => Err(format!("fresh key answered via {via}").into()),
                }
            }
        })
    }
}

/// Runs the three setups on `servers` (three), `rounds` times each,
/// interleaved, `ops` operations at `clients` clients.
pub async fn run(
    servers: &[PgServer],
    connections: u32,
    clients: usize,
    ops: u64,
    rounds: usize,
    run_id: &str,
) -> Result<ShardsResult, BenchError> {
    let mut pgs = Vec::new();
    for server in servers {
        pgs.push(Pg::setup(server, connections).await?);
    }
    let per_shard = |n: usize| Arc::new((0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    let three = Shards::new(pgs.iter().map(|pg| pg.engine.clone()).collect(), HashRouter);
    let one = Shards::new(vec![pgs[0].engine.clone()], HashRouter);
    let setups = [
        Setup {
            label: "bare-engine",
            shards: None,
            bare: pgs[0].clone(),
            ran: per_shard(1),
        },
        Setup {
            label: "shards-1",
            shards: Some(Arc::new(one)),
            bare: pgs[0].clone(),
            ran: per_shard(1),
        },
        Setup {
            label: "shards-3",
            shards: Some(Arc::new(three)),
            bare: pgs[0].clone(),
            ran: per_shard(pgs.len()),
        },
    ];
    let mut samples: Vec<Vec<_>> = setups.iter().map(|_| Vec::new()).collect();
    let mut errors = vec![0u64; setups.len()];
    for round in 0..rounds {
        for (index, setup) in setups.iter().enumerate() {
            let prefix = format!("{run_id}-shards-{}-{round}", setup.label);
            let (sample, error) = drive(clients, ops, setup.op(prefix)).await;
            if let Some(error) = error {
                eprintln!("  {}: {error}", setup.label);
            }
            errors[index] += sample.errors;
            samples[index].push(sample);
        }
    }
    let cells: Vec<ShardCell> = setups
        .iter()
        .zip(&samples)
        .zip(&errors)
        .map(|((setup, samples), &errors)| ShardCell {
            setup: setup.label,
            throughput: median(&samples.iter().map(|s| s.throughput).collect::<Vec<_>>()),
            p50_us: median(&samples.iter().map(|s| s.p50_us).collect::<Vec<_>>()),
            p99_us: median(&samples.iter().map(|s| s.p99_us).collect::<Vec<_>>()),
            ops_per_shard: setup
                .ran
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
            errors,
        })
        .collect();
    let ratio =
        |a: usize, b: usize| cells[a].throughput / cells[b].throughput.max(f64::MIN_POSITIVE);
    let result = ShardsResult {
        clients,
        tenants: TENANTS,
        three_over_one: ratio(2, 1),
        one_over_bare: ratio(1, 0),
        cells,
    };
    for cell in &result.cells {
        eprintln!(
            "  {:<12} {:>8.0} ops/s  p50 {:>6.0} us  p99 {:>7.0} us  ops per shard {:?}",
            cell.setup, cell.throughput, cell.p50_us, cell.p99_us, cell.ops_per_shard
        );
    }
    eprintln!(
        "  shards-3 / shards-1 {:.2}, shards-1 / bare engine {:.2}",
        result.three_over_one, result.one_over_bare
    );
    Ok(result)
}
