//! `idem keys …` and `idem purge`: the key records of one store, listed,
//! shown, deleted, and purged once expired.

use clap::{Args, Subcommand};
use serde_json::json;

use crate::args::{ScopeArgs, StoreArg};
use crate::exit::{Failure, FOUND, OK, USAGE};
use crate::output::{self, instant, key_label, span, table};
use crate::store::{self, KeyFilter, OpenMode, Store};

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Records, newest first.
    List(ListArgs),
    /// One record in full.
    Show(KeyArgs),
    /// Delete one record: a retry with that key then runs again.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
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
pub(crate) struct KeyArgs {
    #[command(flatten)]
    store: StoreArg,
    /// The key.
    #[arg(long)]
    key: String,
    #[command(flatten)]
    scope: ScopeArgs,
}

#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Really delete; without it the record is only shown.
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Records deleted per statement.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Count the expired records without deleting them.
    #[arg(long)]
    dry_run: bool,
}

/// Runs `idem keys list|show|delete`; returns the exit status.
pub(crate) async fn run(
    json_out: bool,
    show_keys: bool,
    command: &KeysCommand,
) -> Result<u8, Failure> {
    match command {
        KeysCommand::List(args) => run_list(json_out, show_keys, args).await,
        KeysCommand::Show(args) => run_show(json_out, show_keys, args).await,
        KeysCommand::Delete(args) => run_delete(json_out, show_keys, args).await,
    }
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

async fn run_list(json_out: bool, show_keys: bool, args: &ListArgs) -> Result<u8, Failure> {
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
    if json_out {
        let rows: Vec<_> = records.iter().map(|r| record_json(r, show_keys)).collect();
        output::json(&json!({ "store": spec.name, "records": rows }));
    } else {
        let rows: Vec<_> = records.iter().map(|r| record_row(r, show_keys)).collect();
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

async fn run_show(json_out: bool, show_keys: bool, args: &KeyArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let scope = args.scope.required()?;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let Some(record) = store.record(&spec.name, &scope, &args.key).await? else {
        if json_out {
            output::json(&json!({ "store": spec.name, "record": null }));
        } else {
            println!(
                "no record for key {} in scope {scope} in {}",
                key_label(&args.key, show_keys),
                spec.name
            );
        }
        return Ok(FOUND);
    };
    if json_out {
        output::json(&json!({ "store": spec.name, "record": record_json(&record, show_keys) }));
        return Ok(OK);
    }
    let lock = match record.lock_left() {
        Some(left) => format!("{} ({} left)", instant(record.locked_until_ms), span(left)),
        None => format!("{} (not held)", instant(record.locked_until_ms)),
    };
    let rows = [
        ("key", key_label(&record.key, show_keys)),
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

async fn run_delete(json_out: bool, show_keys: bool, args: &DeleteArgs) -> Result<u8, Failure> {
    let spec = &args.key.store.store;
    let scope = args.key.scope.required()?;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let label = key_label(&args.key.key, show_keys);
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
    if json_out {
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

/// Runs `idem purge`: deletes (or with `--dry-run` counts) the expired records.
pub(crate) async fn run_purge(json_out: bool, args: &PurgeArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let started = std::time::Instant::now();
    let (count, verb) = if args.dry_run {
        (store.count_expired(&spec.name).await?, "would delete")
    } else {
        (store.purge(&spec.name, args.batch).await?, "deleted")
    };
    if json_out {
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
