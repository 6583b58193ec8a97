//! A throwaway MariaDB server, for the MySQL backend's tests.
//!
//! [`mysql()`] starts one MariaDB server per process from the system binaries
//! (`mariadb-install-db` and `mariadbd` on `PATH` or under `/usr/sbin`,
//! `/usr/bin`), in a temporary directory, on a free loopback port, with a
//! `root` user without a password. A watchdog process stops it and removes
//! the directory when the process exits. When `IDEM_TEST_MYSQL_URL` is set
//! (e.g. `mysql://root@127.0.0.1:3306`), that server is used instead. If
//! neither is possible the call panics with instructions: MySQL tests never
//! skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, MySqlConnection};

use crate::process::{database_url, free_port, run, server_dir};

/// A running MariaDB (or MySQL) server.
#[derive(Debug)]
pub struct MySqlServer {
    /// Base URL without a database name, e.g. `mysql://root@127.0.0.1:3307`.
    base_url: String,
    /// The server's data directory, for a server this process started.
    root: Option<PathBuf>,
}

/// Settings for a test server: fast, not durable (tests kill clients, not
/// the server).
pub const MYSQL_FAST_SETTINGS: &[(&str, &str)] = &[
    ("innodb-flush-log-at-trx-commit", "0"),
    ("innodb-doublewrite", "0"),
];

static SHARED: OnceLock<MySqlServer> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// The process-wide MySQL test server, started on first use.
///
/// ```no_run
/// # async fn demo() {
/// let url = idem_test_support::mysql().fresh_database().await;
/// assert!(url.starts_with("mysql://"));
/// # }
/// ```
pub fn mysql() -> &'static MySqlServer {
    SHARED.get_or_init(MySqlServer::from_env_or_start)
}

impl MySqlServer {
    /// Uses `IDEM_TEST_MYSQL_URL` if set, else starts a MariaDB server.
    pub fn from_env_or_start() -> Self {
        match std::env::var("IDEM_TEST_MYSQL_URL") {
            Ok(url) if !url.is_empty() => Self {
                base_url: url,
                root: None,
            },
            _ => Self::start().unwrap_or_else(|error| panic!("{}", how_to_get_mysql(&error))),
        }
    }

    /// Starts a new MariaDB server with [`MYSQL_FAST_SETTINGS`]; see
    /// [`MySqlServer::start_with`].
    pub fn start() -> Result<Self, String> {
        Self::start_with(MYSQL_FAST_SETTINGS)
    }

    /// Starts a new MariaDB server in a temporary directory on a free
    /// loopback port, with each `(name, value)` of `settings` given as
    /// `--name=value`; returns once it accepts connections.
    ///
    /// ```no_run
    /// // Durable, as the server ships: every commit flushed to disk.
    /// let server = idem_test_support::MySqlServer::start_with(&[
    ///     ("innodb-flush-log-at-trx-commit", "1"),
    /// ])
    /// .unwrap();
    /// # drop(server);
    /// ```
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Self, String> {
        let install =
            find_binary("mariadb-install-db").ok_or("mariadb-install-db was not found")?;
        let server = find_binary("mariadbd").ok_or("mariadbd was not found")?;
        let durable = settings
            .iter()
            .all(|&(name, value)| name != "innodb-flush-log-at-trx-commit" || value == "1");
        let root = server_dir("idem-mysql-", durable)?;
        let data = root.join("data");
        let user = current_user();
        run(
            Command::new(&install)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--user={user}"))
                .args([
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                ]),
            "mariadb-install-db",
        )?;
        let port = free_port()?;
        let log = std::fs::File::create(root.join("server.log"))
            .map_err(|e| format!("server log: {e}"))?;
        let log_err = log.try_clone().map_err(|e| format!("server log: {e}"))?;
        let child = Command::new(&server)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", root.join("sock").display()))
            .arg(format!(
                "--pid-file={}",
                root.join("mariadbd.pid").display()
            ))
            .arg(format!("--port={port}"))
            .arg(format!("--user={user}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--max-connections=500",
                "--character-set-server=utf8mb4",
            ])
            .args(
                settings
                    .iter()
                    .map(|(name, value)| format!("--{name}={value}")),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("mariadbd: {e}"))?;
        spawn_watchdog(child.id(), &root);
        let base_url = format!("mysql://root@127.0.0.1:{port}");
        wait_until_accepting(&base_url, &root)?;
        Ok(Self {
            base_url,
            root: Some(root),
        })
    }

    /// The server's log file, for a server this process started.
    pub fn log_file(&self) -> Option<PathBuf> {
        self.root.as_ref().map(|root| root.join("server.log"))
    }

    /// The server's URL for database `name` (replacing any database the base
    /// URL names).
    pub fn url(&self, name: &str) -> String {
        database_url(&self.base_url, name)
    }

    /// Creates a new, empty database and returns its URL.
    pub async fn fresh_database(&self) -> String {
        let name = format!(
            "idem_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = MySqlConnection::connect(&self.url("mysql"))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach the test MySQL server at {}: {e}",
                    self.base_url
                )
            });
        admin
            .execute(format!("CREATE DATABASE {name} CHARACTER SET utf8mb4").as_str())
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} failed: {e}"));
        let _ = admin.close().await;
        self.url(&name)
    }

    /// The server's version string (MariaDB's carries `-MariaDB`).
    pub async fn version(&self) -> String {
        let mut conn = MySqlConnection::connect(&self.url("mysql"))
            .await
            .expect("connect");
        sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut conn)
            .await
            .expect("version")
    }
}

fn how_to_get_mysql(error: &str) -> String {
    format!(
        "the MySQL tests need a MariaDB or MySQL server and could not start one ({error}).\n\
         Install MariaDB so that `mariadb-install-db` and `mariadbd` are on PATH or under /usr/sbin \
         (Debian/Ubuntu: `apt-get install -y mariadb-server`), or point IDEM_TEST_MYSQL_URL at a server \
         whose user may CREATE DATABASE, e.g. IDEM_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306"
    )
}

fn find_binary(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// The user the server runs as: `root` when the tests run as root (mariadbd
/// then needs `--user=root`), else the current user.
fn current_user() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "root".to_owned())
}

/// Polls the server with a connection until one succeeds (60 s at most).
/// Runs on a thread of its own, since callers may be inside a runtime.
fn wait_until_accepting(base_url: &str, root: &Path) -> Result<(), String> {
    let url = format!("{base_url}/mysql");
    let log = root.join("server.log");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        runtime.block_on(async {
            let started = Instant::now();
            loop {
                match MySqlConnection::connect(&url).await {
                    Ok(conn) => {
                        let _ = conn.close().await;
                        return Ok(());
                    }
                    Err(error) if started.elapsed() > Duration::from_secs(60) => {
                        let tail = std::fs::read_to_string(&log).unwrap_or_default();
                        return Err(format!(
                            "mariadbd did not accept connections within 60 s ({error}); its log:\n{tail}"
                        ));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
    })
    .join()
    .map_err(|_| "the wait for mariadbd panicked".to_owned())?
}

/// Kills the server and removes its directory once this process is gone.
/// The paths reach the shell as positional parameters, never as script text.
fn spawn_watchdog(server: u32, root: &Path) {
    const SCRIPT: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
kill -9 "$2" 2>/dev/null
while kill -0 "$2" 2>/dev/null; do sleep 0.1; done
rm -rf -- "$3""#;
    let _ = Command::new("sh")
        .args(["-c", SCRIPT, "idem-mysql-watchdog"])
        .arg(std::process::id().to_string())
        .arg(server.to_string())
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_a_server_with_fresh_databases() {
        let server = mysql();
        assert!(!server.version().await.is_empty());
        let (a, b) = (server.fresh_database().await, server.fresh_database().await);
        assert_ne!(a, b);
        let mut conn = MySqlConnection::connect(&a).await.expect("connect");
        let tables: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()",
        )
        .fetch_one(&mut conn)
        .await
        .expect("count");
        assert_eq!(tables, 0);
    }
}
