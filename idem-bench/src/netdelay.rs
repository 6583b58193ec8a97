//! Latency as a user on a real network sees it: the unprotected write, the
//! guide's SQL and idem at one client, against Postgres through a loopback
//! proxy that delays every packet each way ([`crate::delay::DelayProxy`]).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::delay::DelayProxy;
use crate::measure::{drive, median};
use crate::pg::Pg;
use crate::target::{BenchError, Target};
use crate::throughput::{scenario_op, Scenario};

/// The delay each way, per packet.
pub const DELAY: Duration = Duration::from_micros(250);

/// p50 latency per scenario through the proxy.
#[derive(Debug, Clone, Serialize)]
pub struct NetDelayResult {
    /// The delay added each way, microseconds.
    pub delay_us: u64,
    /// Operations per scenario per round.
    pub ops: u64,
    /// `(scenario, median over rounds of the p50, microseconds)`.
    pub p50_us: Vec<(String, f64)>,
}

/// Runs `ops` operations of each scenario at one client, `rounds` times
/// interleaved, through a fresh proxy in front of `pg`'s server.
pub async fn run(
    pg: &Pg,
    ops: u64,
    rounds: usize,
    run_id: &str,
) -> Result<NetDelayResult, BenchError> {
    let proxy = DelayProxy::start(pg.address()?, DELAY)?;
    let target: Arc<dyn Target> = Arc::new(pg.through_port(proxy.port(), 2).await?);
    let scenarios = [
        Scenario::Unprotected,
        Scenario::SeedSql,
        Scenario::Idem,
        Scenario::Replay,
    ];
    // Warm the pool and the statement caches.
    for s in [Scenario::Unprotected, Scenario::SeedSql, Scenario::Idem] {
        drive(
            1,
            20,
            scenario_op(&target, s, format!("{run_id}-net-warm-{}", s.label())),
        )
        .await;
    }
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    for round in 0..rounds {
        for (n, &s) in scenarios.iter().enumerate() {
            let prefix = format!("{run_id}-net-{}-r{round}", s.label());
            if s == Scenario::Replay {
                let (_, err) =
                    drive(1, ops, scenario_op(&target, Scenario::Idem, prefix.clone())).await;
                if let Some(e) = err {
                    return Err(format!("network delay: replay preparation: {e}").into());
                }
            }
            let (sample, err) = drive(1, ops, scenario_op(&target, s, prefix)).await;
            if let Some(e) = err {
                return Err(format!("network delay: {}: {e}", s.label()).into());
            }
            p50s[n].push(sample.p50_us);
        }
    }
    let p50_us: Vec<(String, f64)> = scenarios
        .iter()
        .zip(p50s)
        .map(|(s, v)| (s.label().to_owned(), median(&v)))
        .collect();
    for (name, p50) in &p50_us {
        eprintln!(
            "  through a {} us each-way delay, 1 client: {name} p50 {:.0} us",
            DELAY.as_micros(),
            p50
        );
    }
    Ok(NetDelayResult {
        delay_us: DELAY.as_micros() as u64,
        ops,
        p50_us,
    })
}
