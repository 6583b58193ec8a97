//! The sizes of SQLite group commits: how many claims each `COMMIT`
//! answered, read from the engine's `idem_batch_claims` histogram.
//!
//! The bench installs a recorder as the process's metrics recorder:
//! it keeps that one histogram and drops every other metric, so the engine
//! pays no more for its metrics than it does without a recorder.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use idem_runtime::metrics::BATCH_CLAIMS;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use serde::Serialize;

/// The batch sizes recorded since they were last taken.
#[derive(Default)]
struct Sizes(Mutex<Vec<f64>>);

impl HistogramFn for Sizes {
    fn record(&self, value: f64) {
        self.0.lock().expect("batch sizes").push(value);
    }
}

/// A metrics recorder that keeps `idem_batch_claims` only.
#[derive(Clone, Default)]
struct BatchRecorder(Arc<Sizes>);

static RECORDER: OnceLock<BatchRecorder> = OnceLock::new();

/// Installs the batch recorder as the process's metrics recorder.
pub fn install() {
    let recorder = RECORDER.get_or_init(BatchRecorder::default).clone();
    // Fails only if a recorder is already installed: then it keeps recording.
    let _ = metrics::set_global_recorder(recorder);
}

/// Runs `work` and returns, with its output, the batch sizes recorded
/// while it ran (none before [`install`]).
pub async fn recorded<T>(work: impl Future<Output = T>) -> (T, Vec<f64>) {
    take();
    let output = work.await;
    (output, take())
}

/// The batch sizes recorded since the last call.
fn take() -> Vec<f64> {
    RECORDER.get().map_or_else(Vec::new, |r| {
        std::mem::take(&mut *r.0 .0.lock().expect("batch sizes"))
    })
}

impl Recorder for BatchRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() == BATCH_CLAIMS {
            Histogram::from_arc(self.0.clone())
        } else {
            Histogram::noop()
        }
    }
}

/// The upper bounds of the histogram's buckets: 1, 2, 3–4, 5–8, … 33–64.
pub const BUCKETS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

/// How many claims the commits of one measurement answered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BatchSizes {
    /// `COMMIT`s.
    pub commits: u64,
    /// Claims they answered.
    pub claims: u64,
    /// Commits per bucket of [`BUCKETS`] (a batch of `n` claims counts in
    /// the first bucket whose bound is at least `n`).
    pub histogram: [u64; 7],
}

impl BatchSizes {
    /// Adds the sizes of one measurement.
    pub fn add(&mut self, sizes: &[f64]) {
        for &size in sizes {
            let n = size as u32;
            let bucket = BUCKETS
                .iter()
                .position(|&b| n <= b)
                .unwrap_or(BUCKETS.len() - 1);
            self.histogram[bucket] += 1;
            self.commits += 1;
            self.claims += u64::from(n);
        }
    }

    /// Claims per commit.
    pub fn mean(&self) -> f64 {
        self.claims as f64 / self.commits.max(1) as f64
    }
}
