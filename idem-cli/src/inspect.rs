//! `idem inspect`: one operation across services.
//!
//! Starting from the client's key, every store is asked for the key's record;
//! then for every child key derived from it ([`child_key`]) by a candidate
//! step, and so on down (at most [`MAX_DEPTH`] levels). The candidate steps
//! are the ones given with `--step` and every step any of the stores holds
//! records for. Children are looked up in the same scope as the parent.
//!
//! The tree holds, per key, the record in each store that has one. The
//! "effects" list answers "was I charged twice?": one line per key and store,
//! which (by the table's primary key) holds at most one record, so a completed
//! record there means the effect happened exactly once.
//!
//! Beside each key's records come the outbox messages enqueued under it
//! ([`Node::messages`]: state, attempts, last error, receipt), and for each
//! message what consumers in any of the stores did with it downstream: their
//! key record (scope `inbox/<consumer>`, key the message id) and any poison
//! row. Stores without the outbox or inbox tables simply have none.

use std::collections::BTreeSet;

use clap::Args;

use idem_runtime::child_key;
use idem_runtime::inbox::PoisonMessage;
use idem_runtime::outbox::{MessageState, OutboxEntry};
use serde_json::{json, Value};

use crate::args::{ScopeArgs, StoreNames};
use crate::config::{Config, ConfigArg, Service};
use crate::exit::{Failure, FOUND, OK};
use crate::output::{self, entry_json, instant, key_label, poison_json, span};
use crate::service::Route;
use crate::store::{KeyRecord, Place, Store, StoreError, StoreSpec};

/// How deep child keys are followed.
pub const MAX_DEPTH: usize = 4;

/// One key in the tree.
#[derive(Debug)]
pub struct Node {
    /// How the key was derived: `K`, `child(K, charge-card.v1)`, ...
    pub path: String,
    /// The key.
    pub key: String,
    /// The step it was derived by (none for the client's key).
    pub derived_by: Option<String>,
    /// `(store, record)` for each store (or shard) that has one.
    pub records: Vec<(Place, KeyRecord)>,
    /// The outbox messages enqueued under this key, and their fate downstream.
    pub messages: Vec<Sent>,
    /// Keys derived from this one that some store knows, or that were asked for.
    pub children: Vec<Node>,
}

/// One outbox message of an operation.
#[derive(Debug)]
pub struct Sent {
    /// The store whose outbox holds it.
    pub store: Place,
    /// The row.
    pub entry: OutboxEntry,
    /// `(store, record)`: consumers' records of it (scope `inbox/<consumer>`).
    pub processed: Vec<(Place, KeyRecord)>,
    /// `(store, row)`: consumers that gave up on it.
    pub poisoned: Vec<(Place, PoisonMessage)>,
}

impl Sent {
    fn line(&self) -> String {
        let entry = &self.entry;
        let mut line = format!(
            "{} message via {} to {}: {}, {} attempt(s)",
            entry.step,
            entry.sink,
            entry.destination,
            entry.state.as_str(),
            entry.attempts
        );
        if let Some(receipt) = &entry.receipt {
            line.push_str(&format!(", receipt {receipt}"));
        }
        if let Some(error) = &entry.last_error {
            line.push_str(&format!(", last error: {error}"));
        }
        line
    }
}

/// The consumer a stored inbox scope (`13:inbox/ledger`) belongs to.
fn consumer_of(scope: &str) -> &str {
    scope
        .split_once(':')
        .map_or(scope, |(_, rest)| rest)
        .trim_start_matches("inbox/")
}

fn inbox_line(record: &KeyRecord) -> String {
    let state = match (record.status.as_str(), record.response_status) {
        ("completed", Some(status)) if status < 400 => "processed once".to_owned(),
        ("completed", Some(status)) => format!("rejected ({status})"),
        (status, _) => status.replace('_', " "),
    };
    format!(
        "consumer {}: {state} ({})",
        consumer_of(&record.scope),
        record.step
    )
}

fn poison_line(row: &PoisonMessage) -> String {
    format!(
        "consumer {}: {} after {} deliveries: {}",
        row.consumer, row.state, row.deliveries, row.error
    )
}

/// What `inspect` found.
#[derive(Debug)]
pub struct Inspection {
    /// The stored scope.
    pub scope: String,
    /// The client's key and everything derived from it.
    pub root: Node,
}

/// Builds the tree for `key` in `scope` over `stores` (of a sharded
/// service, the shards of the tenant's route).
pub async fn inspect(
    stores: &[(Place, Store)],
    scope: &str,
    key: &str,
    asked_steps: &[String],
) -> Result<Inspection, StoreError> {
    let mut candidates: BTreeSet<String> = asked_steps.iter().cloned().collect();
    for (place, store) in stores {
        for step in store.steps(&place.to_string()).await? {
            candidates.insert(step.step);
        }
    }
    let mut root = Node {
        path: "K".into(),
        key: key.to_owned(),
        derived_by: None,
        records: lookup(stores, scope, key).await?,
        messages: messages(stores, scope, key).await?,
        children: Vec::new(),
    };
    let mut frontier: Vec<(&mut Node, usize)> = vec![(&mut root, 0)];
    while let Some((node, depth)) = frontier.pop() {
        if depth >= MAX_DEPTH {
            continue;
        }
        for step in &candidates {
            let child = child_key(&node.key, step);
            let records = lookup(stores, scope, &child).await?;
            let asked = depth == 0 && asked_steps.contains(step);
            if records.is_empty() && !asked {
                continue;
            }
            let messages = messages(stores, scope, &child).await?;
            node.children.push(Node {
                path: format!("child({}, {step})", node.path),
                key: child,
                derived_by: Some(step.clone()),
                records,
                messages,
                children: Vec::new(),
            });
        }
        for child in node.children.iter_mut() {
            if !child.records.is_empty() {
                frontier.push((child, depth + 1));
            }
        }
    }
    Ok(Inspection {
        scope: scope.to_owned(),
        root,
    })
}

async fn lookup(
    stores: &[(Place, Store)],
    scope: &str,
    key: &str,
) -> Result<Vec<(Place, KeyRecord)>, StoreError> {
    let mut found = Vec::new();
    for (place, store) in stores {
        if let Some(record) = store.record(&place.to_string(), scope, key).await? {
            found.push((place.clone(), record));
        }
    }
    Ok(found)
}

async fn messages(
    stores: &[(Place, Store)],
    scope: &str,
    key: &str,
) -> Result<Vec<Sent>, StoreError> {
    let mut found = Vec::new();
    for (place, store) in stores {
        for entry in store.outbox_for(&place.to_string(), scope, key).await? {
            let mut sent = Sent {
                store: place.clone(),
                entry,
                processed: Vec::new(),
                poisoned: Vec::new(),
            };
            for (downstream, store) in stores {
                let (records, poison) = store
                    .inbox_for(&downstream.to_string(), &sent.entry.message_id)
                    .await?;
                sent.processed
                    .extend(records.into_iter().map(|r| (downstream.clone(), r)));
                sent.poisoned
                    .extend(poison.into_iter().map(|p| (downstream.clone(), p)));
            }
            found.push(sent);
        }
    }
    Ok(found)
}

impl Inspection {
    /// Whether anything needs attention: the client's key is unknown, a record
    /// is in progress, a key asked for with `--step` has no record, an outbox
    /// message is dead, or a consumer poisoned one.
    pub fn needs_attention(&self) -> bool {
        fn walk(node: &Node) -> bool {
            node.records.is_empty()
                || node
                    .records
                    .iter()
                    .any(|(_, r)| r.status != "completed" || r.expired())
                || node.messages.iter().any(|m| {
                    m.entry.state == MessageState::Dead
                        || m.poisoned.iter().any(|(_, p)| p.state == "poison")
                })
                || node.children.iter().any(walk)
        }
        walk(&self.root)
    }

    /// The effects list: one line per key and store.
    pub fn effects(&self) -> Vec<String> {
        let mut lines = Vec::new();
        fn walk(node: &Node, lines: &mut Vec<String>) {
            if node.records.is_empty() {
                lines.push(format!(
                    "{}: no record in any store (never ran here, or purged after expiry)",
                    node.path
                ));
            }
            for (store, record) in &node.records {
                lines.push(format!("{} in {store}: {}", node.path, verdict(record)));
            }
            for sent in &node.messages {
                lines.push(format!(
                    "{} in {} outbox: {}",
                    node.path,
                    sent.store,
                    sent.line()
                ));
                for (store, record) in &sent.processed {
                    lines.push(format!(
                        "  {} message in {store}: {}",
                        sent.entry.step,
                        inbox_line(record)
                    ));
                }
                for (store, row) in &sent.poisoned {
                    lines.push(format!(
                        "  {} message in {store}: {}",
                        sent.entry.step,
                        poison_line(row)
                    ));
                }
            }
            for child in &node.children {
                walk(child, lines);
            }
        }
        walk(&self.root, &mut lines);
        lines
    }

    /// Prints the tree and the effects.
    pub fn print(&self, show_keys: bool) {
        println!("scope {}", self.scope);
        print_node(&self.root, "", "", show_keys);
        println!();
        println!("effects (one line per key and store; a key has at most one record per store):");
        for line in self.effects() {
            println!("  {line}");
        }
    }

    /// The tree as JSON.
    pub fn to_json(&self, show_keys: bool) -> Value {
        json!({
            "scope": self.scope,
            "root": node_json(&self.root, show_keys),
            "effects": self.effects(),
            "needs_attention": self.needs_attention(),
        })
    }
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
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
    #[arg(long = "store", value_name = "NAME=URL")]
    stores: Vec<StoreSpec>,
    #[command(flatten)]
    config: ConfigArg,
    /// A service of the config to look in; repeat it. Every service of the
    /// config without it.
    #[arg(long = "service", value_name = "NAME")]
    services: Vec<String>,
}

/// Runs `idem inspect`: the tree of one key across the stores, printed or as JSON.
pub(crate) async fn run(
    json_out: bool,
    show_keys: bool,
    args: &InspectArgs,
) -> Result<u8, Failure> {
    let scope = args.scope.required()?;
    for step in &args.steps {
        idem_runtime::check_step_name(step)
            .map_err(|error| Failure::Usage(format!("--step {step}: {error}")))?;
    }
    let mut services: Vec<Service> = args.stores.iter().cloned().map(Service::one).collect();
    match &args.config.path {
        Some(path) => services.extend(Config::load(path)?.select(&args.services)?),
        None if !args.services.is_empty() => {
            return Err(Failure::Usage(
                "--service picks services of --config FILE; give the config too".into(),
            ))
        }
        None => {}
    }
    if services.is_empty() {
        return Err(Failure::Usage(
            "give the stores: --store NAME=URL for every service, or --config FILE".into(),
        ));
    }
    let mut names = StoreNames::default();
    let mut stores = Vec::new();
    let mut routes: Vec<(String, Route)> = Vec::new();
    for service in &services {
        names.admit(&service.name)?;
        let (route, opened) = service.open_for(&args.scope).await?;
        routes.extend(route.map(|route| (service.name.clone(), route)));
        stores.extend(opened);
    }
    let found = inspect(&stores, &scope, &args.key, &args.steps).await?;
    if json_out {
        let mut value = found.to_json(show_keys);
        if !routes.is_empty() {
            let routes: serde_json::Map<String, Value> = routes
                .iter()
                .map(|(service, route)| (service.clone(), route.to_json()))
                .collect();
            value["routes"] = Value::Object(routes);
        }
        output::json(&value);
    } else {
        for (service, route) in &routes {
            println!("{service}: {}", route.describe());
        }
        found.print(show_keys);
    }
    Ok(if found.needs_attention() { FOUND } else { OK })
}

fn verdict(record: &KeyRecord) -> String {
    let status = record
        .response_status
        .map(|s| format!(", response {s}"))
        .unwrap_or_default();
    if record.expired() {
        return format!(
            "expired at {} (claims treat it as absent; the purge deletes it)",
            instant(record.expires_at_ms)
        );
    }
    match (record.status.as_str(), record.lock_left()) {
        ("completed", _) => format!("completed once{status} ({})", record.step),
        (_, Some(left)) => format!(
            "in progress, the claim holds the key {} more ({})",
            span(left),
            record.step
        ),
        _ => format!(
            "in progress, lock expired: the attempt crashed or stalled; the next retry takes over ({})",
            record.step
        ),
    }
}

/// Prints `node`'s title after `head`, and its records and children below it,
/// each line starting with `indent`.
fn print_node(node: &Node, head: &str, indent: &str, show_keys: bool) {
    let key = key_label(&node.key, show_keys);
    match node.derived_by {
        None => println!("{head}{}  {key}", node.path),
        Some(_) => println!("{head}{}  = {key}", node.path),
    }
    let items = node.records.len() + node.messages.len() + node.children.len();
    let branch = |last: bool| {
        if last {
            (format!("{indent}└─ "), format!("{indent}   "))
        } else {
            (format!("{indent}├─ "), format!("{indent}│  "))
        }
    };
    if node.records.is_empty() {
        let (head, _) = branch(node.children.is_empty());
        println!("{head}no record in any store");
    }
    let mut index = 0;
    for (store, record) in &node.records {
        index += 1;
        let (head, rest) = branch(index == items);
        print_record(store, record, &head, &rest);
    }
    for sent in &node.messages {
        index += 1;
        let (head, rest) = branch(index == items);
        print_message(sent, &head, &rest);
    }
    for child in &node.children {
        index += 1;
        let (head, rest) = branch(index == items);
        print_node(child, &head, &rest, show_keys);
    }
}

fn print_record(store: &Place, record: &KeyRecord, head: &str, rest: &str) {
    println!(
        "{head}{store}: {} {}  fingerprint {}…",
        record.status,
        record.step,
        record.fingerprint_prefix()
    );
    if let Some(status) = record.response_status {
        let body = record.body_text(72).unwrap_or_default();
        println!("{rest}response {status} {body}");
    }
    let lock = match record.lock_left() {
        Some(left) => format!(
            "locked until {} ({} left)",
            instant(record.locked_until_ms),
            span(left)
        ),
        None => "not locked".to_owned(),
    };
    println!(
        "{rest}created {}  {lock}  expires {}{}",
        instant(record.created_at_ms),
        instant(record.expires_at_ms),
        if record.expired() { " (expired)" } else { "" }
    );
}

fn print_message(sent: &Sent, head: &str, rest: &str) {
    println!("{head}{} outbox: {}", sent.store, sent.line());
    println!(
        "{rest}message {}  created {}",
        sent.entry.message_id,
        instant(sent.entry.created_at_ms)
    );
    let downstream = sent.processed.len() + sent.poisoned.len();
    if downstream == 0 {
        println!("{rest}└─ no consumer in these stores has seen it");
    }
    let mut index = 0;
    let mark = |index: usize| {
        if index == downstream {
            "└─"
        } else {
            "├─"
        }
    };
    for (store, record) in &sent.processed {
        index += 1;
        println!(
            "{rest}{} {store} inbox: {}",
            mark(index),
            inbox_line(record)
        );
    }
    for (store, row) in &sent.poisoned {
        index += 1;
        println!("{rest}{} {store} poison: {}", mark(index), poison_line(row));
    }
}

fn node_json(node: &Node, show_keys: bool) -> Value {
    let records: Vec<Value> = node
        .records
        .iter()
        .map(|(store, record)| {
            let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
            store.tag(&mut value);
            value["fingerprint_prefix"] = json!(record.fingerprint_prefix());
            value["body_excerpt"] = json!(record.body_text(200));
            value["expired"] = json!(record.expired());
            value["verdict"] = json!(verdict(record));
            value
        })
        .collect();
    let mut value = json!({
        "path": node.path,
        "key_tag": key_label(&node.key, false),
        "derived_by": node.derived_by,
        "records": records,
        "outbox": node.messages.iter().map(|m| sent_json(m, show_keys)).collect::<Vec<_>>(),
        "children": node.children.iter().map(|c| node_json(c, show_keys)).collect::<Vec<_>>(),
    });
    if show_keys {
        value["key"] = json!(node.key);
    }
    value
}

fn sent_json(sent: &Sent, show_keys: bool) -> Value {
    let mut value = entry_json(&sent.entry, show_keys);
    sent.store.tag(&mut value);
    value["inbox"] = sent
        .processed
        .iter()
        .map(|(store, record)| {
            let mut value = json!({
                "consumer": consumer_of(&record.scope),
                "step": record.step,
                "status": record.status,
                "response_status": record.response_status,
                "created_at_ms": record.created_at_ms,
            });
            store.tag(&mut value);
            value
        })
        .collect();
    value["poison"] = sent
        .poisoned
        .iter()
        .map(|(store, row)| {
            let mut value = poison_json(row);
            store.tag(&mut value);
            value
        })
        .collect();
    value
}
