//! `idem-bench`: idem against the unprotected write and the guide's
//! hand-written SQL, side by side, in one run, on a throwaway Postgres, a
//! throwaway MariaDB server and a SQLite file.
//!
//! ```text
//! cargo run --release -p idem-bench -- [--smoke | --quick] [--rounds N] [--ops N]
//!     [--growth] [--out docs/bench-results.json] [--svg docs/bench.svg] [--md FILE]
//! cargo run --release -p idem-bench -- --floors [--rounds N] [--ops N] [--clients 1,8,32]
//! ```
//!
//! `--floors` runs only the fresh Postgres path a statement at a time
//! ([`floors`]). See `docs/BENCHMARKS.md`.

mod alloc;
mod batches;
mod charge;
mod delay;
mod fingerprint;
mod floors;
mod growth;
mod lite;
mod measure;
mod my;
mod netdelay;
mod outbox;
mod pg;
mod report;
mod shards;
mod storm;
mod svg;
mod target;
mod throughput;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::postgres::Pooler;
use idem_test_support::{MySqlServer, PgServer};

use report::{BackendReport, Report};
use target::{BenchError, Target};
use throughput::Scenario;

/// Clients of the shards scenario.
const SHARD_CLIENTS: usize = 32;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

/// Sizes of one run.
#[derive(Debug, Clone)]
struct Config {
    mode: &'static str,
    rounds: usize,
    ops: u64,
    clients: Vec<usize>,
    storm_keys: usize,
    storm_attempts: usize,
    fingerprint_iterations: u64,
    growth: Option<(Vec<u64>, u64, Duration)>,
    out: Option<String>,
    svg: Option<String>,
    md: Option<String>,
    only: Option<String>,
    /// Only these throughput scenarios (by label), for profiling one of them.
    scenarios: Option<Vec<String>>,
    /// Price each statement of the fresh Postgres path.
    floors: bool,
    /// A database to measure instead of a throwaway server (through a
    /// pooler, say): only the Postgres throughput scenarios and the storm run.
    database_url: Option<String>,
    /// Where that database is migrated from (a direct connection); the
    /// database URL itself by default.
    setup_url: Option<String>,
    /// What stands between the pools and that database.
    pooler: Pooler,
}

fn parse_args() -> Result<Config, BenchError> {
    let mut cfg = Config {
        mode: "full",
        rounds: 3,
        ops: 2000,
        clients: vec![1, 8, 32],
        storm_keys: 30,
        storm_attempts: 64,
        fingerprint_iterations: 200_000,
        growth: None,
        out: None,
        svg: None,
        md: None,
        only: None,
        scenarios: None,
        floors: false,
        database_url: None,
        setup_url: None,
        pooler: Pooler::Session,
    };
    let mut growth = false;
    let mut growth_sizes = vec![0, 1_000_000, 5_000_000];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--smoke" => {
                cfg.mode = "smoke";
                cfg.rounds = 1;
                cfg.ops = 60;
                cfg.storm_keys = 2;
                cfg.storm_attempts = 16;
                cfg.fingerprint_iterations = 2_000;
                cfg.growth = Some((vec![0, 1_000, 5_000], 2_000, Duration::from_secs(10)));
                cfg.floors = true;
            }
            "--quick" => {
                cfg.mode = "quick";
                cfg.rounds = 1;
                cfg.ops = 1000;
                cfg.storm_keys = 10;
            }
            "--growth" => growth = true,
            "--floors" => {
                cfg.floors = true;
                cfg.only = Some("floors".into());
            }
            "--growth-sizes" => {
                growth_sizes = value("--growth-sizes")?
                    .split(',')
                    .map(|n| n.trim().parse().map_err(|e| format!("--growth-sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--rounds" => {
                cfg.rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "--ops" => cfg.ops = value("--ops")?.parse().map_err(|e| format!("--ops: {e}"))?,
            "--out" => cfg.out = Some(value("--out")?),
            "--svg" => cfg.svg = Some(value("--svg")?),
            "--md" => cfg.md = Some(value("--md")?),
            "--only" => cfg.only = Some(value("--only")?),
            "--database-url" => cfg.database_url = Some(value("--database-url")?),
            "--setup-url" => cfg.setup_url = Some(value("--setup-url")?),
            "--pooler" => {
                cfg.pooler = match value("--pooler")?.as_str() {
                    "session" => Pooler::Session,
                    "transaction" => Pooler::Transaction,
                    other => {
                        return Err(
                            format!("--pooler: {other} is neither session nor transaction").into(),
                        )
                    }
                }
            }
            "--scenarios" => {
                cfg.scenarios = Some(
                    value("--scenarios")?
                        .split(',')
                        .map(str::to_owned)
                        .collect(),
                )
            }
            "--clients" => {
                cfg.clients = value("--clients")?
                    .split(',')
                    .map(|c| c.trim().parse().map_err(|e| format!("--clients: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--bench" => {} // passed by `cargo bench`
            "-h" | "--help" => {
                println!(
                    "idem-bench [--smoke | --quick] [--rounds N] [--ops N] [--growth [--growth-sizes 0,1000000,5000000]] [--floors] [--only postgres|mysql|sqlite|outbox|shards] [--scenarios idem,seed-sql,...] [--clients 1,8,32] [--out FILE.json] [--svg FILE.svg] [--md FILE.md] [--database-url URL [--setup-url URL] [--pooler session|transaction]]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if growth && cfg.mode != "smoke" {
        cfg.growth = Some((growth_sizes, 1_000_000, Duration::from_secs(60)));
    }
    Ok(cfg)
}

async fn backend(
    target: Arc<dyn Target>,
    cfg: &Config,
    scenarios: &[Scenario],
    run_id: &str,
) -> Result<BackendReport, BenchError> {
    eprintln!("== {} {} ==", target.name(), target.version());
    let cells = throughput::run(
        target.clone(),
        scenarios,
        &cfg.clients,
        cfg.ops,
        cfg.rounds,
        run_id,
    )
    .await?;
    let storm = storm::run(target.clone(), cfg.storm_keys, cfg.storm_attempts, run_id).await?;
    eprintln!(
        "  storm: {} keys x {}: p50 {:.1} ms, p99 {:.1} ms, executed {}, replayed {}, 409 {}",
        storm.keys,
        storm.attempts_per_key,
        storm.p50_ms,
        storm.p99_ms,
        storm.executed,
        storm.replayed,
        storm.in_progress
    );
    Ok(BackendReport {
        backend: target.name().into(),
        version: target.version(),
        settings: target.settings(),
        cells,
        storm: Some(storm),
    })
}

async fn run(cfg: Config) -> Result<Report, BenchError> {
    let started = Instant::now();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    eprintln!(
        "idem-bench: mode {}, {cores} cores, {} rounds",
        cfg.mode, cfg.rounds
    );

    // The group commits' sizes (SQLite); every other metric is dropped.
    batches::install();
    // First, while nothing else runs: the allocation counter is process-wide.
    let fp = fingerprint::run(cfg.fingerprint_iterations);
    for c in &fp.costs {
        eprintln!(
            "  fingerprint {}: {:.0} ns, {:.2} allocs",
            c.name, c.ns_per_call, c.allocs_per_call
        );
    }

    let mut scenarios = vec![
        Scenario::Unprotected,
        Scenario::SameWrites,
        Scenario::SeedSql,
        Scenario::Idem,
        Scenario::IdemMacro,
        Scenario::Replay,
        Scenario::ReplayCached,
        Scenario::MixedSeedSql,
        Scenario::Mixed,
        Scenario::MixedCached,
    ];
    if let Some(wanted) = &cfg.scenarios {
        scenarios.retain(|s| wanted.iter().any(|w| w == s.label()));
    }
    let connections = cfg
        .clients
        .iter()
        .copied()
        .max()
        .unwrap_or(8)
        .max(cfg.storm_attempts / 2) as u32;
    let run_id = format!("b{}", std::process::id());

    if let Some(url) = &cfg.database_url {
        return given_database(&cfg, url, &scenarios, connections, &run_id, fp, started).await;
    }
    let wants = |name: &str| cfg.only.as_deref().is_none_or(|only| only == name);
    let server = PgServer::start(pg::SETTINGS).map_err(|e| format!("starting Postgres: {e}"))?;
    let mut backends = Vec::new();
    let mut netdelay = None;
    if wants("postgres") {
        let pg = pg::Pg::setup(&server, connections).await?;
        let mut with_row_lock = scenarios.clone();
        if cfg.scenarios.is_none() {
            with_row_lock.insert(4, Scenario::IdemRowLock);
        }
        backends.push(backend(Arc::new(pg.clone()), &cfg, &with_row_lock, &run_id).await?);
        eprintln!("== postgres through a delaying proxy ==");
        let ops = (cfg.ops / 10).clamp(10, 300);
        netdelay = Some(netdelay::run(&pg, ops, cfg.rounds, &run_id).await?);
    }
    let floors = if cfg.floors {
        eprintln!("== postgres: the fresh path a statement at a time ==");
        let pg = pg::Pg::setup(&server, connections).await?;
        Some(floors::run(&pg, connections, &cfg.clients, cfg.ops, cfg.rounds, &run_id).await?)
    } else {
        None
    };
    let mysql = if wants("mysql") || wants("outbox") {
        Some(MySqlServer::start_with(my::SETTINGS).map_err(|e| format!("starting MySQL: {e}"))?)
    } else {
        None
    };
    if let (true, Some(server)) = (wants("mysql"), &mysql) {
        let my = my::My::setup(server, connections).await?;
        backends.push(backend(Arc::new(my), &cfg, &scenarios, &run_id).await?);
    }
    let dir = tempfile::Builder::new().prefix("idem-bench-").tempdir()?;
    if wants("sqlite") {
        let lite = lite::Lite::setup(&dir.path().join("bench.db"), connections).await?;
        let mut with_solo = scenarios.clone();
        if cfg.scenarios.is_none() {
            with_solo.insert(4, Scenario::IdemSolo);
        }
        backends.push(backend(Arc::new(lite), &cfg, &with_solo, &run_id).await?);
    }

    let growth = match &cfg.growth {
        Some((sizes, purge_rows, limit)) => {
            eprintln!("== growth (postgres) ==");
            let fresh = pg::Pg::setup(&server, connections).await?;
            let ops = cfg.ops.min(2000);
            let plan = growth::GrowthPlan {
                sizes: sizes.clone(),
                purge_rows: *purge_rows,
                purge_limit: *limit,
                clients: 8,
                ops,
            };
            Some(growth::run(&fresh, &plan, cfg.rounds, &run_id).await?)
        }
        None => None,
    };

    let outbox = match &mysql {
        Some(mysql) if wants("outbox") => {
            Some(outbox_scenarios(&cfg, &server, mysql, &dir, connections, &run_id).await?)
        }
        _ => None,
    };

    // Two more servers: in full runs and `--only shards`, not in smoke runs.
    let shards = if wants("shards") && cfg.mode != "smoke" {
        eprintln!("== postgres: 1 vs 3 shards at {SHARD_CLIENTS} clients ==");
        let mut servers = vec![server];
        for _ in 1..3 {
            servers.push(
                PgServer::start(pg::SETTINGS).map_err(|e| format!("starting Postgres: {e}"))?,
            );
        }
        let connections = connections.max(SHARD_CLIENTS as u32);
        let result = shards::run(
            &servers,
            connections,
            SHARD_CLIENTS,
            cfg.ops,
            cfg.rounds,
            &run_id,
        )
        .await?;
        Some(result)
    } else {
        None
    };

    let ratios = report::ratios(&backends, &cfg.clients);
    eprintln!("done in {:.0}s", started.elapsed().as_secs_f64());
    Ok(Report {
        mode: cfg.mode.into(),
        cores,
        rounds: cfg.rounds,
        ops: cfg.ops,
        backends,
        ratios,
        fingerprint: Some(fp),
        growth,
        outbox,
        netdelay,
        floors,
        shards,
    })
}

/// The Postgres throughput scenarios and the storm on the database at
/// `url`, set up over `--setup-url`, its pools set for `--pooler`.
async fn given_database(
    cfg: &Config,
    url: &str,
    scenarios: &[Scenario],
    connections: u32,
    run_id: &str,
    fp: fingerprint::FingerprintResult,
    started: Instant,
) -> Result<Report, BenchError> {
    let setup = cfg.setup_url.as_deref().unwrap_or(url);
    let pg = pg::Pg::at(url, setup, connections, cfg.pooler).await?;
    let backends = vec![backend(Arc::new(pg), cfg, scenarios, run_id).await?];
    let ratios = report::ratios(&backends, &cfg.clients);
    eprintln!("done in {:.0}s", started.elapsed().as_secs_f64());
    Ok(Report {
        mode: cfg.mode.into(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        rounds: cfg.rounds,
        ops: cfg.ops,
        backends,
        ratios,
        fingerprint: Some(fp),
        growth: None,
        outbox: None,
        netdelay: None,
        floors: None,
        shards: None,
    })
}

/// The outbox scenarios: enqueue cost on each backend, then, with a
/// `nats-server` of our own, relay throughput and latency on a fresh
/// Postgres outbox.
async fn outbox_scenarios(
    cfg: &Config,
    server: &PgServer,
    mysql: &MySqlServer,
    dir: &tempfile::TempDir,
    connections: u32,
    run_id: &str,
) -> Result<outbox::OutboxResult, BenchError> {
    eprintln!("== outbox ==");
    let clients = 8;
    let mut result = outbox::OutboxResult::default();
    let pg = pg::Pg::setup(server, connections).await?;
    result.enqueue.push(
        outbox::enqueue_cost("postgres", &pg.engine, clients, cfg.ops, cfg.rounds, run_id).await?,
    );
    let my = my::My::setup(mysql, connections).await?;
    result.enqueue.push(
        outbox::enqueue_cost("mysql", &my.engine, clients, cfg.ops, cfg.rounds, run_id).await?,
    );
    let lite = lite::Lite::setup(&dir.path().join("outbox.db"), connections).await?;
    result.enqueue.push(
        outbox::enqueue_cost("sqlite", &lite.engine, clients, cfg.ops, cfg.rounds, run_id).await?,
    );
    let nats = match outbox::NatsServer::start() {
        Ok(nats) => nats,
        Err(reason) => {
            eprintln!("  outbox JetStream scenarios skipped: {reason}");
            result.skipped = Some(reason);
            return Ok(result);
        }
    };
    let client = async_nats::connect(nats.url())
        .await
        .map_err(|e| format!("connecting to nats-server: {e}"))?;
    let js = async_nats::jetstream::new(client.clone());
    let fresh = pg::Pg::setup(server, connections).await?;
    let (messages, rate, latency_messages) = match cfg.mode {
        "smoke" => (50, 100, 30),
        "quick" => (1000, 200, 400),
        _ => (5000, 200, 2000),
    };
    result.relay =
        Some(outbox::relay_throughput(&fresh.engine, &js, messages, cfg.rounds, run_id).await?);
    result.latency =
        Some(outbox::latency(&fresh.engine, &client, &js, rate, latency_messages, run_id).await?);
    Ok(result)
}

fn main() {
    let cfg = match parse_args() {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("idem-bench: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (out, svg_path, md_path) = (cfg.out.clone(), cfg.svg.clone(), cfg.md.clone());
    let report = match runtime.block_on(run(cfg)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem-bench failed: {e}");
            std::process::exit(1);
        }
    };
    let md = report::markdown(&report);
    println!("{md}");
    let write = |path: &Option<String>, text: String| {
        if let Some(path) = path {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("idem-bench: writing {path}: {e}");
                std::process::exit(1);
            }
        }
    };
    write(&out, serde_json::to_string_pretty(&report).expect("json"));
    write(&svg_path, svg::chart(&report));
    write(&md_path, md);
    // The engine's own scenarios must not fail (the baselines' errors, such as
    // SQLite busy timeouts in the hand-written SQL, are only reported).
    let broken: Vec<String> = report
        .backends
        .iter()
        .flat_map(|b| b.cells.iter().map(move |c| (b, c)))
        .filter(|(_, c)| {
            c.errors > 0
                && matches!(
                    c.scenario,
                    "idem" | "idem-macro" | "replay" | "replay-cached" | "mixed" | "mixed-cached"
                )
        })
        .map(|(b, c)| {
            format!(
                "{} {} at {} clients: {} errors",
                b.backend, c.scenario, c.clients, c.errors
            )
        })
        .collect();
    if !broken.is_empty() {
        eprintln!("idem-bench: engine scenarios failed: {}", broken.join("; "));
        std::process::exit(1);
    }
}
