//! One idem store, SQLite, Postgres or MySQL, opened from what the operator typed,
//! and what the commands read and change there, through the runtime's
//! administration functions.

use std::str::FromStr;

use idem_runtime::admin;
pub use idem_runtime::admin::{KeyFilter, KeyRecord, StepCount, BODY_EXCERPT};
use idem_runtime::inbox::{self, InboxError, PoisonMessage};
use idem_runtime::migrations::{self, PendingMigration};
use idem_runtime::outbox::{self, Backlog, MessageState, OutboxEntry};
use idem_runtime::{Engine, Policy};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{MySqlPool, PgPool, SqlitePool};

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

/// Where a store lives: a `postgres://` or `mysql://` URL, a `sqlite:` URL
/// or a file path.
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
            return Err(
                "a store is NAME=URL, a postgres:// or mysql:// URL or a SQLite file path".into(),
            );
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
        crate::config::is_postgres(&self.location)
    }

    fn is_mysql(&self) -> bool {
        self.location.starts_with("mysql://") || self.location.starts_with("mariadb://")
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

/// Where a record lives: a service's store, and its shard when the service
/// has several.
///
/// ```
/// use idem_cli::store::{Place, StoreSpec};
/// let spec: StoreSpec = "orders=orders.db".parse().unwrap();
/// assert_eq!(Place::from(&spec).to_string(), "orders");
/// let shard = Place { service: "payments".into(), shard: Some(1) };
/// assert_eq!(shard.to_string(), "payments shard 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The service.
    pub service: String,
    /// The shard's index, for a sharded service.
    pub shard: Option<usize>,
}

impl From<&StoreSpec> for Place {
    /// A store given on its own (`NAME=URL`): no shard.
    fn from(spec: &StoreSpec) -> Self {
        Place {
            service: spec.name.clone(),
            shard: None,
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.shard {
            Some(shard) => write!(f, "{} shard {shard}", self.service),
            None => f.write_str(&self.service),
        }
    }
}

impl Place {
    /// Sets `store` (and `shard`, for a shard) on a JSON object.
    ///
    /// ```
    /// use idem_cli::store::Place;
    /// let mut value = serde_json::json!({"status": "completed"});
    /// Place { service: "payments".into(), shard: Some(2) }.tag(&mut value);
    /// assert_eq!(value["store"], "payments");
    /// assert_eq!(value["shard"], 2);
    /// ```
    pub fn tag(&self, value: &mut serde_json::Value) {
        value["store"] = serde_json::json!(self.service);
        if let Some(shard) = self.shard {
            value["shard"] = serde_json::json!(shard);
        }
    }
}

/// An open store.
pub enum Store {
    /// A SQLite file.
    Sqlite(SqlitePool),
    /// A Postgres database.
    Postgres(PgPool),
    /// A MySQL (or MariaDB) database.
    MySql(MySqlPool),
}

/// How a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The database must exist (every command but `migrate`).
    Existing,
    /// A missing SQLite file is created (`migrate`).
    CreateIfMissing,
}

const HINT: &str = " (is this an idem store? `idem migrate --store ...` creates its table)";

/// Runs `$body` with `$pool` bound to the store's pool, whichever backend it is.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            Store::Sqlite($pool) => $body,
            Store::Postgres($pool) => $body,
            Store::MySql($pool) => $body,
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
        } else if spec.is_mysql() {
            idem_runtime::store::mysql::connect(&spec.location, &policy, 2)
                .await
                .map(Store::MySql)
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

    /// The backend's name: `sqlite`, `postgres` or `mysql`.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
            Store::MySql(_) => "mysql",
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
        on_pool!(self, pool => admin::key_record(pool, scope, key).await)
            .map_err(Self::query_error(name))
    }

    /// Records matching `filter`, newest first.
    pub async fn records(
        &self,
        name: &str,
        filter: &KeyFilter,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        on_pool!(self, pool => admin::key_records(pool, filter).await)
            .map_err(Self::query_error(name))
    }

    /// Deletes the record of `(scope, key)`; whether there was one.
    pub async fn delete(&self, name: &str, scope: &str, key: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool => admin::delete_key(pool, scope, key).await)
            .map_err(Self::query_error(name))
    }

    /// Every step with records, with its counts, sorted by step.
    pub async fn steps(&self, name: &str) -> Result<Vec<StepCount>, StoreError> {
        on_pool!(self, pool => admin::step_counts(pool).await).map_err(Self::query_error(name))
    }

    /// How many records have expired and await the purge.
    pub async fn count_expired(&self, name: &str) -> Result<u64, StoreError> {
        on_pool!(self, pool => admin::count_expired(pool).await).map_err(Self::query_error(name))
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
            Store::MySql(pool) => sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.tables
                 WHERE table_schema = DATABASE() AND table_name = ?",
            )
            .bind(table)
            .fetch_one(pool)
            .await
            .map(|n| n > 0),
        }
        .map_err(Self::query_error(name))
    }

    /// The outbox's backlog: pending, the oldest pending age, blocked
    /// ordering keys, dead.
    pub async fn outbox_backlog(&self, name: &str) -> Result<Backlog, StoreError> {
        on_pool!(self, pool => outbox::backlog(pool).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Up to `limit` outbox messages, in `state` if given, newest first.
    pub async fn outbox_list(
        &self,
        name: &str,
        state: Option<MessageState>,
        limit: u32,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        on_pool!(self, pool => outbox::list(pool, state, limit).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// One outbox message.
    pub async fn outbox_entry(
        &self,
        name: &str,
        message_id: &str,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        on_pool!(self, pool => outbox::entry(pool, message_id).await)
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
        on_pool!(self, pool => outbox::entries_for(pool, scope, parent_key).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Dead → pending; whether a dead message had that id.
    pub async fn outbox_requeue(&self, name: &str, message_id: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool => outbox::requeue(pool, message_id).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Unsent → sent with receipt `skipped`; whether an unsent message had that id.
    pub async fn outbox_skip(&self, name: &str, message_id: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool => outbox::skip(pool, message_id).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Up to `limit` poisoned messages, of `consumer` or of every consumer.
    pub async fn inbox_poisoned(
        &self,
        name: &str,
        consumer: Option<&str>,
        limit: u32,
    ) -> Result<Vec<PoisonMessage>, StoreError> {
        on_pool!(self, pool => inbox::poisoned(pool, consumer, limit).await)
            .map_err(|error| Self::queue_error(name)(error.to_string()))
    }

    /// Requeues `consumer`'s poisoned `message_id`; `None` if there is no such row.
    pub async fn inbox_requeue(
        &self,
        name: &str,
        consumer: &str,
        message_id: &str,
    ) -> Result<Option<PoisonMessage>, StoreError> {
        match on_pool!(self, pool => inbox::requeue(pool, consumer, message_id).await) {
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
        let records = on_pool!(self, pool => admin::inbox_records(pool, message_id).await)
            .map_err(Self::query_error(name))?;
        let poison = if self.has_table(name, "idem_poison").await? {
            on_pool!(self, pool => inbox::poison_for_message(pool, message_id).await)
                .map_err(|error| Self::queue_error(name)(error.to_string()))?
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
