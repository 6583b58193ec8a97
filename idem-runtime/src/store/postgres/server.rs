//! Which server speaks Postgres' protocol on the other end, read from its
//! `version()`, and the key lock that server needs.

use sqlx::PgPool;

use super::KeyLock;

/// The server behind a Postgres connection, as its `version()` names it.
///
/// CockroachDB's begins with `CockroachDB` (`CockroachDB CCL v21.1.1
/// (x86_64-apple-darwin19, built …)`); YugabyteDB's is Postgres' with a
/// `-YB-` release in it (`PostgreSQL 11.2-YB-2.18.0.1-b0 on …`). Citus is an
/// extension of Postgres: its servers answer as Postgres.
///
/// ```
/// use idem_runtime::{KeyLock, Server};
/// let server = Server::from_version("CockroachDB CCL v21.1.1 (x86_64-apple-darwin19, built 2021/05/24 15:00:00, go1.15.11)");
/// assert_eq!(server, Server::CockroachDb);
/// assert_eq!(server.key_lock(), KeyLock::Row);
/// assert_eq!(Server::from_version("PostgreSQL 15.4 on x86_64-pc-linux-gnu").key_lock(), KeyLock::Advisory);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// Postgres itself (and Citus, an extension of it), or any server
    /// whose `version()` is not recognised below.
    Postgres,
    /// CockroachDB, which has no advisory locks.
    CockroachDb,
    /// YugabyteDB's YSQL. Its releases before 2.25 have no advisory locks,
    /// and its `version()` does not say whether a later cluster has them
    /// on.
    YugabyteDb,
}

impl Server {
    /// The server a `version()` string names.
    pub fn from_version(version: &str) -> Self {
        if version.starts_with("CockroachDB") {
            Self::CockroachDb
        } else if version.starts_with("PostgreSQL ") && version.contains("-YB-") {
            Self::YugabyteDb
        } else {
            Self::Postgres
        }
    }

    /// Reads `SELECT version()` on `pool` (one statement without
    /// parameters: the simple protocol, safe behind any pooler).
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
    /// let server = idem_runtime::Server::detect(&pool).await?;
    /// println!("claims on {server:?} take {:?}", server.key_lock());
    /// # Ok(()) }
    /// ```
    pub async fn detect(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let row = sqlx::raw_sql("SELECT version()").fetch_one(pool).await?;
        let version: String = sqlx::Row::try_get(&row, 0)?;
        Ok(Self::from_version(&version))
    }

    /// The key lock claims take on this server unless one is chosen with
    /// [`Engine::with_key_lock`](crate::Engine::with_key_lock): the row
    /// path on CockroachDB and YugabyteDB (it needs only row locks, which
    /// both have), advisory locks on Postgres.
    pub fn key_lock(self) -> KeyLock {
        match self {
            Self::Postgres => KeyLock::Advisory,
            Self::CockroachDb | Self::YugabyteDb => KeyLock::Row,
        }
    }
}
