//! `fingerprint`: the request hash idem computes against what a careful user
//! would write (`serde_json::to_vec` + SHA-256), in ns per call and heap
//! allocations per call.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use idem_runtime::fingerprint::fingerprint;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::alloc::allocations;

/// A typical request: 8 fields, two skipped, a 3-entry map.
#[derive(Debug, Clone, Serialize, idem::Fingerprint)]
pub struct ChargeRequest {
    amount_cents: i64,
    currency: String,
    customer_id: String,
    description: Option<String>,
    metadata: HashMap<String, String>,
    capture: bool,
    #[serde(skip)]
    #[fingerprint(skip)]
    #[allow(dead_code)] // skipped: never hashed
    requested_at: u64,
    #[serde(skip)]
    #[fingerprint(skip)]
    #[allow(dead_code)] // skipped: never hashed
    trace_id: String,
}

/// The same shape without heap-owning fields: the derive must not allocate.
#[derive(Debug, Clone, Copy, Serialize, idem::Fingerprint)]
pub struct FlatChargeRequest {
    amount_cents: i64,
    currency: [u8; 3],
    customer_id: u64,
    description: Option<&'static str>,
    installments: u32,
    capture: bool,
    #[serde(skip)]
    #[fingerprint(skip)]
    #[allow(dead_code)] // skipped: never hashed
    requested_at: u64,
    #[serde(skip)]
    #[fingerprint(skip)]
    #[allow(dead_code)] // skipped: never hashed
    trace_id: u128,
}

fn typical() -> ChargeRequest {
    let metadata = [
        ("order", "8812"),
        ("channel", "web"),
        ("campaign", "spring"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    ChargeRequest {
        amount_cents: 2500,
        currency: "EUR".into(),
        customer_id: "cus_8812".into(),
        description: Some("order 8812".into()),
        metadata,
        capture: true,
        requested_at: 1_764_000_000,
        trace_id: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    }
}

fn flat() -> FlatChargeRequest {
    FlatChargeRequest {
        amount_cents: 2500,
        currency: *b"EUR",
        customer_id: 8812,
        description: Some("order 8812"),
        installments: 1,
        capture: true,
        requested_at: 1_764_000_000,
        trace_id: 0x4bf9_2f35,
    }
}

/// One measured way of hashing a request.
#[derive(Debug, Clone, Serialize)]
pub struct HashCost {
    /// What was measured.
    pub name: &'static str,
    /// Nanoseconds per call (median of rounds).
    pub ns_per_call: f64,
    /// Heap allocations per call.
    pub allocs_per_call: f64,
}

/// The fingerprint scenario's results.
#[derive(Debug, Clone, Serialize)]
pub struct FingerprintResult {
    /// Each way measured.
    pub costs: Vec<HashCost>,
    /// serde_json+SHA-256 time / idem fingerprint time, typical struct.
    pub speedup: f64,
    /// Length of the typical request's JSON.
    pub json_bytes: usize,
}

fn measure(
    name: &'static str,
    iterations: u64,
    rounds: usize,
    mut f: impl FnMut() -> [u8; 32],
) -> HashCost {
    for _ in 0..iterations / 10 {
        black_box(f());
    }
    let mut per_round = Vec::with_capacity(rounds);
    let mut allocs = 0;
    for _ in 0..rounds {
        let a0 = allocations();
        let t = Instant::now();
        for _ in 0..iterations {
            black_box(f());
        }
        per_round.push(t.elapsed().as_nanos() as f64 / iterations as f64);
        allocs += allocations() - a0;
    }
    HashCost {
        name,
        ns_per_call: crate::measure::median(&per_round),
        allocs_per_call: allocs as f64 / (iterations as f64 * rounds as f64),
    }
}

/// Runs the scenario with `iterations` calls per round.
pub fn run(iterations: u64) -> FingerprintResult {
    let rounds = 5;
    let req = typical();
    let flat_req = flat();
    let idem = measure(
        "#[derive(Fingerprint)] (typical, 3-entry HashMap)",
        iterations,
        rounds,
        || *fingerprint("charge-card.v1", black_box(&req)).as_bytes(),
    );
    let serde = measure(
        "serde_json::to_vec + SHA-256 (typical)",
        iterations,
        rounds,
        || {
            let body = serde_json::to_vec(black_box(&req)).expect("serialize");
            Sha256::digest(body).into()
        },
    );
    let idem_flat = measure(
        "#[derive(Fingerprint)] (no heap-owning fields)",
        iterations,
        rounds,
        || *fingerprint("charge-card.v1", black_box(&flat_req)).as_bytes(),
    );
    let serde_flat = measure(
        "serde_json::to_vec + SHA-256 (no heap-owning fields)",
        iterations,
        rounds,
        || {
            let body = serde_json::to_vec(black_box(&flat_req)).expect("serialize");
            Sha256::digest(body).into()
        },
    );
    // Floors: SHA-256 alone over the JSON bytes, and over fixed lengths, so a
    // reader can see how much of each figure is the hash itself.
    let json = serde_json::to_vec(&req).expect("serialize");
    let sha_json = measure(
        "SHA-256 alone of the typical JSON bytes (floor of the serde path)",
        iterations,
        rounds,
        || Sha256::digest(black_box(&json[..])).into(),
    );
    let mut costs = vec![idem, serde, idem_flat, serde_flat, sha_json];
    for (name, len) in [
        ("SHA-256 alone of 55 bytes (one block)", 55usize),
        ("SHA-256 alone of 119 bytes (two blocks)", 119),
        ("SHA-256 alone of 311 bytes (five blocks)", 311),
    ] {
        let bytes = vec![0x5au8; len];
        costs.push(measure(name, iterations, rounds, || {
            Sha256::digest(black_box(&bytes[..])).into()
        }));
    }
    let speedup = costs[1].ns_per_call / costs[0].ns_per_call;
    FingerprintResult {
        json_bytes: json.len(),
        costs,
        speedup,
    }
}
