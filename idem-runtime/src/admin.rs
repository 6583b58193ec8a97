//! Key administration: what operators read and delete in the key table
//! (`idem keys`, `idem inspect`), through the store that owns it.
//!
//! ```no_run
//! use idem_runtime::admin::{self, KeyFilter};
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::Error> {
//! let filter = KeyFilter { step: Some("charge-card.v1".into()), limit: 20, ..KeyFilter::default() };
//! for record in admin::key_records(&pool, &filter).await? {
//!     println!("{} {} {}", record.scope, record.status, record.expired());
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::Pool;

pub use crate::store::keys::{KeyFilter, KeyRecord, StepCount, BODY_EXCERPT};
use crate::store::Backend;

impl KeyRecord {
    /// Whether the record has expired (claims treat it as absent).
    pub fn expired(&self) -> bool {
        self.expires_at_ms <= self.read_at_ms
    }

    /// How long the claim's lock still holds, if it does.
    pub fn lock_left(&self) -> Option<Duration> {
        (self.status == "in_progress" && self.locked_until_ms > self.read_at_ms)
            .then(|| Duration::from_millis((self.locked_until_ms - self.read_at_ms) as u64))
    }

    /// The first 8 hex digits of the fingerprint.
    pub fn fingerprint_prefix(&self) -> String {
        crate::hex::encode(&self.fingerprint[..self.fingerprint.len().min(4)])
    }

    /// The body's first `chars` characters as text (line breaks as spaces,
    /// `…` when cut), or its size for a body that is not UTF-8.
    pub fn body_text(&self, chars: usize) -> Option<String> {
        let body = self.body_excerpt.as_ref()?;
        let total = self.body_bytes.unwrap_or(body.len() as i64);
        let text = match std::str::from_utf8(body) {
            Ok(text) => text,
            // The excerpt cut a character in two: keep what precedes it.
            Err(error) if error.error_len().is_none() => {
                std::str::from_utf8(&body[..error.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => return Some(format!("<{total} bytes, not text>")),
        };
        let mut shown: String = text.chars().take(chars).collect();
        if (shown.len() as i64) < total {
            shown.push('…');
        }
        Some(shown.replace(['\n', '\r', '\t'], " "))
    }
}

/// The record of `(scope, key)` (the stored scope, as
/// [`Scope::as_stored`](crate::Scope::as_stored) spells it), expired or not.
pub async fn key_record<DB: Backend>(
    pool: &Pool<DB>,
    scope: &str,
    key: &str,
) -> Result<Option<KeyRecord>, sqlx::Error> {
    DB::key_record(pool, scope, key).await
}

/// The records `filter` selects, newest first.
pub async fn key_records<DB: Backend>(
    pool: &Pool<DB>,
    filter: &KeyFilter,
) -> Result<Vec<KeyRecord>, sqlx::Error> {
    DB::key_records(pool, filter).await
}

/// The records every consumer's inbox keeps for `message_id`.
pub async fn inbox_records<DB: Backend>(
    pool: &Pool<DB>,
    message_id: &str,
) -> Result<Vec<KeyRecord>, sqlx::Error> {
    DB::inbox_records(pool, message_id).await
}

/// Deletes the record of `(scope, key)`, whatever its state, so the next
/// request with that key runs the work again; whether there was one. An
/// engine's [`ReplayCache`](crate::ReplayCache) in another process still
/// holds a completed record until it expires there.
pub async fn delete_key<DB: Backend>(
    pool: &Pool<DB>,
    scope: &str,
    key: &str,
) -> Result<bool, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    DB::delete_record(&mut conn, scope, key).await
}

/// Every step with records, with its counts, sorted by step.
pub async fn step_counts<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<StepCount>, sqlx::Error> {
    DB::step_counts(pool).await
}

/// How many records have expired and await the purge.
pub async fn count_expired<DB: Backend>(pool: &Pool<DB>) -> Result<u64, sqlx::Error> {
    DB::count_expired(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_body(body: &[u8], total: i64) -> KeyRecord {
        KeyRecord {
            scope: "4:acme".into(),
            key: "k".into(),
            step: "a.v1".into(),
            status: "completed".into(),
            fingerprint: vec![0xab; 32],
            response_status: Some(200),
            response_content_type: None,
            body_excerpt: Some(body.to_vec()),
            body_bytes: Some(total),
            created_at_ms: 0,
            locked_until_ms: 0,
            expires_at_ms: 10,
            read_at_ms: 5,
        }
    }

    #[test]
    fn shows_bodies_as_text_when_they_are() {
        assert_eq!(
            with_body(b"{\"a\":\n1}", 8).body_text(80).unwrap(),
            "{\"a\": 1}"
        );
        assert_eq!(with_body(b"abcdef", 6).body_text(3).unwrap(), "abc…");
        // An excerpt that ends inside a character.
        let euro = "€".as_bytes();
        assert_eq!(with_body(&euro[..2], 3).body_text(80).unwrap(), "…");
        assert_eq!(
            with_body(&[0xff, 0x00, 0x01], 3).body_text(80).unwrap(),
            "<3 bytes, not text>"
        );
        assert_eq!(with_body(b"", 0).fingerprint_prefix(), "abababab");
        assert!(!with_body(b"", 0).expired());
    }
}
