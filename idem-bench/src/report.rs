//! The results: one JSON document, and the same as markdown tables.

use std::fmt::Write as _;

use serde::Serialize;

use crate::fingerprint::FingerprintResult;
use crate::floors::FloorsResult;
use crate::growth::GrowthResult;
use crate::netdelay::NetDelayResult;
use crate::outbox::{OutboxResult, ENQUEUE_TARGET, LATENCY_P50_TARGET_MS, RELAY_TARGET};
use crate::storm::StormResult;
use crate::throughput::Cell;

/// One backend's results.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// Server or library version.
    pub version: String,
    /// Durability and pool settings in force.
    pub settings: Vec<(String, String)>,
    /// Median throughput and latency per (scenario, clients).
    pub cells: Vec<Cell>,
    /// The duplicate storm.
    pub storm: Option<StormResult>,
}

/// A ratio against its target.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// e.g. `idem / unprotected`.
    pub name: String,
    /// Backend.
    pub backend: String,
    /// Clients.
    pub clients: usize,
    /// Throughput ratio.
    pub value: f64,
    /// The target, if this cell has one.
    pub target: Option<f64>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `smoke`, `quick` or `full`.
    pub mode: String,
    /// Logical cores.
    pub cores: usize,
    /// Rounds per cell (the figures are medians over them).
    pub rounds: usize,
    /// Operations per measurement at 8+ clients (a third at 1 client).
    pub ops: u64,
    /// Per backend.
    pub backends: Vec<BackendReport>,
    /// The ratios.
    pub ratios: Vec<Ratio>,
    /// The fingerprint scenario.
    pub fingerprint: Option<FingerprintResult>,
    /// Growth and purge (Postgres).
    pub growth: Option<GrowthResult>,
    /// The outbox scenarios.
    pub outbox: Option<OutboxResult>,
    /// Postgres at one client through the delaying proxy.
    pub netdelay: Option<NetDelayResult>,
    /// What each statement of the fresh Postgres path costs (`--floors`).
    pub floors: Option<FloorsResult>,
    /// Throughput through 1 and 3 shards (`--only shards`).
    pub shards: Option<crate::shards::ShardsResult>,
}

fn throughput(b: &BackendReport, scenario: &str, clients: usize) -> Option<f64> {
    b.cells
        .iter()
        .find(|c| c.scenario == scenario && c.clients == clients)
        .map(|c| c.throughput)
}

/// The ratios the issue asks for, with their targets.
pub fn ratios(backends: &[BackendReport], clients: &[usize]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for b in backends {
        for &c in clients {
            let mut push = |name: &str, num: &str, den: &str, target: Option<f64>| {
                if let (Some(n), Some(d)) = (throughput(b, num, c), throughput(b, den, c)) {
                    out.push(Ratio {
                        name: name.into(),
                        backend: b.backend.clone(),
                        clients: c,
                        value: n / d,
                        target,
                    });
                }
            };
            // SQLite groups concurrent claims into one commit, so there it
            // is expected to beat the writes that commit one at a time.
            let sqlite = b.backend == "sqlite";
            let mysql = b.backend == "mysql";
            let unprotected_target = match (sqlite, c) {
                (_, 0..=7) => None,
                (true, 8..=31) => Some(2.0),
                (true, _) => Some(3.0),
                (false, _) => Some(0.85),
            };
            push(
                "idem / unprotected",
                "idem",
                "unprotected",
                unprotected_target,
            );
            let fresh_target = match (sqlite, c) {
                (true, 0..=7) => 0.95,
                (true, _) => 2.0,
                (false, _) if mysql => 1.1,
                (false, _) => 1.15,
            };
            push("idem / seed-sql", "idem", "seed-sql", Some(fresh_target));
            let mixed_target = match (sqlite, c) {
                (true, 0..=7) => None,
                (true, _) => Some(2.0),
                (false, _) => Some(1.15),
            };
            push(
                "mixed / mixed-seed-sql",
                "mixed",
                "mixed-seed-sql",
                mixed_target,
            );
            push("idem / idem-solo", "idem", "idem-solo", None);
            push(
                "mixed-cached / mixed-seed-sql",
                "mixed-cached",
                "mixed-seed-sql",
                Some(1.15),
            );
            push("idem-macro / idem", "idem-macro", "idem", Some(0.98));
            push("replay / unprotected", "replay", "unprotected", Some(1.5));
            push(
                "replay-cached / unprotected",
                "replay-cached",
                "unprotected",
                Some(10.0),
            );
            push("seed-sql / unprotected", "seed-sql", "unprotected", None);
            push(
                "same-writes / unprotected",
                "same-writes",
                "unprotected",
                None,
            );
            push("idem / same-writes", "idem", "same-writes", None);
            push(
                "idem-row-lock / unprotected",
                "idem-row-lock",
                "unprotected",
                None,
            );
        }
    }
    out
}

/// Markdown tables of the whole report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Mode `{}`, {} cores, medians of {} rounds, {} ops per cell ({} at 1 client).\n",
        r.mode,
        r.cores,
        r.rounds,
        r.ops,
        crate::throughput::ops_for(r.ops, 1)
    );
    for b in &r.backends {
        let settings: Vec<String> = b.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            s,
            "**{}** {} ({})\n",
            b.backend,
            b.version,
            settings.join(", ")
        );
        let _ = writeln!(
            s,
            "| scenario | clients | ops/s | p50 µs | p99 µs | × unprotected | rounds (ops/s) |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
        for c in &b.cells {
            let base = throughput(b, "unprotected", c.clients).unwrap_or(f64::NAN);
            let rounds: Vec<String> = c.rounds.iter().map(|x| format!("{x:.0}")).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {}{} |",
                c.scenario,
                c.clients,
                c.throughput,
                c.p50_us,
                c.p99_us,
                c.throughput / base,
                rounds.join(" / "),
                if c.errors > 0 {
                    format!(" ({} errors)", c.errors)
                } else {
                    String::new()
                }
            );
        }
        s.push('\n');
    }
    if !r.ratios.is_empty() {
        let _ = writeln!(s, "| ratio | backend | clients | value | target | met |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---|");
    }
    for x in &r.ratios {
        let (target, met) = match x.target {
            Some(t) => (
                format!("≥ {t}"),
                if x.value >= t { "yes" } else { "**no**" },
            ),
            None => ("–".into(), "–"),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} | {} |",
            x.name, x.backend, x.clients, x.value, target, met
        );
    }
    s.push('\n');
    if let Some(n) = &r.netdelay {
        let _ = writeln!(
            s,
            "| postgres through a {} µs each-way delay, 1 client | p50 µs |",
            n.delay_us
        );
        let _ = writeln!(s, "|---|---:|");
        for (name, p50) in &n.p50_us {
            let _ = writeln!(s, "| {name} | {p50:.0} |");
        }
        let p50 = |name: &str| n.p50_us.iter().find(|(x, _)| x == name).map(|(_, v)| *v);
        if let (Some(idem), Some(seed)) = (p50("idem"), p50("seed-sql")) {
            let _ = writeln!(
                s,
                "
idem p50 ÷ seed-sql p50 through the delay: **{:.2}** (target ≤ 1: {})\n",
                idem / seed,
                if idem <= seed { "met" } else { "**not met**" }
            );
        }
    }
    if let Some(f) = &r.floors {
        floors_table(&mut s, f);
    }
    batches_table(&mut s, r);
    let storms: Vec<&BackendReport> = r.backends.iter().filter(|b| b.storm.is_some()).collect();
    if !storms.is_empty() {
        let _ = writeln!(s, "| storm | keys × attempts | per-key p50 ms | per-key p99 ms | executed | replayed | 409 | errors |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|");
        for b in storms {
            let t = b.storm.as_ref().expect("filtered");
            let _ = writeln!(
                s,
                "| {} | {} × {} | {:.1} | {:.1} | {} | {} | {} | {} |",
                b.backend,
                t.keys,
                t.attempts_per_key,
                t.p50_ms,
                t.p99_ms,
                t.executed,
                t.replayed,
                t.in_progress,
                t.errors
            );
        }
        s.push('\n');
    }
    if let Some(f) = &r.fingerprint {
        let _ = writeln!(s, "| fingerprint | ns/call | allocations/call |");
        let _ = writeln!(s, "|---|---:|---:|");
        for c in &f.costs {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.2} |",
                c.name, c.ns_per_call, c.allocs_per_call
            );
        }
        let _ = writeln!(
            s,
            "\nserde_json + SHA-256 / idem fingerprint: **{:.2}×** (target ≥ 3×)\n",
            f.speedup
        );
    }
    if let Some(g) = &r.growth {
        let _ = writeln!(s, "| key table rows (postgres, {} clients) | idem ops/s | × at 0 rows | idem p99 µs | replay ops/s |", g.clients);
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|");
        let base = g.points.first().map(|p| p.idem).unwrap_or(f64::NAN);
        for p in &g.points {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.2} | {:.0} | {:.0} |",
                p.rows,
                p.idem,
                p.idem / base,
                p.idem_p99_us,
                p.replay
            );
        }
        let p = &g.purge;
        let _ = writeln!(
            s,
            "\npurge_expired (batch {}): {} of {} expired rows in {:.1}s = **{:.0} rows/s**; claims p99 {:.0} µs during vs {:.0} µs without (**{:.2}×**, target ≤ 1.5×); claims {:.0} ops/s during vs {:.0} without.\n",
            p.batch,
            p.purged,
            p.expired_rows,
            p.secs,
            p.rows_per_sec,
            p.claims_p99_us_during,
            p.claims_p99_us_without,
            p.claims_p99_us_during / p.claims_p99_us_without,
            p.claims_throughput_during,
            p.claims_throughput_without
        );
    }
    if let Some(o) = &r.outbox {
        outbox_markdown(&mut s, o);
    }
    s
}

fn outbox_markdown(s: &mut String, o: &OutboxResult) {
    let verdict = |ok: bool| if ok { "meets" } else { "misses" };
    let _ = writeln!(s, "| outbox enqueue | clients | handler ops/s | handler + enqueue ops/s | ratio (target ≥ {ENQUEUE_TARGET}) |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    for e in &o.enqueue {
        let backend = match e.claims_per_commit {
            Some((plain, with)) => format!(
                "{} (claims per commit {plain:.1} without, {with:.1} with)",
                e.backend
            ),
            None => e.backend.clone(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.0} | **{:.2}** ({}) |",
            backend,
            e.clients,
            e.plain_ops_s,
            e.enqueue_ops_s,
            e.ratio,
            verdict(e.ratio >= ENQUEUE_TARGET)
        );
    }
    if let Some(skipped) = &o.skipped {
        let _ = writeln!(
            s,
            "
JetStream scenarios skipped: {skipped}
"
        );
        return;
    }
    if let Some(t) = &o.relay {
        let _ = writeln!(
            s,
            "
| relay → JetStream (postgres outbox, {} messages) | msg/s | ÷ raw publish-with-ack ({:.0} msg/s), target ≥ {RELAY_TARGET} |",
            t.messages, t.raw_msgs_s
        );
        let _ = writeln!(s, "|---|---:|---:|");
        for (relays, rate, ratio) in &t.relays {
            let _ = writeln!(
                s,
                "| {relays} relay(s) | {rate:.0} | **{ratio:.2}** ({}) |",
                verdict(*ratio >= RELAY_TARGET)
            );
        }
    }
    if let Some(l) = &o.latency {
        let _ = writeln!(
            s,
            "
enqueue → publish at {}/s ({} messages, postgres outbox, one relay): p50 **{:.1} ms** ({} target ≤ {LATENCY_P50_TARGET_MS} ms), p99 {:.1} ms\n",
            l.rate,
            l.messages,
            l.p50_ms,
            verdict(l.p50_ms <= LATENCY_P50_TARGET_MS),
            l.p99_ms
        );
    }
}

/// The group commits of each SQLite cell that had any: commits, claims per
/// commit, and the histogram of batch sizes.
fn batches_table(s: &mut String, r: &Report) {
    let rows: Vec<(&str, &Cell)> = r
        .backends
        .iter()
        .flat_map(|b| b.cells.iter().map(move |c| (b.backend.as_str(), c)))
        .filter(|(_, c)| c.batches.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    let bounds: Vec<String> = crate::batches::BUCKETS
        .iter()
        .scan(0, |low, &high| {
            let label = if *low + 1 == high {
                high.to_string()
            } else {
                format!("{}–{high}", *low + 1)
            };
            *low = high;
            Some(label)
        })
        .collect();
    let _ = writeln!(
        s,
        "| group commit | scenario | clients | commits | claims per commit | {} |",
        bounds.join(" | ")
    );
    let _ = writeln!(
        s,
        "|---|---|---:|---:|---:|{}",
        "---:|".repeat(bounds.len())
    );
    for (backend, c) in rows {
        let b = c.batches.as_ref().expect("filtered");
        let histogram: Vec<String> = b.histogram.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "| {backend} | {} | {} | {} | {:.1} | {} |",
            c.scenario,
            c.clients,
            b.commits,
            b.mean(),
            histogram.join(" | ")
        );
    }
    s.push('\n');
}

/// The `--floors` table: a row per variant, a column per client count, each
/// cell the median (and quartiles) of the variant ÷ the guide's SQL.
fn floors_table(s: &mut String, f: &FloorsResult) {
    let mut clients: Vec<usize> = f.rows.iter().map(|row| row.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let _ = writeln!(
        s,
        "Postgres, the fresh path a statement at a time: ops/s ÷ the guide's SQL's in the \
         same round, median (quartiles) of {} rounds\n",
        f.rounds
    );
    let header: Vec<String> = clients
        .iter()
        .map(|&c| format!("{c} client{}", if c == 1 { "" } else { "s" }))
        .collect();
    let _ = writeln!(s, "| variant | {} |", header.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(clients.len()));
    let mut variants: Vec<&str> = Vec::new();
    for row in &f.rows {
        if !variants.contains(&row.variant) {
            variants.push(row.variant);
        }
    }
    for variant in variants {
        let cells: Vec<String> = clients
            .iter()
            .map(|&c| {
                f.rows
                    .iter()
                    .find(|row| row.variant == variant && row.clients == c)
                    .map_or("–".into(), |row| {
                        format!("{:.2} ({:.2}–{:.2})", row.median, row.q1, row.q3)
                    })
            })
            .collect();
        let _ = writeln!(s, "| {variant} | {} |", cells.join(" | "));
    }
    s.push('\n');
}
