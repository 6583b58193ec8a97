//! The side-by-side throughput scenarios: unprotected, seed-sql, idem,
//! idem-macro and replay, at several client counts, in interleaved rounds.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_runtime::Via;
use serde::Serialize;

use crate::batches::{self, BatchSizes};
use crate::measure::{drive, median, op, OpFn, Sample};
use crate::target::{BenchError, Target, TENANT};

/// A throughput scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// `BEGIN; INSERT; COMMIT`.
    Unprotected,
    /// The same two rows written by one statement (no lock, no check): the floor.
    SameWrites,
    /// The guide's hand-written SQL.
    SeedSql,
    /// The engine API.
    Idem,
    /// An `#[idempotent]` handler.
    IdemMacro,
    /// The engine API with [`idem_runtime::KeyLock::Row`] (Postgres only).
    IdemRowLock,
    /// The engine API with group commit off (SQLite only): each claim in a
    /// transaction and a `COMMIT` of its own.
    IdemSolo,
    /// Repeats of completed keys, answered by the store (as another process
    /// without the keys in its replay cache is answered).
    Replay,
    /// Repeats of keys this process completed, through an engine with a
    /// replay cache.
    ReplayCached,
    /// The guide's SQL on the traffic of [`Scenario::Mixed`]: retries go
    /// through its conflict path.
    MixedSeedSql,
    /// 95 % fresh keys, 5 % retries of keys completed a moment before,
    /// through the engine.
    Mixed,
    /// [`Scenario::Mixed`] through an engine with a replay cache.
    MixedCached,
}

/// In the mixed scenarios, every 20th operation retries the key of the
/// operation 19 before it (completed a moment before, or still running with
/// many clients, when the retry waits for it).
const RETRY_EVERY: u64 = 20;

/// The key index operation `i` of a mixed scenario uses, and whether it is a
/// retry.
fn mixed_key(i: u64) -> (u64, bool) {
    if i % RETRY_EVERY == RETRY_EVERY - 1 {
        (i + 1 - RETRY_EVERY, true)
    } else {
        (i, false)
    }
}

impl Scenario {
    /// The name in tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::Unprotected => "unprotected",
            Scenario::SameWrites => "same-writes",
            Scenario::SeedSql => "seed-sql",
            Scenario::Idem => "idem",
            Scenario::IdemMacro => "idem-macro",
            Scenario::IdemRowLock => "idem-row-lock",
            Scenario::IdemSolo => "idem-solo",
            Scenario::Replay => "replay",
            Scenario::ReplayCached => "replay-cached",
            Scenario::MixedSeedSql => "mixed-seed-sql",
            Scenario::Mixed => "mixed",
            Scenario::MixedCached => "mixed-cached",
        }
    }
}

/// The medians over rounds of one (scenario, clients) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The scenario.
    pub scenario: &'static str,
    /// Concurrent clients.
    pub clients: usize,
    /// Median throughput over rounds, operations per second.
    pub throughput: f64,
    /// Median p50 latency, microseconds.
    pub p50_us: f64,
    /// Median p99 latency, microseconds.
    pub p99_us: f64,
    /// Every round's throughput, in order.
    pub rounds: Vec<f64>,
    /// Errors over all rounds.
    pub errors: u64,
    /// The group commits of all rounds (SQLite), if any.
    pub batches: Option<BatchSizes>,
}

/// Builds the operation for `scenario`. Keys are unique per run via `prefix`;
/// a replay run reuses the keys its preparation completed.
pub fn scenario_op(target: &Arc<dyn Target>, scenario: Scenario, prefix: String) -> OpFn {
    let t = target.clone();
    match scenario {
        Scenario::Unprotected => op(move |_| t.unprotected()),
        Scenario::SameWrites => op(move |i| t.same_writes(format!("{prefix}-{i}"))),
        Scenario::SeedSql => op(move |i| t.seed_sql(format!("{prefix}-{i}"))),
        Scenario::Idem | Scenario::IdemMacro | Scenario::IdemRowLock | Scenario::IdemSolo => {
            op(move |i| {
                let key = format!("{prefix}-{i}");
                let fut = match scenario {
                    Scenario::IdemMacro => t.idem_macro(key, TENANT.to_string()),
                    Scenario::IdemRowLock => t.idem_row_lock(key, TENANT.to_string()),
                    Scenario::IdemSolo => t.idem_solo(key, TENANT.to_string()),
                    _ => t.idem(key, TENANT.to_string()),
                };
                async move {
                    match fut.await {
                        Ok(Via::Executed) => Ok(()),
                        Ok(via) => Err(format!("fresh key answered via {}", via).into()),
                        Err(e) => Err(e.into()),
                    }
                }
            })
        }
        Scenario::MixedSeedSql => op(move |i| {
            let (k, _) = mixed_key(i);
            t.seed_sql_or_replay(format!("{prefix}-{k}"))
        }),
        Scenario::Mixed | Scenario::MixedCached => op(move |i| {
            let (k, retry) = mixed_key(i);
            let key = format!("{prefix}-{k}");
            let fut = if scenario == Scenario::MixedCached {
                t.idem_cached(key, TENANT.to_string())
            } else {
                t.idem(key, TENANT.to_string())
            };
            // A key that is retried may reach the store first through its
            // retry (many clients): then the retry executes and the first
            // attempt replays. Keys never retried must execute.
            let retried = retry || k % RETRY_EVERY == 0;
            async move {
                match (fut.await, retried) {
                    (Ok(Via::Executed), _) | (Ok(Via::Replayed), true) => Ok(()),
                    (Ok(via), _) => Err(format!("mixed: key {k} answered via {via}").into()),
                    (Err(e), _) => Err(e.into()),
                }
            }
        }),
        Scenario::Replay | Scenario::ReplayCached => op(move |i| {
            let key = format!("{prefix}-{i}");
            let fut = if scenario == Scenario::ReplayCached {
                t.idem_cached(key, TENANT.to_string())
            } else {
                t.idem(key, TENANT.to_string())
            };
            async move {
                match fut.await {
                    Ok(Via::Replayed) => Ok(()),
                    Ok(via) => Err(format!("completed key answered via {}", via).into()),
                    Err(e) => Err(e.into()),
                }
            }
        }),
    }
}

/// Completes keys `{prefix}-0..` through the plain or the caching engine
/// (the replay scenarios' preparation, not timed).
fn prepare_op(target: &Arc<dyn Target>, cached: bool, prefix: String) -> OpFn {
    let t = target.clone();
    op(move |i| {
        let key = format!("{prefix}-{i}");
        let fut = if cached {
            t.idem_cached(key, TENANT.to_string())
        } else {
            t.idem(key, TENANT.to_string())
        };
        async move {
            match fut.await {
                Ok(Via::Executed) => Ok(()),
                Ok(via) => Err(format!("fresh key answered via {via}").into()),
                Err(e) => Err(e.into()),
            }
        }
    })
}

/// How many operations one measurement runs at `clients`.
pub fn ops_for(base: u64, clients: usize) -> u64 {
    if clients <= 1 {
        (base / 3).max(5)
    } else {
        base
    }
}

/// Runs every scenario at every client count, `rounds` times (rotating the
/// scenario order each round), and returns the medians.
pub async fn run(
    target: Arc<dyn Target>,
    scenarios: &[Scenario],
    clients: &[usize],
    base_ops: u64,
    rounds: usize,
    run_id: &str,
) -> Result<Vec<Cell>, BenchError> {
    let mut samples: BTreeMap<(Scenario, usize), Vec<Sample>> = BTreeMap::new();
    let mut batches: BTreeMap<(Scenario, usize), BatchSizes> = BTreeMap::new();
    // Warm up the pool and the statement caches.
    for &s in scenarios {
        let (_, err) = drive(
            4,
            40,
            scenario_op(&target, s, format!("{run_id}-warm-{}", s.label())),
        )
        .await;
        if matches!(s, Scenario::Replay | Scenario::ReplayCached) {
            continue;
        }
        if let Some(e) = err {
            return Err(format!("{} warm-up on {}: {e}", s.label(), target.name()).into());
        }
    }
    for round in 0..rounds {
        for &c in clients {
            let ops = ops_for(base_ops, c);
            let mut order = scenarios.to_vec();
            let shift = round % order.len().max(1);
            order.rotate_left(shift);
            for s in order {
                let prefix = format!("{run_id}-{}-r{round}-c{c}", s.label());
                if matches!(s, Scenario::Replay | Scenario::ReplayCached) {
                    // Complete the keys first (not timed), then repeat them;
                    // the cached scenario completes them through its own
                    // engine, which keeps them.
                    let prepare = prepare_op(&target, s == Scenario::ReplayCached, prefix.clone());
                    let (_, err) = drive(c, ops, prepare).await;
                    if let Some(e) = err {
                        return Err(format!("replay preparation on {}: {e}", target.name()).into());
                    }
                }
                let ((sample, err), sizes) =
                    batches::recorded(drive(c, ops, scenario_op(&target, s, prefix))).await;
                if !sizes.is_empty() {
                    batches.entry((s, c)).or_default().add(&sizes);
                }
                if let Some(e) = &err {
                    eprintln!(
                        "  {} {} c={c}: {} errors, first: {e}",
                        target.name(),
                        s.label(),
                        sample.errors
                    );
                }
                eprintln!(
                    "  {:8} {:12} c={:<2} round {}: {:>8.0} ops/s  p50 {:>7.0} us  p99 {:>7.0} us",
                    target.name(),
                    s.label(),
                    c,
                    round + 1,
                    sample.throughput,
                    sample.p50_us,
                    sample.p99_us
                );
                samples.entry((s, c)).or_default().push(sample);
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|((s, c), v)| Cell {
            scenario: s.label(),
            clients: c,
            throughput: median(&v.iter().map(|x| x.throughput).collect::<Vec<_>>()),
            p50_us: median(&v.iter().map(|x| x.p50_us).collect::<Vec<_>>()),
            p99_us: median(&v.iter().map(|x| x.p99_us).collect::<Vec<_>>()),
            rounds: v.iter().map(|x| x.throughput).collect(),
            errors: v.iter().map(|x| x.errors).sum(),
            batches: batches.remove(&(s, c)),
        })
        .collect())
}
