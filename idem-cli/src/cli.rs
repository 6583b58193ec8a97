//! The command line: its arguments and the dispatch to each command.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::queues::{InboxCommand, OutboxCommand};
use crate::tenant::TenantCommand;
use crate::{exit, inspect, keys, migrate, queues, steps, tenant};

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "Inspect, clean and migrate idem's idempotency key stores (SQLite files, postgres:// and mysql:// URLs).",
    after_help = "A config file (--config FILE or IDEM_CONFIG) names each service's store, \
                  or its shards, for keys, inspect and tenant move:\n\n  \
                  [services.orders]\n  store = \"postgres://idem@db/orders\"\n\n  \
                  [services.payments]\n  \
                  shards = [\"postgres://idem@db0/payments\", \"postgres://idem@db1/payments\"]\n  \
                  # the hash router; or route by the directory table:\n  \
                  directory = \"postgres://idem@db0/directory\"\n\n\
                  Exit codes: 0 ok; 1 found something (in progress or missing records, pending \
                  migrations, live keys of undeclared steps, dead or blocked outbox messages, \
                  poisoned inbox messages, nothing to requeue or skip, a tenant move that must \
                  be run again, a key record on a shard its tenant is not routed to); 2 usage \
                  (a config that cannot be read or names no store); 3 store or shard \
                  unreachable or failing."
)]
struct Cli {
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Print keys in full instead of their log tag.
    #[arg(long, global = true)]
    show_keys: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One operation across services: the key's record in every store (on
    /// the tenant's shard of a sharded one), and every child key derived
    /// from it, with one line per effect.
    Inspect(inspect::InspectArgs),
    /// List, show or delete key records in one store, or across a service's shards.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Delete expired records (what the runtime's purger does).
    Purge(keys::PurgeArgs),
    /// Apply idem's migrations, or with --check report the pending ones.
    Migrate(migrate::MigrateArgs),
    /// Steps with records in each store, and the live ones a build no longer declares.
    Steps(steps::StepsArgs),
    /// The transactional outbox: backlog, messages, dead letters.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// The idempotent consumers' poisoned messages.
    #[command(subcommand)]
    Inbox(InboxCommand),
    /// Tenants on Postgres shards: move one to another shard.
    #[command(subcommand)]
    Tenant(TenantCommand),
}

/// Parses the command line, runs the command, and returns the exit status.
#[tokio::main(flavor = "current_thread")]
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    exit::status(run(&cli).await)
}

async fn run(cli: &Cli) -> Result<u8, exit::Failure> {
    match &cli.command {
        Command::Inspect(args) => inspect::run(cli.json, cli.show_keys, args).await,
        Command::Keys(command) => keys::run(cli.json, cli.show_keys, command).await,
        Command::Purge(args) => keys::run_purge(cli.json, args).await,
        Command::Migrate(args) => migrate::run(cli.json, args).await,
        Command::Steps(args) => steps::run(cli.json, args).await,
        Command::Outbox(command) => queues::run_outbox(cli.json, cli.show_keys, command).await,
        Command::Inbox(command) => queues::run_inbox(cli.json, command).await,
        Command::Tenant(command) => tenant::run(cli.json, command).await,
    }
}
