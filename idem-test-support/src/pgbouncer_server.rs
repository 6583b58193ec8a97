//! A throwaway PgBouncer in front of a test Postgres server.
//!
//! [`PgBouncer::start`] runs the system's `pgbouncer` (Debian package
//! `pgbouncer`) on a free loopback port, with its own ini and userlist in a
//! temporary directory, `auth_type = trust`, every database of the server
//! reachable under its own name, and the given pool mode. A watchdog stops
//! it when the test process exits.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, is_root, run};
use crate::PgServer;

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole
    /// life (`server_reset_query = DISCARD ALL` when it leaves).
    Session,
    /// A server connection per transaction: between transactions a client
    /// may get another one.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of `server` (a cluster reached on
    /// 127.0.0.1), with at most `pool_size` server connections per database;
    /// returns once it accepts connections.
    ///
    /// ```no_run
    /// use idem_test_support::{postgres, PgBouncer, PoolMode};
    /// let bouncer = PgBouncer::start(postgres(), PoolMode::Transaction, 8).unwrap();
    /// let url = bouncer.url("postgres");
    /// ```
    pub fn start(server: &PgServer, mode: PoolMode, pool_size: u32) -> Result<Self, String> {
        let bin = find_pgbouncer().ok_or(
            "pgbouncer was not found: install it (Debian/Ubuntu: apt-get install -y pgbouncer)",
        )?;
        let server_port = server
            .port()
            .ok_or_else(|| format!("no port in {}", server.url("postgres")))?;
        let dir = tempfile::Builder::new()
            .prefix("idem-pgbouncer-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?
            .keep();
        let port = free_port()?;
        let ini = format!(
            "[databases]\n\
             * = host=127.0.0.1 port={server_port} user=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             admin_users = postgres\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_login_retry = 1\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            dir = dir.display(),
            mode = mode.as_str(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).map_err(|e| format!("ini: {e}"))?;
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n")
            .map_err(|e| format!("userlist: {e}"))?;
        let as_root = is_root();
        if as_root {
            run(
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&dir),
                "chown",
            )?;
        }
        // PgBouncer refuses to run as root; the watchdog runs it in the
        // foreground and stops it once this process is gone. Paths reach
        // the shell as positional parameters, never as script text.
        const SCRIPT: &str = r#"if [ "$4" = root ]; then runuser -u postgres -- "$2" "$3/pgbouncer.ini" & else "$2" "$3/pgbouncer.ini" & fi
child=$!
while kill -0 "$1" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 0.5; done
kill -INT "$child" 2>/dev/null; sleep 1; kill -9 "$child" 2>/dev/null
rm -rf -- "$3""#;
        Command::new("sh")
            .args(["-c", SCRIPT, "idem-pgbouncer-watchdog"])
            .arg(std::process::id().to_string())
            .arg(&bin)
            .arg(&dir)
            .arg(if as_root { "root" } else { "user" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("pgbouncer: {e}"))?;
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                let log = std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default();
                return Err(format!("pgbouncer did not start on port {port}: {log}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { port, dir })
    }

    /// The URL of database `name` through the pooler.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// PgBouncer's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

fn find_pgbouncer() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("pgbouncer"))
            .find(|exe| exe.is_file())
    });
    on_path.or_else(|| {
        let exe = PathBuf::from("/usr/sbin/pgbouncer");
        exe.is_file().then_some(exe)
    })
}
