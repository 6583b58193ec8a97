//! Drives a fixed number of operations from N concurrent clients and records
//! each operation's latency.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::target::BenchError;

/// One operation, numbered; `Err` is counted, not fatal.
pub type OpFn =
    Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = Result<(), BenchError>> + Send>> + Send + Sync>;

/// Wraps an async closure as an [`OpFn`].
pub fn op<F, Fut>(f: F) -> OpFn
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

/// What one measurement produced.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Sample {
    /// Operations that succeeded.
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Wall time of the whole run.
    pub secs: f64,
    /// Successful operations per second.
    pub throughput: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
}

/// Runs `ops` operations from `clients` concurrent tasks; each task takes the
/// next number until all are taken.
pub async fn drive(clients: usize, ops: u64, f: OpFn) -> (Sample, Option<BenchError>) {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients.max(1) {
        let next = next.clone();
        let f = f.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity((ops as usize / clients.max(1)) + 1);
            let mut errors = 0u64;
            let mut first_error = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    break;
                }
                let t = Instant::now();
                match f(i).await {
                    Ok(()) => latencies.push(t.elapsed()),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
            (latencies, errors, first_error)
        });
    }
    let mut all = Vec::with_capacity(ops as usize);
    let mut errors = 0;
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        let (latencies, e, first) = done.expect("client task panicked");
        all.extend(latencies);
        errors += e;
        if first_error.is_none() {
            first_error = first;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    (summarize(&mut all, errors, secs), first_error)
}

/// Throughput and percentiles of a set of latencies.
pub fn summarize(latencies: &mut [Duration], errors: u64, secs: f64) -> Sample {
    latencies.sort_unstable();
    let ops = latencies.len() as u64;
    Sample {
        ops,
        errors,
        secs,
        throughput: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
        p50_us: percentile(latencies, 0.50),
        p99_us: percentile(latencies, 0.99),
    }
}

/// The `q` quantile of sorted latencies, in microseconds (nearest rank).
pub fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e6
}

/// The median of a few values (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_median() {
        let mut l: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = summarize(&mut l, 0, 1.0);
        assert_eq!(s.p50_us.round(), 50.0);
        assert_eq!(s.p99_us.round(), 99.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
