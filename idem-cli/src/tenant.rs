//! `idem tenant move`: one tenant's key records and unsent outbox messages
//! moved from its Postgres shard to another, the directory's route flipped
//! (see `idem_runtime::shard::TenantMove` for the steps and the fence).

use std::time::Duration;

use clap::{Args, Subcommand};
use idem_runtime::faults::{self, FaultPoint};
use idem_runtime::shard::{DirectoryRouter, MoveError, Moved, Shards, TenantMove};
use idem_runtime::Engine;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::config::{is_postgres, Config, ConfigArg, Layout};
use crate::exit::{Failure, FOUND, OK};
use crate::output;
use crate::store::StoreError;

#[derive(Debug, Subcommand)]
pub(crate) enum TenantCommand {
    /// Move a tenant to another shard: its writes fenced (answered 503
    /// while it moves), its live key records and unsent outbox messages
    /// copied to the target in one transaction, the route flipped, the
    /// source's copies deleted. Run it again after a crash to finish it.
    Move(MoveArgs),
}

#[derive(Debug, Args)]
pub(crate) struct MoveArgs {
    /// The tenant (the first part of its scope).
    #[arg(long)]
    tenant: String,
    /// The target shard's index: its position among the --shard URLs, from 0.
    #[arg(long, value_name = "INDEX")]
    to: usize,
    /// The Postgres database holding the directory table `idem_tenant_shards`.
    #[arg(long, value_name = "URL", env = "IDEM_DIRECTORY")]
    directory: Option<String>,
    /// A shard's Postgres URL, in the order the directory's indexes name them
    /// (repeat: --shard URL0 --shard URL1 ...). Or give --config.
    #[arg(long = "shard", value_name = "URL")]
    shards: Vec<String>,
    #[command(flatten)]
    config: ConfigArg,
    /// The config's service whose shards and directory to use (needed when
    /// the config names several).
    #[arg(long, value_name = "NAME")]
    service: Option<String>,
    /// How long to wait for relays to finish deliveries they leased of the
    /// tenant's messages.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    lease_wait: Duration,
    /// How long to wait for a lock (the tenant's claims committing on the source).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    lock_wait: Duration,
    /// Crash tests only: abort at this point of the move (a build with
    /// idem's `faults` feature).
    #[arg(long, value_name = "POINT", hide = true)]
    fault: Option<FaultPoint>,
}

impl MoveArgs {
    /// The directory's URL and the shards' URLs: the flags', or the config
    /// service's.
    fn databases(&self) -> Result<(String, Vec<String>), Failure> {
        let flags = self.directory.is_some() || !self.shards.is_empty();
        match (&self.config.path, flags) {
            (Some(_), true) => Err(Failure::Usage(
                "give --directory and --shard, or --config, not both \
                 (IDEM_DIRECTORY and IDEM_CONFIG count)"
                    .into(),
            )),
            (Some(path), false) => {
                let service = Config::load(path)?.one(self.service.as_deref())?;
                match service.layout {
                    Layout::Sharded {
                        shards,
                        directory: Some(directory),
                    } => Ok((
                        directory.location,
                        shards.into_iter().map(|spec| spec.location).collect(),
                    )),
                    _ => Err(Failure::Usage(format!(
                        "service {}: a move needs shards = [...] and directory = URL in the config",
                        service.name
                    ))),
                }
            }
            (None, _) => match (&self.directory, self.shards.is_empty()) {
                (Some(directory), false) => Ok((directory.clone(), self.shards.clone())),
                _ => Err(Failure::Usage(
                    "give the shards: --directory URL and --shard URL (repeat), or --config FILE"
                        .into(),
                )),
            },
        }
    }
}

/// Runs `idem tenant ...`.
pub(crate) async fn run(json_out: bool, command: &TenantCommand) -> Result<u8, Failure> {
    match command {
        TenantCommand::Move(args) => run_move(json_out, args).await,
    }
}

async fn run_move(json_out: bool, args: &MoveArgs) -> Result<u8, Failure> {
    if args.fault.is_some() && !faults::ENABLED {
        return Err(Failure::Usage(
            "--fault needs a build with idem's `faults` feature".to_owned(),
        ));
    }
    let (directory, urls) = args.databases()?;
    let directory = connect("directory", &directory).await?;
    let mut engines = Vec::new();
    for (index, url) in urls.iter().enumerate() {
        engines.push(Engine::new(connect(&format!("shard {index}"), url).await?));
    }
    let shards = Shards::new(engines, DirectoryRouter::new(directory));
    shards
        .router()
        .create_table()
        .await
        .map_err(|source| query_failed("directory", source))?;
    let moved = TenantMove::new(&args.tenant, args.to)
        .lease_wait(args.lease_wait)
        .lock_wait(args.lock_wait)
        .fault(args.fault)
        .run(&shards)
        .await;
    match moved {
        Ok(moved) => {
            report(json_out, &args.tenant, &moved);
            Ok(OK)
        }
        Err(
            error @ (MoveError::ShardOutOfRange { .. }
            | MoveError::UnknownTenant(_)
            | MoveError::AnotherMove { .. }),
        ) => Err(Failure::Usage(error.to_string())),
        Err(error @ (MoveError::MoveRunning(_) | MoveError::LeasesHeld { .. })) => {
            eprintln!("idem: {error}");
            Ok(FOUND)
        }
        Err(MoveError::Store(source)) => Err(query_failed("tenant move", source)),
    }
}

fn report(json_out: bool, tenant: &str, moved: &Moved) {
    if json_out {
        output::json(&json!({
            "tenant": tenant,
            "from": moved.from,
            "to": moved.to,
            "keys": moved.keys,
            "messages": moved.messages,
            "already_there": moved.already_there,
        }));
    } else if moved.already_there {
        println!("tenant {tenant}: already on shard {}", moved.to);
    } else {
        println!(
            "tenant {tenant}: moved from shard {} to shard {} ({} key records, {} outbox messages copied)",
            moved.from, moved.to, moved.keys, moved.messages
        );
    }
}

/// A pool on a Postgres URL; a URL that is not one is a usage error.
async fn connect(name: &str, url: &str) -> Result<PgPool, Failure> {
    if !is_postgres(url) {
        return Err(Failure::Usage(format!(
            "{name}: {url:?} is not a postgres:// URL; tenant moves run on Postgres shards"
        )));
    }
    let options: PgConnectOptions = url
        .parse()
        .map_err(|error| Failure::Usage(format!("{name}: bad URL: {error}")))?;
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.clone())
        .await
        .map_err(|source| {
            Failure::Store(StoreError::Open {
                name: name.to_owned(),
                location: format!(
                    "{}:{}/{}",
                    options.get_host(),
                    options.get_port(),
                    options.get_database().unwrap_or("")
                ),
                source,
            })
        })
}

fn query_failed(name: &str, source: sqlx::Error) -> Failure {
    Failure::Store(StoreError::Query {
        name: name.to_owned(),
        source,
        hint: "",
    })
}
