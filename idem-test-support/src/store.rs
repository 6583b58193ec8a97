//! A store for one test, and the paths of the workspace's example binaries.

use std::path::PathBuf;

use crate::{mysql, postgres};

/// The binary of the workspace example `name`, built by `cargo test` next to
/// the calling test binary (tests run from `target/<profile>/deps`, examples
/// are built into `target/<profile>/examples`). Panics, saying how to build
/// it, if it is missing.
///
/// ```no_run
/// let payments = idem_test_support::example_binary("payments");
/// assert!(payments.ends_with("examples/payments"));
/// ```
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests run from target/<profile>/deps");
    let binary = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: `cargo test` builds it; when running one test target alone, run `cargo build --example {name}` first",
        binary.display()
    );
    binary
}

/// A SQLite database file in a fresh temporary directory; the directory goes
/// when the returned guard drops.
pub fn sqlite_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("idem-sqlite-")
        .tempdir()
        .expect("temp dir");
    let path = dir.path().join("idem.db");
    (dir, path)
}

/// A store for one test: a SQLite file in its own temporary directory, or a
/// fresh database on the process-wide test Postgres server ([`postgres()`](crate::postgres())).
/// A SQLite file's directory is removed when this drops.
///
/// ```no_run
/// # async fn demo() {
/// use idem_test_support::TestDb;
/// let sqlite = TestDb::sqlite();
/// let postgres = TestDb::postgres().await;
/// assert!(sqlite.url().starts_with("sqlite://"));
/// assert!(postgres.url().starts_with("postgres://"));
/// # }
/// ```
#[derive(Debug)]
pub struct TestDb {
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A SQLite file (`sqlite://…/idem.db`) in a fresh temporary directory.
    pub fn sqlite() -> Self {
        let (dir, path) = sqlite_file();
        Self {
            url: format!("sqlite://{}", path.display()),
            _dir: Some(dir),
        }
    }

    /// A new, empty database on the test Postgres server.
    pub async fn postgres() -> Self {
        Self {
            url: postgres().fresh_database().await,
            _dir: None,
        }
    }

    /// A new, empty database on the test MySQL server ([`mysql()`](crate::mysql())).
    pub async fn mysql() -> Self {
        Self {
            url: mysql().fresh_database().await,
            _dir: None,
        }
    }

    /// The store's URL: `sqlite://<path>`, `postgres://…/<database>` or
    /// `mysql://…/<database>`.
    pub fn url(&self) -> &str {
        &self.url
    }
}
