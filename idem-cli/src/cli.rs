//! The command line: arguments, dispatch, exit statuses.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use idem_runtime::Scope;
use serde_json::json;

use crate::output::{self, instant, key_label, span, table};
use crate::queues::{InboxCommand, OutboxCommand};
use crate::store::{self, KeyFilter, OpenMode, Store, StoreError, StoreSpec};
use crate::{inspect, queues, steps};

/// Exit status: done, nothing to report.
pub(crate) const OK: u8 = 0;
/// Exit status: found something that needs attention.
pub(crate) const FOUND: u8 = 1;
/// Exit status: the command line was wrong.
pub(crate) const USAGE: u8 = 2;
/// Exit status: a store could not be opened or queried.
const STORE: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "Inspect, clean and migrate idem's idempotency key stores (SQLite files, postgres:// URLs).",
    after_help = "Exit codes: 0 ok; 1 found something (in progress or missing records, pending \
                  migrations, live keys of undeclared steps, dead or blocked outbox messages, \
                  poisoned inbox messages, nothing to requeue or skip); 2 usage; 3 store \
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
    /// One operation across services: the key's record in every store, and
    /// every child key derived from it, with one line per effect.
    Inspect(InspectArgs),
    /// List, show or delete key records in one store.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Delete expired records (what the runtime's purger does).
    Purge(PurgeArgs),
    /// Apply idem's migrations, or with --check report the pending ones.
    Migrate(MigrateArgs),
    /// Steps with records in each store, and the live ones a build no longer declares.
    Steps(StepsArgs),
    /// The transactional outbox: backlog, messages, dead letters.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// The idempotent consumers' poisoned messages.
    #[command(subcommand)]
    Inbox(InboxCommand),
}

/// The scope a key lives in.
#[derive(Debug, Args, Clone)]
struct ScopeArgs {
    /// A scope part, outermost first: the tenant, then a caller if the
    /// service scopes by one (`--scope acme --scope billing-api`).
    #[arg(long = "scope", value_name = "PART")]
    parts: Vec<String>,
    /// The scope as stored in the table (`4:acme/11:billing-api`), instead of --scope.
    #[arg(long, value_name = "SCOPE", conflicts_with = "parts")]
    stored_scope: Option<String>,
}

impl ScopeArgs {
    fn stored(&self) -> Option<String> {
        if let Some(stored) = &self.stored_scope {
            return Some(stored.clone());
        }
        (!self.parts.is_empty())
            .then(|| Scope::from_parts(self.parts.iter().map(String::as_str)).to_string())
    }

    fn required(&self) -> Result<String, Failure> {
        self.stored().ok_or(Failure::Usage(
            "give the key's scope: --scope TENANT (repeat for more parts) or --stored-scope".into(),
        ))
    }
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// The client's idempotency key.
    #[arg(long)]
    key: String,
    #[command(flatten)]
    scope: ScopeArgs,
    /// A step the services derive child keys by (`charge-card.v1`); repeat it.
    /// Steps the stores hold records for are followed too.
    #[arg(long = "step", value_name = "STEP")]
    steps: Vec<String>,
    /// A store, `NAME=URL`; repeat it for every service.
    #[arg(long = "store", value_name = "NAME=URL", required = true)]
    stores: Vec<StoreSpec>,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Records, newest first.
    List(ListArgs),
    /// One record in full.
    Show(KeyArgs),
    /// Delete one record: a retry with that key then runs again.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StoreArg {
    /// The store: a postgres:// URL, a sqlite: URL or a SQLite file path.
    #[arg(long, value_name = "URL", env = "IDEM_STORE")]
    pub(crate) store: StoreSpec,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Only this step.
    #[arg(long)]
    step: Option<String>,
    /// Only records in this state.
    #[arg(long, value_parser = ["in_progress", "completed"])]
    status: Option<String>,
    /// Expired records too.
    #[arg(long)]
    expired: bool,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Args)]
struct KeyArgs {
    #[command(flatten)]
    store: StoreArg,
    /// The key.
    #[arg(long)]
    key: String,
    #[command(flatten)]
    scope: ScopeArgs,
}

#[derive(Debug, Args)]
struct DeleteArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Really delete; without it the record is only shown.
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Records deleted per statement.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Count the expired records without deleting them.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
struct MigrateArgs {
    /// The store: a postgres:// URL, a sqlite: URL or a SQLite file path.
    #[arg(
        long,
        value_name = "URL",
        env = "IDEM_STORE",
        required_unless_present = "sql"
    )]
    store: Option<StoreSpec>,
    /// Apply nothing; exit 1 if migrations are pending.
    #[arg(long, conflicts_with = "sql")]
    check: bool,
    /// Print idem's schema for BACKEND as one SQL script and exit, touching
    /// no database: for teams that migrate with other tools.
    #[arg(long, value_name = "BACKEND")]
    sql: Option<SqlBackend>,
}

/// The backend whose SQL `idem migrate --sql` prints.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SqlBackend {
    Sqlite,
    Postgres,
}

#[derive(Debug, Args)]
pub(crate) struct StepsArgs {
    /// A store, `NAME=URL`; repeat it.
    #[arg(long = "store", value_name = "NAME=URL", required = true)]
    pub(crate) stores: Vec<StoreSpec>,
    /// The steps a build declares (retired ones included), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "STEPS")]
    pub(crate) declared: Vec<String>,
    /// A binary built with idem: run with IDEM_PRINT_STEPS=1, it prints its
    /// declarations from `registry::check`/`validate` and exits.
    #[arg(long, value_name = "BINARY")]
    pub(crate) declared_by: Option<std::path::PathBuf>,
}

/// Why a command stopped.
#[derive(Debug)]
pub(crate) enum Failure {
    Usage(String),
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Store(error)
    }
}

/// Parses the command line, runs the command, and returns the exit status.
#[tokio::main(flavor = "current_thread")]
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(code) => ExitCode::from(code),
        Err(Failure::Usage(message)) => {
            eprintln!("idem: {message}");
            ExitCode::from(USAGE)
        }
        Err(Failure::Store(error)) => {
            eprintln!("idem: {error}");
            ExitCode::from(STORE)
        }
    }
}

async fn run(cli: &Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::Inspect(args) => run_inspect(cli, args).await,
        Command::Keys(KeysCommand::List(args)) => run_list(cli, args).await,
        Command::Keys(KeysCommand::Show(args)) => run_show(cli, args).await,
        Command::Keys(KeysCommand::Delete(args)) => run_delete(cli, args).await,
        Command::Purge(args) => run_purge(cli, args).await,
        Command::Migrate(args) => run_migrate(cli, args).await,
        Command::Steps(args) => steps::run(cli.json, args).await,
        Command::Outbox(command) => queues::run_outbox(cli.json, cli.show_keys, command).await,
        Command::Inbox(command) => queues::run_inbox(cli.json, command).await,
    }
}

pub(crate) async fn open_all(specs: &[StoreSpec]) -> Result<Vec<(StoreSpec, Store)>, Failure> {
    let mut names = std::collections::BTreeSet::new();
    let mut stores = Vec::new();
    for spec in specs {
        if !names.insert(spec.name.clone()) {
            return Err(Failure::Usage(format!(
                "two stores are named {}; name them: --store orders=URL --store payments=URL",
                spec.name
            )));
        }
        let store = Store::open(spec, OpenMode::Existing).await?;
        stores.push((spec.clone(), store));
    }
    Ok(stores)
}

async fn run_inspect(cli: &Cli, args: &InspectArgs) -> Result<u8, Failure> {
    let scope = args.scope.required()?;
    for step in &args.steps {
        idem_runtime::check_step_name(step)
            .map_err(|error| Failure::Usage(format!("--step {step}: {error}")))?;
    }
    let stores = open_all(&args.stores).await?;
    let found = inspect::inspect(&stores, &scope, &args.key, &args.steps).await?;
    if cli.json {
        output::json(&found.to_json(cli.show_keys));
    } else {
        found.print(cli.show_keys);
    }
    Ok(if found.needs_attention() { FOUND } else { OK })
}

fn record_row(record: &store::KeyRecord, show_keys: bool) -> Vec<String> {
    let state = if record.expired() {
        format!("{} (expired)", record.status)
    } else if let Some(left) = record.lock_left() {
        format!("{} ({} left)", record.status, span(left))
    } else {
        record.status.clone()
    };
    vec![
        key_label(&record.key, show_keys),
        record.scope.clone(),
        record.step.clone(),
        state,
        record
            .response_status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into()),
        instant(record.created_at_ms),
        instant(record.expires_at_ms),
    ]
}

fn record_json(record: &store::KeyRecord, show_keys: bool) -> serde_json::Value {
    let mut value = serde_json::to_value(record).unwrap_or_default();
    value["key_tag"] = json!(key_label(&record.key, false));
    if show_keys {
        value["key"] = json!(record.key);
    }
    value["fingerprint_prefix"] = json!(record.fingerprint_prefix());
    value["body_excerpt"] = json!(record.body_text(store::BODY_EXCERPT));
    value["expired"] = json!(record.expired());
    value["lock_left_ms"] = json!(record.lock_left().map(|d| d.as_millis() as u64));
    value
}

async fn run_list(cli: &Cli, args: &ListArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let filter = KeyFilter {
        scope: args.scope.stored(),
        step: args.step.clone(),
        status: args.status.clone(),
        include_expired: args.expired,
        limit: args.limit,
    };
    let records = store.records(&spec.name, &filter).await?;
    if cli.json {
        let rows: Vec<_> = records
            .iter()
            .map(|r| record_json(r, cli.show_keys))
            .collect();
        output::json(&json!({ "store": spec.name, "records": rows }));
    } else {
        let rows: Vec<_> = records
            .iter()
            .map(|r| record_row(r, cli.show_keys))
            .collect();
        table(
            &[
                "key", "scope", "step", "status", "response", "created", "expires",
            ],
            &rows,
        );
        println!("{} record(s) in {}", records.len(), spec.name);
    }
    Ok(OK)
}

async fn run_show(cli: &Cli, args: &KeyArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let scope = args.scope.required()?;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let Some(record) = store.record(&spec.name, &scope, &args.key).await? else {
        if cli.json {
            output::json(&json!({ "store": spec.name, "record": null }));
        } else {
            println!(
                "no record for key {} in scope {scope} in {}",
                key_label(&args.key, cli.show_keys),
                spec.name
            );
        }
        return Ok(FOUND);
    };
    if cli.json {
        output::json(&json!({ "store": spec.name, "record": record_json(&record, cli.show_keys) }));
        return Ok(OK);
    }
    let lock = match record.lock_left() {
        Some(left) => format!("{} ({} left)", instant(record.locked_until_ms), span(left)),
        None => format!("{} (not held)", instant(record.locked_until_ms)),
    };
    let rows = [
        ("key", key_label(&record.key, cli.show_keys)),
        ("scope", record.scope.clone()),
        ("step", record.step.clone()),
        ("status", record.status.clone()),
        ("fingerprint", format!("{}…", record.fingerprint_prefix())),
        (
            "response",
            record
                .response_status
                .map(|s| {
                    format!(
                        "{s} {} ({} bytes)",
                        record.response_content_type.clone().unwrap_or_default(),
                        record.body_bytes.unwrap_or(0)
                    )
                })
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "body",
            record.body_text(store::BODY_EXCERPT).unwrap_or_default(),
        ),
        ("created", instant(record.created_at_ms)),
        ("locked until", lock),
        (
            "expires",
            format!(
                "{}{}",
                instant(record.expires_at_ms),
                if record.expired() { " (expired)" } else { "" }
            ),
        ),
    ];
    for (name, value) in rows {
        println!("{name:<13}{value}");
    }
    Ok(OK)
}

async fn run_delete(cli: &Cli, args: &DeleteArgs) -> Result<u8, Failure> {
    let spec = &args.key.store.store;
    let scope = args.key.scope.required()?;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let label = key_label(&args.key.key, cli.show_keys);
    let Some(record) = store.record(&spec.name, &scope, &args.key.key).await? else {
        println!(
            "no record for key {label} in scope {scope} in {}",
            spec.name
        );
        return Ok(FOUND);
    };
    if !args.yes {
        println!(
            "would delete {label} ({}, {}) from {}; a retry with this key would then run again. Pass --yes to delete.",
            record.step, record.status, spec.name
        );
        return Ok(USAGE);
    }
    let deleted = store.delete(&spec.name, &scope, &args.key.key).await?;
    if cli.json {
        output::json(&json!({ "store": spec.name, "deleted": deleted }));
    } else if deleted {
        println!(
            "deleted {label} ({}, {}) from {}",
            record.step, record.status, spec.name
        );
    } else {
        println!("{label} was already gone from {}", spec.name);
    }
    Ok(if deleted { OK } else { FOUND })
}

async fn run_purge(cli: &Cli, args: &PurgeArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let started = std::time::Instant::now();
    let (count, verb) = if args.dry_run {
        (store.count_expired(&spec.name).await?, "would delete")
    } else {
        (store.purge(&spec.name, args.batch).await?, "deleted")
    };
    if cli.json {
        output::json(&json!({
            "store": spec.name,
            "dry_run": args.dry_run,
            "expired_records": count,
            "seconds": started.elapsed().as_secs_f64(),
        }));
    } else {
        println!(
            "{}: {verb} {count} expired record(s) in {}",
            spec.name,
            span(started.elapsed())
        );
    }
    Ok(OK)
}

async fn run_migrate(cli: &Cli, args: &MigrateArgs) -> Result<u8, Failure> {
    if let Some(backend) = args.sql {
        print!(
            "{}",
            match backend {
                SqlBackend::Sqlite => idem_runtime::migrations::sql::<sqlx::Sqlite>(),
                SqlBackend::Postgres => idem_runtime::migrations::sql::<sqlx::Postgres>(),
            }
        );
        return Ok(OK);
    }
    let Some(spec) = &args.store else {
        return Err(Failure::Usage(
            "idem migrate needs --store URL or --sql BACKEND".to_owned(),
        ));
    };
    let mode = if args.check {
        OpenMode::Existing
    } else {
        OpenMode::CreateIfMissing
    };
    let store = Store::open(spec, mode).await?;
    let pending = store.pending_migrations(&spec.name).await?;
    if !args.check && !pending.is_empty() {
        store.migrate(&spec.name).await?;
    }
    let listed: Vec<_> = pending
        .iter()
        .map(|m| json!({ "version": m.version, "description": m.description }))
        .collect();
    if cli.json {
        let key = if args.check { "pending" } else { "applied" };
        output::json(&json!({ "store": spec.name, "backend": store.backend(), key: listed }));
    } else if pending.is_empty() {
        println!("{} ({}): up to date", spec.name, store.backend());
    } else {
        let verb = if args.check { "pending" } else { "applied" };
        for migration in &pending {
            println!("{verb} {} {}", migration.version, migration.description);
        }
        println!(
            "{} ({}): {} migration(s) {verb}",
            spec.name,
            store.backend(),
            pending.len()
        );
    }
    Ok(if args.check && !pending.is_empty() {
        FOUND
    } else {
        OK
    })
}
