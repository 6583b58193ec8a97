//! The duplicate storm: many concurrent attempts with one key, for many keys.
//! Asserts exactly one execution per key; every other attempt is a replay or
//! a 409.

use std::sync::Arc;
use std::time::Instant;

use idem_runtime::{IdemError, Via};
use serde::Serialize;

use crate::measure::percentile;
use crate::target::{BenchError, Target};

/// The storm's result on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct StormResult {
    /// Keys stormed.
    pub keys: usize,
    /// Concurrent attempts per key.
    pub attempts_per_key: usize,
    /// Median wall time per key, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile wall time per key, milliseconds.
    pub p99_ms: f64,
    /// Executions (exactly `keys` when correct).
    pub executed: u64,
    /// Replays.
    pub replayed: u64,
    /// 409 answers.
    pub in_progress: u64,
    /// Anything else (must be 0).
    pub errors: u64,
}

/// Storms `keys` keys with `attempts` concurrent duplicates each, one key at a time.
pub async fn run(
    target: Arc<dyn Target>,
    keys: usize,
    attempts: usize,
    run_id: &str,
) -> Result<StormResult, BenchError> {
    let mut times = Vec::with_capacity(keys);
    let (mut executed, mut replayed, mut in_progress, mut errors) = (0, 0, 0, 0);
    let mut first_error = None;
    for k in 0..keys {
        let key = format!("{run_id}-storm-{k}");
        let tenant = format!("storm-{run_id}-{k}");
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..attempts {
            set.spawn(target.idem(key.clone(), tenant.clone()));
        }
        let mut key_executed = 0;
        while let Some(done) = set.join_next().await {
            match done.map_err(|e| format!("storm task: {e}"))? {
                Ok(Via::Executed | Via::TookOver) => key_executed += 1,
                Ok(Via::Replayed) => replayed += 1,
                Ok(Via::FailedOpen) => errors += 1,
                Err(IdemError::InProgress { .. }) => in_progress += 1,
                Err(e) => {
                    errors += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
        times.push(start.elapsed());
        let written = target.payments_for(tenant).await?;
        if key_executed != 1 || written != 1 {
            return Err(format!(
                "storm on {}: key {key} executed {key_executed} times, {written} payments written",
                target.name()
            )
            .into());
        }
        executed += key_executed;
    }
    if errors > 0 {
        return Err(format!(
            "storm on {}: {errors} errors, first: {first_error:?}",
            target.name()
        )
        .into());
    }
    times.sort_unstable();
    let ms = |d: f64| d / 1000.0;
    Ok(StormResult {
        keys,
        attempts_per_key: attempts,
        p50_ms: ms(percentile(&times, 0.5)),
        p99_ms: ms(percentile(&times, 0.99)),
        executed,
        replayed,
        in_progress,
        errors,
    })
}
