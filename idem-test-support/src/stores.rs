//! The stores [`on_each_store!`](crate::on_each_store) runs a body on, each
//! a harness constructor named like the test module it gets.

use idem_runtime::{KeyLock, Policy, WaitBound};
use sqlx::{MySql, Postgres, Sqlite};

use crate::Harness;

/// A harness on a fresh SQLite file.
pub async fn sqlite(policy: Policy) -> Harness<Sqlite> {
    Harness::new(policy).await
}

/// A harness on a fresh database of the test Postgres server.
pub async fn postgres(policy: Policy) -> Harness<Postgres> {
    Harness::new(policy).await
}

/// A harness on a fresh database of the test Postgres server whose claims
/// hold their keys by row locks ([`KeyLock::Row`]).
pub async fn postgres_row_lock(policy: Policy) -> Harness<Postgres> {
    let h = postgres(policy).await;
    let engine = h.engine.clone().with_key_lock(KeyLock::Row);
    h.with_engine(engine)
}

/// [`postgres_row_lock`] with its lock waits bounded by `SET LOCAL`
/// ([`WaitBound::SetLocal`]), as on Citus.
pub async fn postgres_set_local(policy: Policy) -> Harness<Postgres> {
    let h = postgres_row_lock(policy).await;
    let engine = h.engine.clone().with_wait_bound(WaitBound::SetLocal);
    h.with_engine(engine)
}

/// A harness on a fresh database of the test MySQL (MariaDB) server
/// ([`mysql()`](crate::mysql())).
pub async fn mysql(policy: Policy) -> Harness<MySql> {
    Harness::new(policy).await
}
