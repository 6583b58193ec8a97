//! idem's test harness, shared by the workspace's tests, examples and
//! benchmark; not published.
//!
//! - [`on_each_store!`] runs a generic test body once per store: a SQLite
//!   file, a database on the throwaway Postgres server, that server with
//!   the row lock as the key lock, and a database on the throwaway MariaDB
//!   server ([`mysql()`], [`MySqlServer`]).
//! - [`Harness`] is what a body gets: an [`Engine`](idem_runtime::Engine) on
//!   a fresh, migrated store with a `payments` business table.
//! - [`TestDb`] is a fresh store alone; [`postgres()`] the process-wide
//!   Postgres server ([`PgServer`]) started from the system binaries.
//!
//! ```no_run
//! use idem_test_support::{on_each_store, Harness, TestBackend};
//! use idem_runtime::Policy;
//!
//! on_each_store! {
//!     stores: sqlite, postgres;
//!     #[tokio::test]
//!     starts_empty,
//! }
//!
//! async fn starts_empty<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
//!     let h = harness(Policy::default()).await;
//!     assert_eq!(h.records().await, 0);
//! }
//! # fn main() {}
//! ```

mod backend;
mod captured;
mod harness;
mod mysql_server;
mod pgbouncer_server;
mod postgres_server;
mod process;
mod store;
pub mod stores;

pub use backend::TestBackend;
pub use captured::Captured;
pub use harness::{charge, child_entry, operation, Harness, BATCH_CHILD_CHARGES};
pub use mysql_server::{mysql, MySqlServer, MYSQL_FAST_SETTINGS};
pub use pgbouncer_server::{PgBouncer, PoolMode};
pub use postgres_server::{postgres, postgres_tool, PgServer, FAST_SETTINGS};
pub use process::{free_port, is_root, run};
pub use store::{example_binary, sqlite_file, TestDb};

/// Emits, for each listed store (a harness constructor in [`stores`]:
/// `sqlite`, `postgres`, `postgres_row_lock`, `postgres_set_local`, `mysql`),
/// a module of that name with one test per listed body, which calls the
/// generic body with the constructor,
/// plus the ignored `child_process_entry` that [`Harness::run_child`] starts.
///
/// Each body is an `async fn name<DB: TestBackend>(harness: impl
/// AsyncFn(Policy) -> Harness<DB>)`; a body that needs only a store calls
/// `DB::test_db()` and leaves the harness unused. Attributes before a name
/// (`#[tokio::test]`, `#[tokio::test(flavor = "multi_thread")]`, `#[ignore]`)
/// go on that test.
///
/// ```no_run
/// use idem_test_support::{on_each_store, Harness, TestBackend};
/// use idem_runtime::Policy;
///
/// on_each_store! {
///     stores: sqlite, postgres, postgres_row_lock;
///     #[tokio::test]
///     replays,
/// }
///
/// async fn replays<DB: TestBackend>(harness: impl AsyncFn(Policy) -> Harness<DB>) {
///     let h = harness(Policy::default()).await;
///     let op = idem_test_support::operation("acme", "k-1", 10);
///     idem_test_support::charge(&h, &op).await.unwrap();
///     assert_eq!(h.payments().await, 1);
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! on_each_store {
    (stores: ; $($tests:tt)*) => {};
    (stores: $store:ident $(, $rest:ident)*; $($tests:tt)*) => {
        $crate::on_each_store!(@store $store; $($tests)*);
        $crate::on_each_store!(stores: $($rest),*; $($tests)*);
    };
    (@store $store:ident; $($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod $store {
            $(
                $(#[$attr])*
                async fn $name() {
                    super::$name($crate::stores::$store).await;
                }
            )*

            /// Runs inside the child process spawned by the crash tests.
            #[tokio::test]
            #[ignore = "entry point for child processes"]
            async fn child_process_entry() {
                $crate::child_entry($crate::stores::$store).await;
            }
        }
    };
}
