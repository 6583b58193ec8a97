//! How the commands print: aligned tables for people, JSON for scripts, and
//! keys shown as their log tag unless `--show-keys` is given.

use std::time::{Duration, UNIX_EPOCH};

use idem_runtime::inbox::PoisonMessage;
use idem_runtime::outbox::OutboxEntry;
use idem_runtime::IdempotencyKey;
use serde_json::{json, Value};

/// How a key is printed: `#` and its log tag (the first 12 hex digits of its
/// SHA-256, the tag idem's own logs use), or in full with `--show-keys`.
pub fn key_label(key: &str, show_keys: bool) -> String {
    if show_keys {
        return key.to_owned();
    }
    match IdempotencyKey::new(key) {
        Ok(key) => format!("#{}", key.log_tag()),
        Err(_) => "#<invalid key>".to_owned(),
    }
}

/// A Unix-millisecond instant as RFC 3339 UTC, to the millisecond.
pub fn instant(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A duration as people read it: `850ms`, `12s`, `3h 20m`.
pub fn span(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        return format!("{}ms", duration.as_millis());
    }
    let whole = Duration::from_secs(duration.as_secs());
    let text = humantime::format_duration(whole).to_string();
    // Two most significant units are enough to read.
    text.split(' ').take(2).collect::<Vec<_>>().join(" ")
}

/// Prints rows as a table whose columns are as wide as their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(i) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        println!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Prints `value` as pretty JSON.
pub fn json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// An outbox message as JSON; the parent key as its tag unless `show_keys`.
pub fn entry_json(entry: &OutboxEntry, show_keys: bool) -> Value {
    let mut value = json!({
        "message_id": entry.message_id,
        "scope": entry.scope,
        "parent_key_tag": entry.parent_key.as_deref().map(|k| key_label(k, false)),
        "step": entry.step,
        "sink": entry.sink,
        "destination": entry.destination,
        "ordering_key": entry.ordering_key,
        "state": entry.state.as_str(),
        "attempts": entry.attempts,
        "max_attempts": entry.max_attempts,
        "last_error": entry.last_error,
        "receipt": entry.receipt,
        "content_type": entry.content_type,
        "payload_bytes": entry.payload.len(),
        "created_at_ms": entry.created_at_ms,
    });
    if show_keys {
        value["parent_key"] = json!(entry.parent_key);
    }
    value
}

/// A poison row as JSON.
pub fn poison_json(row: &PoisonMessage) -> Value {
    json!({
        "consumer": row.consumer,
        "message_id": row.message_id,
        "source": row.source,
        "source_seq": row.source_seq,
        "error": row.error,
        "deliveries": row.deliveries,
        "state": row.state,
        "requeues": row.requeues,
        "payload_bytes": row.payload.len(),
        "first_seen_ms": row.first_seen_ms,
        "poisoned_at_ms": row.poisoned_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_tagged_unless_asked() {
        let tag = key_label("order-8812", false);
        assert!(tag.starts_with('#') && tag.len() == 13, "{tag}");
        assert!(!tag.contains("8812"));
        assert_eq!(key_label("order-8812", true), "order-8812");
    }

    #[test]
    fn times_read_well() {
        assert_eq!(instant(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(span(Duration::from_millis(850)), "850ms");
        assert_eq!(span(Duration::from_secs(3 * 3600 + 20 * 60 + 5)), "3h 20m");
    }
}
