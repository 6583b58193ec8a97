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
//! Outbox messages and inbox records for each key slot in beside the key
//! records ([`Node::records`]) once those tables exist.

use std::collections::BTreeSet;

use idem_runtime::child_key;
use serde_json::{json, Value};

use crate::output::{instant, key_label, span};
use crate::store::{KeyRecord, Store, StoreError, StoreSpec};

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
    /// `(store name, record)` for each store that has one.
    pub records: Vec<(String, KeyRecord)>,
    /// Keys derived from this one that some store knows, or that were asked for.
    pub children: Vec<Node>,
}

/// What `inspect` found.
#[derive(Debug)]
pub struct Inspection {
    /// The stored scope.
    pub scope: String,
    /// The client's key and everything derived from it.
    pub root: Node,
}

/// Builds the tree for `key` in `scope` over `stores`.
pub async fn inspect(
    stores: &[(StoreSpec, Store)],
    scope: &str,
    key: &str,
    asked_steps: &[String],
) -> Result<Inspection, StoreError> {
    let mut candidates: BTreeSet<String> = asked_steps.iter().cloned().collect();
    for (spec, store) in stores {
        for step in store.steps(&spec.name).await? {
            candidates.insert(step.step);
        }
    }
    let mut root = Node {
        path: "K".into(),
        key: key.to_owned(),
        derived_by: None,
        records: lookup(stores, scope, key).await?,
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
            node.children.push(Node {
                path: format!("child({}, {step})", node.path),
                key: child,
                derived_by: Some(step.clone()),
                records,
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
    stores: &[(StoreSpec, Store)],
    scope: &str,
    key: &str,
) -> Result<Vec<(String, KeyRecord)>, StoreError> {
    let mut found = Vec::new();
    for (spec, store) in stores {
        if let Some(record) = store.record(&spec.name, scope, key).await? {
            found.push((spec.name.clone(), record));
        }
    }
    Ok(found)
}

impl Inspection {
    /// Whether anything needs attention: the client's key is unknown, a record
    /// is in progress, or a key asked for with `--step` has no record.
    pub fn needs_attention(&self) -> bool {
        fn walk(node: &Node) -> bool {
            node.records.is_empty()
                || node
                    .records
                    .iter()
                    .any(|(_, r)| r.status != "completed" || r.expired())
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
    let items = node.records.len() + node.children.len();
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
    for child in &node.children {
        index += 1;
        let (head, rest) = branch(index == items);
        print_node(child, &head, &rest, show_keys);
    }
}

fn print_record(store: &str, record: &KeyRecord, head: &str, rest: &str) {
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

fn node_json(node: &Node, show_keys: bool) -> Value {
    let records: Vec<Value> = node
        .records
        .iter()
        .map(|(store, record)| {
            let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
            value["store"] = json!(store);
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
        "children": node.children.iter().map(|c| node_json(c, show_keys)).collect::<Vec<_>>(),
    });
    if show_keys {
        value["key"] = json!(node.key);
    }
    value
}
