//! A throwaway Postgres server.
//!
//! [`postgres()`] starts one Postgres cluster per process from the system
//! binaries (`initdb`/`pg_ctl` on `PATH` or under `/usr/lib/postgresql/*/bin`),
//! in a temporary directory, on a free loopback port. A watchdog process stops
//! it and removes the directory when the process exits. When
//! `IDEM_TEST_DATABASE_URL` is set, that server is used instead. If neither is
//! possible the call panics with instructions: Postgres tests never skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::process::{database_url, free_port, is_root, run, server_dir};
use sqlx::{Connection, Executor, PgConnection};

/// Settings for a test cluster: fast, not durable (tests kill clients, not the server).
pub const FAST_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
];

/// A running Postgres server.
#[derive(Debug)]
pub struct PgServer {
    /// Base URL without a database name, e.g. `postgres://postgres@127.0.0.1:5433`.
    base_url: String,
    /// Settings the server was started with.
    settings: Vec<(String, String)>,
    /// How to stop and start it again; `None` for an external server.
    cluster: Option<Cluster>,
}

/// A cluster this process started: what `pg_ctl` needs to stop and start it.
#[derive(Debug)]
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    options: String,
    as_root: bool,
}

impl Cluster {
    fn pg_ctl(&self) -> Command {
        as_postgres(self.bin.join("pg_ctl"), self.as_root)
    }
}

static SHARED: OnceLock<PgServer> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// The process-wide test server, started on first use with [`FAST_SETTINGS`].
///
/// ```no_run
/// # async fn demo() {
/// let url = idem_test_support::postgres().fresh_database().await;
/// # }
/// ```
pub fn postgres() -> &'static PgServer {
    SHARED.get_or_init(|| PgServer::from_env_or_start(FAST_SETTINGS))
}

impl PgServer {
    /// Uses `IDEM_TEST_DATABASE_URL` if set, else starts a cluster with `settings`.
    pub fn from_env_or_start(settings: &[(&str, &str)]) -> Self {
        match std::env::var("IDEM_TEST_DATABASE_URL") {
            Ok(url) if !url.is_empty() => Self {
                base_url: url,
                settings: Vec::new(),
                cluster: None,
            },
            _ => Self::start(settings)
                .unwrap_or_else(|error| panic!("{}", how_to_get_postgres(&error))),
        }
    }

    /// Starts a new cluster with the given `postgresql.conf` settings.
    pub fn start(settings: &[(&str, &str)]) -> Result<Self, String> {
        let bin = find_bin_dir().ok_or("initdb and pg_ctl were not found")?;
        let durable = !settings.contains(&("fsync", "off"));
        let root = server_dir("idem-pg-", durable)?;
        let data = root.join("data");
        let as_root = is_root();
        if as_root {
            run(
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&root),
                "chown",
            )?;
        }
        let port = free_port()?;
        let pg = |tool: &str| as_postgres(bin.join(tool), as_root);
        run(
            pg("initdb").arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]),
            "initdb",
        )?;
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c max_connections=300",
            root.display()
        );
        for (name, value) in settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let cluster = Cluster {
            bin: bin.clone(),
            data: data.clone(),
            log: root.join("postgres.log"),
            options,
            as_root,
        };
        let server = Self {
            base_url: format!("postgres://postgres@127.0.0.1:{port}"),
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster: Some(cluster),
        };
        server.start_again()?;
        spawn_watchdog(&bin, &root, &data, as_root);
        Ok(server)
    }

    /// Stops a server this process started (`pg_ctl stop -m fast`: open
    /// connections are cut, nothing more is accepted), for tests of a store
    /// that goes away. [`PgServer::start_again`] brings it back on the same
    /// port with the same data.
    ///
    /// ```no_run
    /// let server = idem_test_support::PgServer::start(idem_test_support::FAST_SETTINGS).unwrap();
    /// server.stop().unwrap();
    /// server.start_again().unwrap();
    /// ```
    pub fn stop(&self) -> Result<(), String> {
        let cluster = self.cluster()?;
        run(
            cluster
                .pg_ctl()
                .arg("-D")
                .arg(&cluster.data)
                .args(["-m", "fast", "-w", "-t", "60", "stop"]),
            "pg_ctl stop",
        )
    }

    /// Starts a server this process started and [stopped](PgServer::stop)
    /// again, on the same port with the same data; returns once it accepts
    /// connections.
    pub fn start_again(&self) -> Result<(), String> {
        let cluster = self.cluster()?;
        run(
            cluster
                .pg_ctl()
                .arg("-D")
                .arg(&cluster.data)
                .arg("-l")
                .arg(&cluster.log)
                .args(["-o", &cluster.options, "-w", "-t", "60", "start"]),
            "pg_ctl start",
        )
    }

    fn cluster(&self) -> Result<&Cluster, String> {
        self.cluster.as_ref().ok_or_else(|| {
            "an external server (IDEM_TEST_DATABASE_URL) is not stopped or started by the tests"
                .to_owned()
        })
    }

    /// The server's log file, for a cluster this process started.
    pub fn log_file(&self) -> Option<&Path> {
        self.cluster.as_ref().map(|cluster| cluster.log.as_path())
    }

    /// The port of the server's URL on its host, if the URL names one.
    ///
    /// ```no_run
    /// let port = idem_test_support::postgres().port().unwrap();
    /// assert!(idem_test_support::postgres().url("postgres").contains(&format!(":{port}/")));
    /// ```
    pub fn port(&self) -> Option<u16> {
        let base = self.base_url.split(['?', '#']).next().unwrap_or_default();
        let authority = base.split_once("://").map_or(base, |(_, rest)| rest);
        let host = authority.split('/').next().unwrap_or_default();
        let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
        host.rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
    }

    /// The server's URL for database `name` (replacing any database the base URL names).
    pub fn url(&self, name: &str) -> String {
        database_url(&self.base_url, name)
    }

    /// The settings this server was started with (empty for an external server).
    pub fn settings(&self) -> &[(String, String)] {
        &self.settings
    }

    /// Creates a new, empty database and returns its URL.
    pub async fn fresh_database(&self) -> String {
        let name = format!(
            "idem_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = PgConnection::connect(&self.url("postgres"))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach the test Postgres server at {}: {e}",
                    self.base_url
                )
            });
        admin
            .execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} failed: {e}"));
        let _ = admin.close().await;
        self.url(&name)
    }

    /// The server's version string.
    pub async fn version(&self) -> String {
        let mut conn = PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect");
        sqlx::query_scalar("SHOW server_version")
            .fetch_one(&mut conn)
            .await
            .expect("version")
    }
}

fn how_to_get_postgres(error: &str) -> String {
    format!(
        "the Postgres tests need a Postgres server and could not start one ({error}).\n\
         Install PostgreSQL so that `initdb` and `pg_ctl` are on PATH or under /usr/lib/postgresql/*/bin \
         (Debian/Ubuntu: `apt-get install -y postgresql`), or point IDEM_TEST_DATABASE_URL at a server \
         whose user may CREATE DATABASE, e.g. IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432"
    )
}

fn find_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
    });
    // Resolve symlinks so the cluster's binaries come from one installation.
    if let Some(dir) = on_path {
        let initdb = std::fs::canonicalize(dir.join("initdb")).ok()?;
        return initdb.parent().map(Path::to_path_buf);
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    candidates.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    candidates.pop()
}

/// A command running the system's Postgres tool `tool` (`pg_ctl`,
/// `pg_basebackup`, …) from the installation the harness uses, as the
/// `postgres` user when the tests run as root.
///
/// ```no_run
/// let status = idem_test_support::postgres_tool("pg_ctl").arg("--version").status().unwrap();
/// assert!(status.success());
/// ```
pub fn postgres_tool(tool: &str) -> Command {
    let exe = find_bin_dir()
        .expect("initdb and pg_ctl were not found")
        .join(tool);
    as_postgres(exe, is_root())
}

fn as_postgres(exe: PathBuf, as_root: bool) -> Command {
    if as_root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(exe);
        cmd
    } else {
        Command::new(exe)
    }
}

/// Stops the cluster and removes its directory once this process is gone.
/// The paths reach the shell as positional parameters, never as script text.
fn spawn_watchdog(bin: &Path, root: &Path, data: &Path, as_root: bool) {
    const SCRIPT: &str = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
if [ "$5" = root ]; then runuser -u postgres -- "$2" -D "$3" -m immediate stop; else "$2" -D "$3" -m immediate stop; fi >/dev/null 2>&1
rm -rf -- "$4""#;
    let _ = Command::new("sh")
        .args(["-c", SCRIPT, "idem-pg-watchdog"])
        .arg(std::process::id().to_string())
        .arg(bin.join("pg_ctl"))
        .arg(data)
        .arg(root)
        .arg(if as_root { "root" } else { "user" })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}
