//! Helpers the server harnesses share: who runs the tests, where a server
//! keeps its data, a free loopback port, a command run to completion with its
//! output on failure, a database's URL on a server.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether the tests run as root: then the servers run as the `postgres`
/// user, since neither Postgres nor PgBouncer runs as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A new directory, named `prefix…`, for a throwaway server's data, socket
/// and log; it outlives this call (the server's watchdog removes it).
///
/// A server that does not flush to disk anyway (`durable == false`: the
/// suite's, with fsync off) keeps it in memory, under `/dev/shm` when the
/// machine has it, so that the suite's many short-lived servers do not queue
/// behind the disk; a durable server (the benchmark's, whose flushes are what
/// it measures) under the system's temporary directory.
/// `IDEM_TEST_SERVER_DIR` names the parent for both.
pub(crate) fn server_dir(prefix: &str, durable: bool) -> Result<PathBuf, String> {
    let memory = Path::new("/dev/shm");
    let parent = match std::env::var_os("IDEM_TEST_SERVER_DIR") {
        Some(dir) => PathBuf::from(dir),
        None if !durable && memory.is_dir() => memory.to_path_buf(),
        None => std::env::temp_dir(),
    };
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&parent)
        .map(tempfile::TempDir::keep)
        .map_err(|e| format!("a directory under {}: {e}", parent.display()))
}

/// A free TCP port on 127.0.0.1 (free when asked: bind it soon), below the
/// kernel's ephemeral range (32768 and up on Linux): a server stopped and
/// started again on its port would otherwise find it taken, meanwhile, by
/// any outgoing connection.
pub fn free_port() -> Result<u16, String> {
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port in 20000-31999".to_owned())
}

/// Runs `cmd` to its end; `Err` with its output unless it succeeded.
pub fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `base_url` (a server's URL, with or without a database and a query)
/// naming database `name` instead, its query kept.
pub(crate) fn database_url(base_url: &str, name: &str) -> String {
    let (base, query) = match base_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (base_url, None),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let path = base[authority..]
        .find('/')
        .map_or(base.len(), |i| authority + i);
    let mut url = format!("{}/{name}", &base[..path]);
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}
