//! `idem migrate`: idem's migrations applied or checked, or its schema
//! printed as SQL.

use clap::Args;
use serde_json::json;

use crate::exit::{Failure, FOUND, OK};
use crate::output;
use crate::store::{OpenMode, Store, StoreSpec};

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The store: a postgres:// or mysql:// URL, a sqlite: URL or a SQLite file path.
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
    Mysql,
}

/// Runs `idem migrate`; exit status [`FOUND`] when `--check` finds pending migrations.
pub(crate) async fn run(json_out: bool, args: &MigrateArgs) -> Result<u8, Failure> {
    if let Some(backend) = args.sql {
        print!(
            "{}",
            match backend {
                SqlBackend::Sqlite => idem_runtime::migrations::sql::<sqlx::Sqlite>(),
                SqlBackend::Postgres => idem_runtime::migrations::sql::<sqlx::Postgres>(),
                SqlBackend::Mysql => idem_runtime::migrations::sql::<sqlx::MySql>(),
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
    if json_out {
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
