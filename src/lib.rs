//! # idem: retried requests made safe
//!
//! Retries are everywhere: mobile clients, gateways, service meshes, SDKs,
//! at-least-once queues. Each can charge a card twice. idem claims the
//! request's idempotency key, runs the business write **in the same SQL
//! transaction** as the stored response, and replays that response to every
//! retry.
//!
//! ```no_run
//! use idem::{Engine, IdempotencyKey, Operation, Problem, Scope};
//! use sqlx::Sqlite;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::<Sqlite>::open_sqlite("app.db").await?;
//! engine.migrate().await?;
//! let op = Operation::new(Scope::tenant("acme"), IdempotencyKey::new("k-1")?, "charge-card.v1", &2500i64);
//! let done = engine
//!     .run(&op, async |tx| {
//!         sqlx::query("INSERT INTO payments (amount) VALUES (2500)").execute(&mut *tx).await?;
//!         Ok::<_, Problem>("pay_1".to_string())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! See [`idem_runtime`] for the engine, the state table and the stores.

pub use idem_runtime::*;
