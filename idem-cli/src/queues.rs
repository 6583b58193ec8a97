//! `idem outbox …` and `idem inbox …`: the outbox's backlog and dead letters,
//! and the messages consumers gave up on.

use std::time::Duration;

use clap::{Args, Subcommand};
use idem_runtime::outbox::{MessageState, OutboxEntry};
use serde_json::json;

use crate::args::StoreArg;
use crate::exit::{Failure, FOUND, OK, USAGE};
use crate::output::{self, entry_json, instant, key_label, poison_json, span, table};
use crate::store::{OpenMode, Store};

/// How many characters of an error a table shows.
const ERROR_EXCERPT: usize = 60;

#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Pending messages, the oldest one's age, blocked ordering keys, dead
    /// messages. Exits 1 if any message is dead or blocks its ordering key, or
    /// the oldest pending one is older than --max-age.
    Status(StatusArgs),
    /// Messages, newest first.
    List(OutboxListArgs),
    /// Send a dead message again: pending, due now, attempts reset.
    Requeue(MessageArgs),
    /// Give up on an unsent message: marked sent with receipt `skipped`,
    /// which releases its ordering key.
    Skip(SkipArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum InboxCommand {
    /// Messages consumers gave up on and nobody requeued, oldest first.
    /// Exits 1 if there are any.
    Poison(PoisonArgs),
    /// Clear a poisoned message's stored rejection so its next delivery runs
    /// the consumer again.
    Requeue(InboxRequeueArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Exit 1 when the oldest pending message is older than this (`30s`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_age: Option<Duration>,
}

#[derive(Debug, Args)]
pub(crate) struct OutboxListArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Only messages in this state.
    #[arg(long, value_parser = ["pending", "sent", "dead"])]
    state: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct MessageArgs {
    #[command(flatten)]
    store: StoreArg,
    /// The message id (as `idem outbox list` shows it).
    #[arg(long)]
    id: String,
}

#[derive(Debug, Args)]
pub(crate) struct SkipArgs {
    #[command(flatten)]
    message: MessageArgs,
    /// Really skip; without it the message is only shown.
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PoisonArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Only this consumer's messages.
    #[arg(long)]
    consumer: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct InboxRequeueArgs {
    #[command(flatten)]
    store: StoreArg,
    /// The consumer that gave up on it.
    #[arg(long)]
    consumer: String,
    /// The message id.
    #[arg(long)]
    id: String,
}

fn state_name(state: MessageState) -> &'static str {
    state.as_str()
}

fn excerpt(text: &str) -> String {
    let text = text.replace(['\n', '\r', '\t'], " ");
    if text.chars().count() <= ERROR_EXCERPT {
        return text;
    }
    let mut cut: String = text.chars().take(ERROR_EXCERPT).collect();
    cut.push('…');
    cut
}

fn entry_row(entry: &OutboxEntry, show_keys: bool) -> Vec<String> {
    vec![
        entry.message_id.clone(),
        entry
            .parent_key
            .as_deref()
            .map(|k| key_label(k, show_keys))
            .unwrap_or_else(|| "-".into()),
        entry.step.clone(),
        entry.sink.clone(),
        entry.ordering_key.clone().unwrap_or_else(|| "-".into()),
        state_name(entry.state).to_owned(),
        format!("{}/{}", entry.attempts, entry.max_attempts),
        entry
            .last_error
            .as_deref()
            .map(excerpt)
            .unwrap_or_else(|| "-".into()),
        entry.receipt.clone().unwrap_or_else(|| "-".into()),
        instant(entry.created_at_ms),
    ]
}

const ENTRY_HEADERS: [&str; 10] = [
    "message",
    "parent",
    "step",
    "sink",
    "ordering",
    "state",
    "attempts",
    "last error",
    "receipt",
    "created",
];

pub(crate) async fn run_outbox(
    json_out: bool,
    show_keys: bool,
    command: &OutboxCommand,
) -> Result<u8, Failure> {
    match command {
        OutboxCommand::Status(args) => status(json_out, args).await,
        OutboxCommand::List(args) => list(json_out, show_keys, args).await,
        OutboxCommand::Requeue(args) => requeue(json_out, args).await,
        OutboxCommand::Skip(args) => skip(json_out, show_keys, args).await,
    }
}

pub(crate) async fn run_inbox(json_out: bool, command: &InboxCommand) -> Result<u8, Failure> {
    match command {
        InboxCommand::Poison(args) => poison(json_out, args).await,
        InboxCommand::Requeue(args) => inbox_requeue(json_out, args).await,
    }
}

async fn status(json_out: bool, args: &StatusArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let backlog = store.outbox_backlog(&spec.name).await?;
    let too_old = match (args.max_age, backlog.oldest_pending) {
        (Some(max), Some(oldest)) => oldest > max,
        _ => false,
    };
    if json_out {
        output::json(&json!({
            "store": spec.name,
            "pending": backlog.pending,
            "oldest_pending_seconds": backlog.oldest_pending.map(|age| age.as_secs_f64()),
            "blocked_ordering_keys": backlog.blocked_ordering_keys,
            "dead": backlog.dead,
            "older_than_max_age": too_old,
        }));
    } else {
        let oldest = backlog
            .oldest_pending
            .map(span)
            .unwrap_or_else(|| "-".into());
        let rows = [
            ("pending", backlog.pending.to_string()),
            (
                "oldest pending",
                if too_old {
                    format!("{oldest} (older than --max-age)")
                } else {
                    oldest
                },
            ),
            (
                "blocked ordering keys",
                backlog.blocked_ordering_keys.to_string(),
            ),
            ("dead", backlog.dead.to_string()),
        ];
        println!("outbox of {}", spec.name);
        for (name, value) in rows {
            println!("  {name:<23}{value}");
        }
        if backlog.dead > 0 {
            println!(
                "see them with `idem outbox list --state dead`; then `idem outbox requeue` or `idem outbox skip`"
            );
        }
    }
    let attention = backlog.dead > 0 || backlog.blocked_ordering_keys > 0 || too_old;
    Ok(if attention { FOUND } else { OK })
}

async fn list(json_out: bool, show_keys: bool, args: &OutboxListArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let state = args.state.as_deref().map(|state| match state {
        "sent" => MessageState::Sent,
        "dead" => MessageState::Dead,
        _ => MessageState::Pending,
    });
    let store = Store::open(spec, OpenMode::Existing).await?;
    let entries = store.outbox_list(&spec.name, state, args.limit).await?;
    if json_out {
        let rows: Vec<_> = entries.iter().map(|e| entry_json(e, show_keys)).collect();
        output::json(&json!({ "store": spec.name, "messages": rows }));
    } else {
        let rows: Vec<_> = entries.iter().map(|e| entry_row(e, show_keys)).collect();
        table(&ENTRY_HEADERS, &rows);
        println!("{} message(s) in {}", entries.len(), spec.name);
    }
    Ok(OK)
}

async fn requeue(json_out: bool, args: &MessageArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let requeued = store.outbox_requeue(&spec.name, &args.id).await?;
    if json_out {
        output::json(&json!({ "store": spec.name, "message_id": args.id, "requeued": requeued }));
    } else if requeued {
        println!(
            "requeued {} in {}: pending, due now, attempts reset",
            args.id, spec.name
        );
    } else {
        let why = match store.outbox_entry(&spec.name, &args.id).await? {
            Some(entry) => format!("it is {}, not dead", state_name(entry.state)),
            None => "there is no such message".to_owned(),
        };
        println!("did not requeue {} in {}: {why}", args.id, spec.name);
    }
    Ok(if requeued { OK } else { FOUND })
}

async fn skip(json_out: bool, show_keys: bool, args: &SkipArgs) -> Result<u8, Failure> {
    let spec = &args.message.store.store;
    let id = &args.message.id;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let Some(entry) = store.outbox_entry(&spec.name, id).await? else {
        println!("no message {id} in {}", spec.name);
        return Ok(FOUND);
    };
    if entry.state == MessageState::Sent {
        println!(
            "{id} in {} is already sent (receipt {})",
            spec.name,
            entry.receipt.as_deref().unwrap_or("-")
        );
        return Ok(FOUND);
    }
    if !args.yes {
        table(&ENTRY_HEADERS, &[entry_row(&entry, show_keys)]);
        println!(
            "would skip {id} ({}, {}) in {}: it is never published. Pass --yes to skip.",
            entry.step,
            state_name(entry.state),
            spec.name
        );
        return Ok(USAGE);
    }
    let skipped = store.outbox_skip(&spec.name, id).await?;
    if json_out {
        output::json(&json!({ "store": spec.name, "message_id": id, "skipped": skipped }));
    } else if skipped {
        println!(
            "skipped {id} ({}) in {}: marked sent with receipt `skipped`",
            entry.step, spec.name
        );
    } else {
        println!("{id} in {} was sent meanwhile", spec.name);
    }
    Ok(if skipped { OK } else { FOUND })
}

async fn poison(json_out: bool, args: &PoisonArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let rows = store
        .inbox_poisoned(&spec.name, args.consumer.as_deref(), args.limit)
        .await?;
    if json_out {
        let listed: Vec<_> = rows.iter().map(poison_json).collect();
        output::json(&json!({ "store": spec.name, "poisoned": listed }));
    } else {
        let cells: Vec<_> = rows
            .iter()
            .map(|row| {
                vec![
                    row.consumer.clone(),
                    row.message_id.clone(),
                    row.source.clone().unwrap_or_else(|| "-".into()),
                    row.deliveries.to_string(),
                    row.requeues.to_string(),
                    excerpt(&row.error),
                    instant(row.poisoned_at_ms),
                ]
            })
            .collect();
        table(
            &[
                "consumer",
                "message",
                "source",
                "deliveries",
                "requeues",
                "error",
                "poisoned",
            ],
            &cells,
        );
        println!("{} poisoned message(s) in {}", rows.len(), spec.name);
    }
    Ok(if rows.is_empty() { OK } else { FOUND })
}

async fn inbox_requeue(json_out: bool, args: &InboxRequeueArgs) -> Result<u8, Failure> {
    let spec = &args.store.store;
    let store = Store::open(spec, OpenMode::Existing).await?;
    let requeued = store
        .inbox_requeue(&spec.name, &args.consumer, &args.id)
        .await?;
    if json_out {
        output::json(&json!({
            "store": spec.name,
            "consumer": args.consumer,
            "message_id": args.id,
            "requeued": requeued.as_ref().map(poison_json),
        }));
    } else if let Some(row) = &requeued {
        println!(
            "requeued {} for {} in {}: its stored rejection is gone, so its next delivery runs \
             the consumer. A transport that terminated it (JetStream) must be handed the payload \
             again ({} bytes; NatsInbox::requeue does this).",
            row.message_id,
            row.consumer,
            spec.name,
            row.payload.len()
        );
    } else {
        println!(
            "no poisoned message {} for consumer {} in {}",
            args.id, args.consumer, spec.name
        );
    }
    Ok(if requeued.is_some() { OK } else { FOUND })
}
