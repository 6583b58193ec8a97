//! `idem keys …` and `idem purge`: the key records of one store, or of a
//! service's shards, listed, shown, deleted, and purged once expired.

use clap::{Args, Subcommand};
use serde_json::json;

use crate::args::{ScopeArgs, ServiceArg, StoreArg};
use crate::config::Service;
use crate::exit::{Failure, FOUND, OK, USAGE};
use crate::output::{self, instant, key_label, span, table};
use crate::service::{Route, RoutedBy};
use crate::store::{self, KeyFilter, OpenMode, Place, Store};

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Records, newest first; across a sharded service's shards, merged,
    /// each with its shard.
    List(ListArgs),
    /// One record in full; of a sharded service, from the tenant's shard,
    /// and any copy on another shard (a move's, or one left off its route).
    Show(KeyArgs),
    /// Delete one record: a retry with that key then runs again. Of a
    /// sharded service, on the shards of the tenant's route.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    service: ServiceArg,
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
    /// At most this many (over all the shards).
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    #[command(flatten)]
    service: ServiceArg,
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
    let service = args.service.service()?;
    let filter = KeyFilter {
        scope: args.scope.stored(),
        step: args.step.clone(),
        status: args.status.clone(),
        include_expired: args.expired,
        limit: args.limit,
    };
    let mut records = Vec::new();
    for (place, store) in service.open_all().await? {
        let found = store.records(&place.to_string(), &filter).await?;
        records.extend(found.into_iter().map(|record| (place.clone(), record)));
    }
    // Newest first across the shards, as each store orders its own (a
    // stable sort: a tie keeps the stores' order), then the first `limit`.
    records.sort_by_key(|(_, record)| std::cmp::Reverse(record.created_at_ms));
    records.truncate(args.limit as usize);
    let shards = service.stores().len();
    if json_out {
        let rows: Vec<_> = records
            .iter()
            .map(|(place, record)| {
                let mut value = record_json(record, show_keys);
                if let Some(shard) = place.shard {
                    value["shard"] = json!(shard);
                }
                value
            })
            .collect();
        let mut value = json!({ "store": service.name, "records": rows });
        if service.is_sharded() {
            value["shards"] = json!(shards);
        }
        output::json(&value);
        return Ok(OK);
    }
    let mut headers = vec![
        "key", "scope", "step", "status", "response", "created", "expires",
    ];
    let rows: Vec<_> = records
        .iter()
        .map(|(place, record)| {
            let mut row = record_row(record, show_keys);
            if let Some(shard) = place.shard {
                row.insert(0, shard.to_string());
            }
            row
        })
        .collect();
    let mut across = String::new();
    if service.is_sharded() {
        headers.insert(0, "shard");
        across = format!(" ({shards} shards)");
    }
    table(&headers, &rows);
    println!("{} record(s) in {}{across}", records.len(), service.name);
    Ok(OK)
}

/// A record of `(scope, key)` in one of a service's stores.
struct Found {
    place: Place,
    store: Store,
    record: store::KeyRecord,
}

/// The records of `(scope, key)` in `service`: in its one store, or on
/// every shard (a copy an interrupted move left is found too), with the
/// tenant's route: the routed shard's record first, then a move's other
/// shard's, then any other.
async fn find(
    service: &Service,
    scope: &ScopeArgs,
    key: &str,
) -> Result<(Option<Route>, Vec<Found>), Failure> {
    let stored = scope.required()?;
    let route = service.route(scope).await?;
    let mut found = Vec::new();
    for (place, store) in service.open_all().await? {
        if let Some(record) = store.record(&place.to_string(), &stored, key).await? {
            found.push(Found {
                place,
                store,
                record,
            });
        }
    }
    if let Some(route) = &route {
        let holders = route.holders();
        found.sort_by_key(|f| {
            let shard = f.place.shard.unwrap_or(0);
            holders
                .iter()
                .position(|&h| h == shard)
                .unwrap_or(holders.len() + shard)
        });
    }
    Ok((route, found))
}

/// Whether `found` lies off the tenant's route: on a shard no request of
/// the tenant reaches.
fn stray(route: Option<&Route>, found: &Found) -> bool {
    match (route, found.place.shard) {
        (Some(route), Some(shard)) => route.why(shard).is_none(),
        _ => false,
    }
}

/// The line that tells of copies off the tenant's route, if there are any.
fn stray_line(route: Option<&Route>, found: &[Found], label: &str) -> Option<String> {
    let route = route?;
    let strays: Vec<String> = found
        .iter()
        .filter(|f| stray(Some(route), f))
        .filter_map(|f| f.place.shard.map(|s| s.to_string()))
        .collect();
    if strays.is_empty() {
        return None;
    }
    let reached: Vec<String> = route.holders().iter().map(|s| s.to_string()).collect();
    let cause = match route.by {
        RoutedBy::Hash => "the shards were listed in another order, or their number changed",
        _ => "a move was interrupted or the directory was changed by hand",
    };
    Some(format!(
        "key {label} is on shard {}, and tenant {} is routed to shard {}: {cause}; \
         requests of {} reach shard {} only",
        strays.join(", "),
        route.tenant,
        route.shard,
        route.tenant,
        reached.join(" and "),
    ))
}

async fn run_show(json_out: bool, show_keys: bool, args: &KeyArgs) -> Result<u8, Failure> {
    let service = args.service.service()?;
    let (route, found) = find(&service, &args.scope, &args.key).await?;
    let label = key_label(&args.key, show_keys);
    let strays = stray_line(route.as_ref(), &found, &label);
    if json_out {
        let records: Vec<_> = found
            .iter()
            .map(|f| {
                let mut value = record_json(&f.record, show_keys);
                if let (Some(route), Some(shard)) = (&route, f.place.shard) {
                    value["shard"] = json!(shard);
                    value["why"] = json!(route.why(shard));
                }
                value
            })
            .collect();
        let mut value = json!({
            "store": service.name,
            "record": records.first(),
        });
        if let Some(route) = &route {
            value["route"] = route.to_json();
            value["records"] = json!(records);
            value["stray"] = json!(strays.is_some());
        }
        output::json(&value);
    } else {
        if let Some(route) = &route {
            println!("{:<13}{}", "route", route.describe());
            if found.first().and_then(|f| f.place.shard) != Some(route.shard) {
                println!(
                    "{:<13}{} (the tenant's shard): no record",
                    "shard", route.shard
                );
            }
        }
        if found.is_empty() {
            println!(
                "no record for key {label} in scope {} in {}",
                args.scope.required()?,
                service.name
            );
        }
        for (index, f) in found.iter().enumerate() {
            if index > 0 {
                println!();
            }
            if let (Some(route), Some(shard)) = (&route, f.place.shard) {
                let why = route.why(shard).unwrap_or("not on the tenant's route");
                println!("{:<13}{shard} ({why})", "shard");
            }
            print_record(&f.record, show_keys);
        }
        if let Some(line) = &strays {
            println!("\n{line}");
        }
    }
    Ok(if found.is_empty() || strays.is_some() {
        FOUND
    } else {
        OK
    })
}

fn print_record(record: &store::KeyRecord, show_keys: bool) {
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
}

async fn run_delete(json_out: bool, show_keys: bool, args: &DeleteArgs) -> Result<u8, Failure> {
    let service = args.key.service.service()?;
    let (route, found) = find(&service, &args.key.scope, &args.key.key).await?;
    let label = key_label(&args.key.key, show_keys);
    if found.is_empty() {
        println!(
            "no record for key {label} in scope {} in {}",
            args.key.scope.required()?,
            service.name
        );
        return Ok(FOUND);
    }
    // A copy off the tenant's route is left alone: no request reaches it,
    // and it tells where an interrupted move stopped.
    let strays = stray_line(route.as_ref(), &found, &label).map(|line| {
        format!("{line}; not deleted there (delete it with --store and that shard's URL)")
    });
    let targets: Vec<&Found> = found.iter().filter(|f| !stray(route.as_ref(), f)).collect();
    let places = |list: &[&Found]| {
        let names: Vec<String> = list.iter().map(|f| f.place.to_string()).collect();
        names.join(" and ")
    };
    let record = &found[0].record;
    if !args.yes {
        if !targets.is_empty() {
            println!(
                "would delete {label} ({}, {}) from {}; a retry with this key would then run again. Pass --yes to delete.",
                record.step,
                record.status,
                places(&targets)
            );
        }
        if let Some(line) = &strays {
            println!("{line}");
        }
        return Ok(USAGE);
    }
    let mut deleted = Vec::new();
    for f in &targets {
        let name = f.place.to_string();
        if f.store
            .delete(&name, &f.record.scope, &f.record.key)
            .await?
        {
            deleted.push(*f);
        }
    }
    if json_out {
        let mut value = json!({ "store": service.name, "deleted": !deleted.is_empty() });
        if route.is_some() {
            let shards: Vec<_> = deleted.iter().map(|f| f.place.shard).collect();
            value["shards"] = json!(shards);
            value["stray"] = json!(strays.is_some());
        }
        output::json(&value);
        return Ok(if deleted.is_empty() || strays.is_some() {
            FOUND
        } else {
            OK
        });
    }
    if !deleted.is_empty() {
        println!(
            "deleted {label} ({}, {}) from {}",
            record.step,
            record.status,
            places(&deleted)
        );
    } else if !targets.is_empty() {
        println!("{label} was already gone from {}", places(&targets));
    }
    if let Some(line) = &strays {
        println!("{line}");
    }
    Ok(if deleted.is_empty() || strays.is_some() {
        FOUND
    } else {
        OK
    })
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
