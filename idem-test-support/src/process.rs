//! Helpers the server harnesses share: who runs the tests, a free loopback
//! port, a command run to completion with its output on failure, a
//! database's URL on a server.

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

/// A free TCP port on 127.0.0.1 (free when asked: bind it soon).
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
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
