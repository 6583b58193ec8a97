//! The stores: one sealed seam, implemented once per database.
//!
//! Everything idem keeps in a database goes through [`Backend`]: the key
//! records of claims, the outbox's messages and
//! the inbox's poison rows. A backend is one folder, `store/<backend>/`, with
//! a file for each of the three (`keys.rs`, `outbox.rs`, `inbox.rs`) and its
//! connection options in `mod.rs`. The engine's logic lives in
//! [`Engine`](crate::Engine), the relay's in [`crate::outbox`], the consumer's in
//! [`crate::inbox`]: a backend only knows how to read and write the rows.
//!
//! Statements that are the same on SQLite and Postgres (`$1` placeholders
//! work on SQLite too) are written once, here; a backend writes its own only
//! where the SQL differs (column types, `now()`, locking clauses). MySQL,
//! whose placeholders are `?` and whose `key` is a reserved word, writes all
//! of its own.

pub(crate) mod inbox;
pub(crate) mod keys;
pub(crate) mod migrate;
pub(crate) mod outbox;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// A database idem keeps its rows in: `sqlx::Sqlite`, `sqlx::Postgres` and
/// `sqlx::MySql`, each behind the feature of its name (`sqlite`,
/// `postgres`, `mysql`). Sealed: the statements are the engine's, each in its
/// backend's folder.
pub trait Backend: keys::Keys + outbox::Outbox + inbox::Inbox + migrate::Schema {}

#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {}
#[cfg(feature = "postgres")]
impl Backend for sqlx::Postgres {}
#[cfg(feature = "mysql")]
impl Backend for sqlx::MySql {}

pub(crate) use keys::{Fresh, Locked, Record, RecordStatus};
