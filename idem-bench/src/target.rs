//! What every backend offers the scenarios: one operation of each kind.

use std::future::Future;
use std::pin::Pin;

use idem_runtime::{IdemError, Via};

/// A boxed, owned future.
pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The tenant every throughput scenario writes payments for.
pub const TENANT: &str = "t1";

/// What a scenario's operation or a run fails with.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// One database, set up with the payments table, idem's migrations and the
/// guide's key table, and the same pool for every scenario.
pub trait Target: Send + Sync + 'static {
    /// `postgres` or `sqlite`.
    fn name(&self) -> &'static str;
    /// Server or library version.
    fn version(&self) -> String;
    /// The durability settings in force, for the report.
    fn settings(&self) -> Vec<(String, String)>;
    /// `BEGIN; INSERT INTO payments …; COMMIT`: the floor.
    fn unprotected(&self) -> BoxFut<Result<(), BenchError>>;
    /// The floor for any design that stores the key record in the business
    /// transaction: the payment and a completed key row written by one
    /// statement, `BEGIN; INSERT … ; COMMIT` (three round trips, no lock, no
    /// lookup, no check). Not safe; it only measures the cost of the writes.
    fn same_writes(&self, key: String) -> BoxFut<Result<(), BenchError>>;
    /// The guide's claim → business insert → completion UPDATE → COMMIT.
    fn seed_sql(&self, key: String) -> BoxFut<Result<(), BenchError>>;
    /// [`Target::seed_sql`] that also takes the guide's conflict path: a key
    /// already completed is answered from its stored row (claim refused,
    /// rollback, read), as a careful user replays a retry.
    fn seed_sql_or_replay(&self, key: String) -> BoxFut<Result<(), BenchError>>;
    /// The same business insert through `Engine::run`, for `tenant`.
    fn idem(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>>;
    /// [`Target::idem`] through an engine that keeps a
    /// [`idem_runtime::ReplayCache`] of what it completed.
    fn idem_cached(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>>;
    /// The same through an `#[idempotent]` handler.
    fn idem_macro(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>>;
    /// The same through an engine whose claims hold their key by a row lock
    /// ([`idem_runtime::KeyLock::Row`]); the same as [`Target::idem`] where
    /// the backend has one kind of lock.
    fn idem_row_lock(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        self.idem(key, tenant)
    }
    /// The same through an engine with group commit off
    /// ([`idem_runtime::Policy::group_commit`] `None`); the same as
    /// [`Target::idem`] where the backend does not group commits.
    fn idem_solo(&self, key: String, tenant: String) -> BoxFut<Result<Via, IdemError>> {
        self.idem(key, tenant)
    }
    /// Payments written for `tenant` (to check a storm ran each key once).
    fn payments_for(&self, tenant: String) -> BoxFut<Result<i64, BenchError>>;
}
