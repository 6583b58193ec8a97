//! One idem store, SQLite or Postgres, opened from what the operator typed,
//! and the read and delete queries the commands run on its key table.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::inbox::{self, InboxBackend, InboxError, PoisonMessage};
use idem_runtime::migrations::{self, PendingMigration};
use idem_runtime::outbox::{self, Backlog, MessageState, OutboxEntry, OutboxStore};
use idem_runtime::{Engine, Policy};
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

/// How many bytes of a stored response body a record carries for display.
pub const BODY_EXCERPT: usize = 512;

/// Why a store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or opened.
    #[error("store {name}: cannot open {location}: {source}")]
    Open {
        /// The store's name.
        name: String,
        /// Where it was looked for (any password hidden).
        location: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// A query failed (no idem table, permissions, a dropped connection).
    #[error("store {name}: {source}{hint}")]
    Query {
        /// The store's name.
        name: String,
        /// The driver's error.
        source: sqlx::Error,
        /// What to check.
        hint: &'static str,
    },
    /// An outbox or inbox operation failed.
    #[error("store {name}: {message}{hint}")]
    Queue {
        /// The store's name.
        name: String,
        /// The runtime's error.
        message: String,
        /// What to check.
        hint: &'static str,
    },
    /// Migrating failed.
    #[error("store {name}: migration failed: {source}")]
    Migrate {
        /// The store's name.
        name: String,
        /// The migrator's error.
        source: sqlx::migrate::MigrateError,
    },
}

/// Where a store lives: a `postgres://` URL, a `sqlite:` URL or a file path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec {
    /// The name shown in output: what came before `=`, or the file's stem /
    /// the database's name.
    pub name: String,
    /// The URL or path.
    pub location: String,
}

impl FromStr for StoreSpec {
    type Err = String;

    /// `NAME=URL` or just `URL`. `NAME` is letters, digits, `-` and `_`, so an
    /// `=` inside a URL's query string is never taken for a name.
    fn from_str(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("a store is NAME=URL, a postgres:// URL or a SQLite file path".into());
        }
        if let Some((name, location)) = text.split_once('=') {
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                if location.is_empty() {
                    return Err(format!("store {name}: the URL or path after `=` is empty"));
                }
                return Ok(StoreSpec {
                    name: name.to_owned(),
                    location: location.to_owned(),
                });
            }
        }
        Ok(StoreSpec {
            name: default_name(text),
            location: text.to_owned(),
        })
    }
}

fn default_name(location: &str) -> String {
    let trimmed = location.split(['?', '#']).next().unwrap_or(location);
    let last = trimmed.rsplit('/').next().unwrap_or(trimmed);
    let stem = last.split('.').next().unwrap_or(last);
    if stem.is_empty() {
        "store".into()
    } else {
        stem.to_owned()
    }
}

impl StoreSpec {
    fn is_postgres(&self) -> bool {
        self.location.starts_with("postgres://") || self.location.starts_with("postgresql://")
    }

    /// A location with any password replaced, for messages.
    pub fn redacted(&self) -> String {
        match (self.location.find("://"), self.location.find('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let credentials = &self.location[scheme + 3..at];
                match credentials.split_once(':') {
                    Some((user, _)) => format!(
                        "{}{user}:***{}",
                        &self.location[..scheme + 3],
                        &self.location[at..]
                    ),
                    None => self.location.clone(),
                }
            }
            _ => self.location.clone(),
        }
    }
}

/// An open store.
pub enum Store {
    /// A SQLite file.
    Sqlite(SqlitePool),
    /// A Postgres database.
    Postgres(PgPool),
}

/// How a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The database must exist (every command but `migrate`).
    Existing,
    /// A missing SQLite file is created (`migrate`).
    CreateIfMissing,
}

/// One key record, as the commands show it. Times are Unix milliseconds.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct KeyRecord {
    /// The stored scope (`<len>:<part>/...`).
    pub scope: String,
    /// The key; shown only with `--show-keys`.
    #[serde(skip)]
    pub key: String,
    /// The step that wrote it.
    pub step: String,
    /// `in_progress` or `completed`.
    pub status: String,
    /// The request's SHA-256.
    #[serde(skip)]
    pub fingerprint: Vec<u8>,
    /// The stored response's HTTP status.
    pub response_status: Option<i64>,
    /// The stored response's content type.
    pub response_content_type: Option<String>,
    /// The first [`BODY_EXCERPT`] bytes of the stored body.
    #[serde(skip)]
    pub body_excerpt: Option<Vec<u8>>,
    /// The whole body's length in bytes.
    pub body_bytes: Option<i64>,
    /// When the record was created.
    pub created_at_ms: i64,
    /// Until when its claim holds the key.
    pub locked_until_ms: i64,
    /// When it expires (is treated as absent, then purged).
    pub expires_at_ms: i64,
    /// The store's clock when the record was read.
    pub read_at_ms: i64,
}

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
        self.fingerprint
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect()
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

/// A step's records in one store.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct StepCount {
    /// The step.
    pub step: String,
    /// Unexpired records.
    pub live: i64,
    /// Unexpired records whose claim still holds the key.
    pub in_progress: i64,
    /// All records, expired ones included.
    pub total: i64,
}

/// Which records `keys list` shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this stored scope.
    pub scope: Option<String>,
    /// Only this step.
    pub step: Option<String>,
    /// Only this status.
    pub status: Option<String>,
    /// Expired ones too.
    pub include_expired: bool,
    /// At most this many, newest first.
    pub limit: u32,
}

const HINT: &str = " (is this an idem store? `idem migrate --store ...` creates its table)";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs `$body` with `$pool` bound to the store's pool, whichever backend it is.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite($pool) => $body,
            Store::Postgres($pool) => $body,
        }
    };
}

impl Store {
    /// Opens the store `spec` names.
    pub async fn open(spec: &StoreSpec, mode: OpenMode) -> Result<Self, StoreError> {
        let policy = Policy::default();
        let opened = if spec.is_postgres() {
            idem_runtime::store::postgres::connect(&spec.location, &policy, 2)
                .await
                .map(Store::Postgres)
        } else {
            let options = if spec.location.starts_with("sqlite:") {
                SqliteConnectOptions::from_str(&spec.location)
            } else {
                Ok(SqliteConnectOptions::new().filename(&spec.location))
            };
            match options {
                Ok(options) => {
                    let options = options
                        .create_if_missing(mode == OpenMode::CreateIfMissing)
                        .journal_mode(SqliteJournalMode::Wal)
                        .busy_timeout(policy.wait_timeout);
                    SqlitePoolOptions::new()
                        .max_connections(2)
                        .connect_with(options)
                        .await
                        .map(Store::Sqlite)
                }
                Err(error) => Err(error),
            }
        };
        opened.map_err(|source| StoreError::Open {
            name: spec.name.clone(),
            location: spec.redacted(),
            source,
        })
    }

    /// `true` for Postgres.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// The SQL for "now" in milliseconds, the record columns, and the
    /// expression for "now" in the column's own type.
    fn columns(&self) -> (String, String) {
        match self {
            Store::Sqlite(_) => {
                let now = now_ms().to_string();
                (
                    format!(
                        "scope, key, step, status, fingerprint, response_status, response_content_type, \
                         substr(response_body, 1, {BODY_EXCERPT}) AS body_excerpt, \
                         length(response_body) AS body_bytes, created_at AS created_at_ms, \
                         locked_until AS locked_until_ms, expires_at AS expires_at_ms, \
                         CAST({now} AS BIGINT) AS read_at_ms"
                    ),
                    now,
                )
            }
            Store::Postgres(_) => (
                format!(
                    "scope::text, key::text, step, status, fingerprint, response_status::int8 AS response_status, \
                     response_content_type, substring(response_body FROM 1 FOR {BODY_EXCERPT}) AS body_excerpt, \
                     octet_length(response_body)::int8 AS body_bytes, \
                     (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms, \
                     (extract(epoch FROM locked_until) * 1000)::int8 AS locked_until_ms, \
                     (extract(epoch FROM expires_at) * 1000)::int8 AS expires_at_ms, \
                     (extract(epoch FROM now()) * 1000)::int8 AS read_at_ms"
                ),
                "now()".into(),
            ),
        }
    }

    fn query_error(name: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
        move |source| StoreError::Query {
            name: name.to_owned(),
            source,
            hint: HINT,
        }
    }

    /// The record of `(scope, key)`, expired or not.
    pub async fn record(
        &self,
        name: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let (columns, _) = self.columns();
        let sql = format!("SELECT {columns} FROM idempotency_keys WHERE scope = $1 AND key = $2");
        on_pool!(self, pool => sqlx::query_as::<_, KeyRecord>(&sql)
            .bind(scope)
            .bind(key)
            .fetch_optional(pool)
            .await)
        .map_err(Self::query_error(name))
    }

    /// Records matching `filter`, newest first.
    pub async fn records(&self, name: &str, filter: &Filter) -> Result<Vec<KeyRecord>, StoreError> {
        let (columns, now) = self.columns();
        let mut conditions = Vec::new();
        let mut binds = Vec::new();
        for (column, value) in [
            ("scope", &filter.scope),
            ("step", &filter.step),
            ("status", &filter.status),
        ] {
            if let Some(value) = value {
                binds.push(value.clone());
                conditions.push(format!("{column} = ${}", binds.len()));
            }
        }
        if !filter.include_expired {
            conditions.push(format!("expires_at > {now}"));
        }
        let mut sql = format!("SELECT {columns} FROM idempotency_keys");
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(&format!(
            " ORDER BY created_at DESC, scope, key LIMIT {}",
            filter.limit
        ));
        on_pool!(self, pool => {
            let mut query = sqlx::query_as::<_, KeyRecord>(&sql);
            for value in &binds {
                query = query.bind(value);
            }
            query.fetch_all(pool).await
        })
        .map_err(Self::query_error(name))
    }

    /// Deletes the record of `(scope, key)`; whether there was one.
    pub async fn delete(&self, name: &str, scope: &str, key: &str) -> Result<bool, StoreError> {
        let sql = "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2";
        on_pool!(self, pool => sqlx::query(sql).bind(scope).bind(key).execute(pool).await
            .map(|done| done.rows_affected() > 0))
        .map_err(Self::query_error(name))
    }

    /// Every step with records, with its counts, sorted by step.
    pub async fn steps(&self, name: &str) -> Result<Vec<StepCount>, StoreError> {
        let (_, now) = self.columns();
        let sql = format!(
            "SELECT step, \
               CAST(sum(CASE WHEN expires_at > {now} THEN 1 ELSE 0 END) AS BIGINT) AS live, \
               CAST(sum(CASE WHEN expires_at > {now} AND status = 'in_progress' AND locked_until > {now} THEN 1 ELSE 0 END) AS BIGINT) AS in_progress, \
               CAST(count(*) AS BIGINT) AS total \
             FROM idempotency_keys GROUP BY step ORDER BY step"
        );
        on_pool!(self, pool => sqlx::query_as::<_, StepCount>(&sql).fetch_all(pool).await)
            .map_err(Self::query_error(name))
    }

    /// How many records have expired and await the purge.
    pub async fn count_expired(&self, name: &str) -> Result<u64, StoreError> {
        let (_, now) = self.columns();
        let sql = format!(
            "SELECT CAST(count(*) AS BIGINT) FROM idempotency_keys WHERE expires_at <= {now}"
        );
        on_pool!(self, pool => sqlx::query_scalar::<_, i64>(&sql).fetch_one(pool).await)
            .map(|n| n as u64)
            .map_err(Self::query_error(name))
    }

    /// Deletes every expired record, in batches of `batch`, as the runtime's purger does.
    pub async fn purge(&self, name: &str, batch: u32) -> Result<u64, StoreError> {
        on_pool!(self, pool => Engine::new(pool.clone()).purge_expired(batch).await)
            .map_err(Self::query_error(name))
    }

    fn queue_error(name: &str) -> impl FnOnce(String) -> StoreError + '_ {
        move |message| StoreError::Queue {
            name: name.to_owned(),
            message,
            hint: HINT,
        }
    }

    /// Whether the database has the table `table` (an older store may lack
    /// the outbox and inbox tables until `idem migrate`).
    pub async fn has_table(&self, name: &str, table: &str) -> Result<bool, StoreError> {
        match self {
            Store::Sqlite(pool) => sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
            )
            .bind(table)
            .fetch_one(pool)
            .await
            .map(|n| n > 0),
            Store::Postgres(pool) => {
                sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
                    .bind(table)
                    .fetch_one(pool)
                    .await
            }
        }
        .map_err(Self::query_error(name))
    }

    /// The outbox's backlog: pending, the oldest pending age, blocked
    /// ordering keys, dead.
    pub async fn outbox_backlog(&self, name: &str) -> Result<Backlog, StoreError> {
        on_pool!(self, pool => outbox::backlog(&Engine::new(pool.clone())).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Up to `limit` outbox messages, in `state` if given, newest first.
    pub async fn outbox_list(
        &self,
        name: &str,
        state: Option<MessageState>,
        limit: u32,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        on_pool!(self, pool => outbox::list(&Engine::new(pool.clone()), state, limit).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// One outbox message.
    pub async fn outbox_entry(
        &self,
        name: &str,
        message_id: &str,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        on_pool!(self, pool => outbox::entry(&Engine::new(pool.clone()), message_id).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// The outbox messages enqueued under `(scope, parent_key)`, oldest
    /// first; none when the store has no outbox table.
    pub async fn outbox_for(
        &self,
        name: &str,
        scope: &str,
        parent_key: &str,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        if !self.has_table(name, "idem_outbox").await? {
            return Ok(Vec::new());
        }
        on_pool!(self, pool => OutboxStore::entries_for(pool, scope, parent_key).await)
            .map_err(Self::query_error(name))
    }

    /// Dead → pending; whether a dead message had that id.
    pub async fn outbox_requeue(&self, name: &str, message_id: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool => outbox::requeue(&Engine::new(pool.clone()), message_id).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Unsent → sent with receipt `skipped`; whether an unsent message had that id.
    pub async fn outbox_skip(&self, name: &str, message_id: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool => outbox::skip(&Engine::new(pool.clone()), message_id).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Up to `limit` poisoned messages, of `consumer` or of every consumer.
    pub async fn inbox_poisoned(
        &self,
        name: &str,
        consumer: Option<&str>,
        limit: u32,
    ) -> Result<Vec<PoisonMessage>, StoreError> {
        on_pool!(self, pool => inbox::poisoned(&Engine::new(pool.clone()), consumer, limit).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Requeues `consumer`'s poisoned `message_id`; `None` if there is no such row.
    pub async fn inbox_requeue(
        &self,
        name: &str,
        consumer: &str,
        message_id: &str,
    ) -> Result<Option<PoisonMessage>, StoreError> {
        match on_pool!(self, pool => inbox::requeue(&Engine::new(pool.clone()), consumer, message_id).await)
        {
            Ok(row) => Ok(Some(row)),
            Err(InboxError::NotPoisoned { .. }) => Ok(None),
            Err(error) => Err(Self::queue_error(name)(error.to_string())),
        }
    }

    /// What consumers in this store did with `message_id`: their key records
    /// (scope `inbox/<consumer>`, key the message id) and their poison rows.
    pub async fn inbox_for(
        &self,
        name: &str,
        message_id: &str,
    ) -> Result<(Vec<KeyRecord>, Vec<PoisonMessage>), StoreError> {
        let (columns, _) = self.columns();
        let sql = format!(
            "SELECT {columns} FROM idempotency_keys WHERE key = $1 AND scope LIKE '%:inbox/%' \
             ORDER BY scope"
        );
        let records = on_pool!(self, pool => sqlx::query_as::<_, KeyRecord>(&sql)
            .bind(message_id)
            .fetch_all(pool)
            .await)
        .map_err(Self::query_error(name))?;
        let poison = if self.has_table(name, "idem_poison").await? {
            on_pool!(self, pool => InboxBackend::poison_for_message(pool, message_id).await)
                .map_err(Self::query_error(name))?
        } else {
            Vec::new()
        };
        Ok((records, poison))
    }

    /// idem's migrations this database lacks.
    pub async fn pending_migrations(
        &self,
        name: &str,
    ) -> Result<Vec<PendingMigration>, StoreError> {
        on_pool!(self, pool => migrations::pending(pool).await).map_err(|source| {
            StoreError::Migrate {
                name: name.to_owned(),
                source,
            }
        })
    }

    /// Applies idem's migrations.
    pub async fn migrate(&self, name: &str) -> Result<(), StoreError> {
        on_pool!(self, pool => Engine::new(pool.clone()).migrate().await).map_err(|source| {
            StoreError::Migrate {
                name: name.to_owned(),
                source,
            }
        })
    }
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

    #[test]
    fn reads_named_and_unnamed_stores() {
        let named: StoreSpec = "payments=postgres://u:pw@h/db?sslmode=disable"
            .parse()
            .unwrap();
        assert_eq!(named.name, "payments");
        assert_eq!(named.location, "postgres://u:pw@h/db?sslmode=disable");
        assert_eq!(named.redacted(), "postgres://u:***@h/db?sslmode=disable");
        let unnamed: StoreSpec = "postgres://h/db?options=a=b".parse().unwrap();
        assert_eq!(unnamed.name, "db");
        let file: StoreSpec = "/tmp/x/orders.db".parse().unwrap();
        assert_eq!(file.name, "orders");
        assert!("".parse::<StoreSpec>().is_err());
        assert!("orders=".parse::<StoreSpec>().is_err());
    }
}
