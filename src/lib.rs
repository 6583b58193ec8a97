//! Retried requests made safe: idempotency keys with claim, commit and replay,
//! on SQLite, Postgres and MySQL.
//!
//! Three pieces:
//!
//! - [`steps!`] declares the step names your service uses (`charge-card.v1`),
//!   checked at compile time and registered for the startup check
//!   [`registry::validate`].
//! - [`#[derive(Fingerprint)]`](derive@Fingerprint) hashes a request
//!   canonically, so a retry with the same content matches and a reused key
//!   with different content is refused.
//! - [`#[idempotent]`](idempotent) wraps an `async fn`: the body runs once per
//!   key, its business writes commit in the same transaction as its stored
//!   outcome, and every retry gets that outcome back.
//!
//! The engine alone (without macros) is documented in [`idem_runtime`]; every
//! runtime item is re-exported here.
//!
//! ```no_run
//! use idem::sqlx::SqliteConnection;
//! use idem::{idempotent, steps, ErrorStatus, Fingerprint, IdempotencyKey};
//! use serde::{Deserialize, Serialize};
//!
//! steps! {
//!     /// Charging a customer's card.
//!     pub const CHARGE_CARD = "charge-card.v1";
//! }
//!
//! #[derive(Fingerprint)]
//! struct ChargeRequest {
//!     amount_cents: i64,
//!     currency: String,
//!     #[fingerprint(skip)]
//!     trace_id: String,
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Payment {
//!     id: i64,
//! }
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! enum ChargeError {
//!     Declined,
//!     Database,
//! }
//!
//! impl ErrorStatus for ChargeError {
//!     fn status(&self) -> u16 {
//!         match self {
//!             ChargeError::Declined => 402, // deterministic: stored and replayed
//!             ChargeError::Database => 503, // transient: rolled back, the retry runs
//!         }
//!     }
//! }
//!
//! #[idempotent(scope = "tenant_id", step = CHARGE_CARD)]
//! async fn charge(
//!     tx: &mut SqliteConnection,
//!     tenant_id: String,
//!     key: IdempotencyKey,
//!     #[fingerprint] req: ChargeRequest,
//! ) -> Result<Payment, ChargeError> {
//!     if req.amount_cents > 1_000_000 {
//!         return Err(ChargeError::Declined);
//!     }
//!     let id: i64 = idem::sqlx::query_scalar("INSERT INTO payments (tenant, cents) VALUES (?, ?) RETURNING id")
//!         .bind(&tenant_id)
//!         .bind(req.amount_cents)
//!         .fetch_one(&mut *tx)
//!         .await
//!         .map_err(|_| ChargeError::Database)?;
//!     Ok(Payment { id })
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = idem::Engine::<idem::sqlx::Sqlite>::open_sqlite("app.db").await?;
//! engine.migrate().await?;
//! idem::registry::validate(&engine).await?; // every step problem at once, or Ok
//!
//! let key = IdempotencyKey::new("3f6c1a2e-8b4d-4e7a-9c11-5d2f0b7e6a90")?;
//! let req = ChargeRequest { amount_cents: 2500, currency: "EUR".into(), trace_id: "t-1".into() };
//! let done = charge(&engine, "acme".into(), key, req).await?;
//! // `done.value` is the function's own `Result<Payment, ChargeError>`;
//! // `done.via` says whether it ran now or was replayed.
//! println!("{}", done.via);
//! # Ok(()) }
//! ```

pub use idem_runtime::*;

/// The step registry: declared steps, their uses, and the startup check
/// ([`registry::validate`]).
pub mod registry {
    #[doc(inline)]
    pub use idem_runtime::registry::*;
}

/// A value that can be fed into a request fingerprint; derive it.
///
/// # The derive
///
/// The derive emits the runtime's canonical encoding (see
/// [`mod@idem_runtime::fingerprint`]): fields in ascending name order (sorted at
/// compile time, so declaration order never matters), a `None` field left out
/// entirely (so adding an optional field keeps old fingerprints), skipped fields
/// never written. Enums hash the variant name, then its fields. Type
/// parameters get a `Fingerprint` bound for each hashed field that mentions them.
///
/// Field attributes:
///
/// - `#[fingerprint(skip)]`: timestamps, trace ids: never part of the fingerprint.
/// - `#[fingerprint(rename = "amount")]`: hash under another name, so renaming
///   the Rust field keeps fingerprints stable.
/// - `#[fingerprint(with = path)]`: hash with `fn(&T, &mut FingerprintHasher)`.
///
/// ```
/// use idem::{fingerprint, Fingerprint, FingerprintHasher};
///
/// #[derive(Fingerprint)]
/// struct V1 { amount: i64, currency: String }
///
/// #[derive(Fingerprint)]
/// struct V2 {
///     currency: String,     // reordered
///     #[fingerprint(rename = "amount")]
///     amount_cents: i64,    // renamed in Rust, not in the fingerprint
///     note: Option<String>, // added, left `None`
///     #[fingerprint(skip)]
///     received_at: u64,     // never counts
/// }
///
/// let old = V1 { amount: 2500, currency: "EUR".into() };
/// let new = V2 { currency: "EUR".into(), amount_cents: 2500, note: None, received_at: 7 };
/// assert_eq!(fingerprint("charge.v1", &old), fingerprint("charge.v1", &new));
///
/// // `with`: a function of yours decides the field's canonical form.
/// #[derive(Fingerprint)]
/// struct Signup {
///     #[fingerprint(with = case_insensitive)]
///     email: String,
/// }
/// fn case_insensitive(email: &String, hasher: &mut FingerprintHasher) {
///     hasher.write_str(&email.to_lowercase());
/// }
/// assert_eq!(
///     fingerprint("signup.v1", &Signup { email: "A@x.io".into() }),
///     fingerprint("signup.v1", &Signup { email: "a@x.io".into() }),
/// );
/// ```
pub use idem_macros::Fingerprint;

/// Declares step constants: each name is checked at compile time (`name.vN`)
/// and registered, with its module path, file and line, for
/// [`registry::validate`].
///
/// Each `const NAME = "name.vN";` becomes `const NAME: idem::Step`. Mark a
/// step `#[retired]` once nothing uses it any more, and keep it declared until
/// its keys have expired: the startup check reports live keys for steps that
/// are no longer declared.
///
/// ```
/// idem::steps! {
///     /// Charging a card.
///     pub const CHARGE_CARD = "charge-card.v2";
///     /// The old name, kept until its keys expire.
///     #[retired]
///     pub const CHARGE_CARD_V1 = "charge-card.v1";
/// }
/// assert_eq!(CHARGE_CARD.name(), "charge-card.v2");
/// // A derived key for a downstream call, only from a declared step:
/// let key = idem::IdempotencyKey::new("order-8812").unwrap();
/// assert_eq!(key.child(CHARGE_CARD).as_str(), idem::child_key("order-8812", "charge-card.v2"));
/// ```
pub use idem_macros::steps;

/// Runs an `async fn` under an idempotency key.
///
/// ```text
/// #[idempotent(scope = "tenant_id", step = "charge-card.v1")]
/// #[idempotent(scope = ["tenant_id", "caller"], step = steps::CHARGE_CARD, retain = "7d")]
/// #[idempotent(http, scope = "tenant", step = CREATE_ORDER)]   // an axum handler
/// ```
///
/// # Arguments
///
/// | argument | meaning |
/// |---|---|
/// | `scope = "p"` or `scope = ["p", "q"]` | the parameter(s) whose values form the [`Scope`], outermost first; each implements [`ScopePart`] |
/// | `step = "name.vN"` or `step = CONST` | the step: a literal (checked at compile time) or a constant from [`steps!`] |
/// | `retain = "24h"` | how long the outcome is kept for replays (`ms`, `s`, `m`, `h`, `d`) |
/// | `lock_ttl = "30s"` | a durable claim's lock |
/// | `wait = "5s"` | how long a duplicate waits for a running attempt before a 409 |
/// | `timeout = "10s"` | a bound on the body; past it everything rolls back |
/// | `fail_open` | when the store is down, run without deduplication (default: refuse) |
/// | `durable` | commit the claim before the body runs ([`ClaimMode::Durable`]) |
/// | `http` | axum mode, below |
///
/// Unset knobs come from the engine's [`Policy`].
///
/// # The signature
///
/// You write the function as it would run inside the transaction:
///
/// - one parameter `tx: &mut SqliteConnection` (or `&mut PgConnection`, or
///   `&mut DB::Connection` in a generic function): the claim's transaction,
///   where the body does its business writes;
/// - one parameter of type [`IdempotencyKey`]: the key;
/// - one parameter marked `#[fingerprint]`: the request, whose type implements
///   [`Fingerprint`](trait@Fingerprint);
/// - the parameters `scope` names; and any others you like.
///
/// The macro keeps every parameter in place except the transaction, which
/// becomes the engine, and wraps the return type:
///
/// ```text
/// // written
/// async fn charge(tx: &mut SqliteConnection, tenant_id: String, key: IdempotencyKey,
///                 #[fingerprint] req: ChargeRequest) -> Result<Payment, ChargeError>
/// // generated
/// async fn charge(engine: &Engine<Sqlite>, tenant_id: String, key: IdempotencyKey,
///                 req: ChargeRequest) -> Result<Answer<Result<Payment, ChargeError>>, IdemError>
/// ```
///
/// The outer `Result` is the protocol's answer ([`IdemError::Mismatch`],
/// [`IdemError::InProgress`], ...); [`Answer::value`] is your function's own
/// result, fresh or replayed, and [`Answer::via`] says which. The body
/// stays ordinary code: `?` and early `return` work as written. Your return
/// type must be `Result<T, E>` with `T: Serialize + DeserializeOwned` and
/// `E:` [`ErrorStatus`] (or an alias of one): successes and errors below 500
/// are stored and replayed; 5xx errors, panics, timeouts and dropped futures
/// roll back. A `T` that cannot be stored, an `E` without `ErrorStatus` or a
/// request without `Fingerprint` is a compile error pointing at that type and
/// saying what to derive or implement.
///
/// The expansion, roughly:
///
/// ```text
/// async fn charge(engine: &Engine<Sqlite>, tenant_id: String, key: IdempotencyKey, req: ChargeRequest)
///     -> Result<Answer<Result<Payment, ChargeError>>, IdemError>
/// {
///     inventory::submit! { StepUse::new("charge-card.v1", /* module path, file, line */) }
///     let op = Operation::with_fingerprint(scope(&[&tenant_id]), key.clone(), "charge-card.v1",
///                                          fingerprint("charge-card.v1", &req));
///     // claim; run the closure in the claim's transaction, within the timeout; store
///     // its outcome and commit (or roll back); or replay, or refuse
///     __private::run(engine, &op, <Payment as Stores<ChargeError>>::CODEC,
///                    async move |tx: &mut SqliteConnection| { /* your body */ }).await
/// }
/// ```
///
/// # axum mode (`http`)
///
/// With `http` the function is an axum 0.8 handler, used directly in a
/// `Router`: the transaction parameter becomes an [`Engines<DB>`](Engines)
/// extractor (from state, via `FromRef`), the key is extracted from the
/// `Idempotency-Key` header, the return type is anything `IntoResponse`, and
/// the wrapper returns `axum::response::Response`. The *rendered* response is
/// what is stored, so a replay is byte-identical to the first answer (plus
/// `Idempotent-Replayed: true`).
///
/// The same handler serves one engine or shards by tenant: once the
/// operation is built, its scope picks the engine ([`Engines::for_scope`]),
/// and the claim, the body's transaction and the replay run there.
///
/// ```text
/// // generated
/// async fn create_order(engines: Engines<Postgres>, Path(tenant): Path<String>,
///                       key: IdempotencyKey, Json(order): Json<NewOrder>) -> Response
///
/// Router::new().route("/{tenant}/orders", post(create_order)).with_state(engine)   // Engine<Postgres>
/// Router::new().route("/{tenant}/orders", post(create_order)).with_state(shards)   // Shards<Postgres, _>
/// Router::new().route("/{tenant}/orders", post(create_order)).with_state(app)      // Engines<Postgres>: FromRef<AppState>
/// ```
///
/// A state `S` serves the handler when `Engines<DB>: FromRef<S>`: the
/// engine, the shards, any state with `impl FromRef<S> for Engine<DB>`, or a
/// state holding shards with `impl FromRef<S> for Engines<DB>` (see
/// [`Engines`]). A router that cannot answer, or a tenant being moved
/// between shards, is a 503 with `Retry-After`, and nothing runs.
///
/// - The JSON body is taken as [`http::Json`], never `axum::Json`, which is
///   a compile error on its type: axum's own rejections are a plain-text 400,
///   or a 422 a client cannot tell from idem's reused-key 422, where
///   `http::Json` answers problem details before anything is claimed.
///   Refusing rather than converting keeps the handler's signature saying
///   what runs.
/// - The body extractor (`#[fingerprint] Json(req): Json<Req>`, `Form`,
///   `Bytes`, ...) is the last parameter, as axum requires; elsewhere it is a
///   compile error on that parameter.
/// - An error in the attribute is reported alone: the macro then emits a
///   stand-in with the handler's signature, so the `.route(..)` that takes
///   it still compiles.
///
/// # Example
///
/// See the [crate documentation](crate) for a complete service function.
pub use idem_macros::idempotent;

/// Compiles the README's examples as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Compiles the guide's examples as doctests.
#[doc = include_str!("../docs/GUIDE.md")]
#[cfg(doctest)]
pub struct GuideDoctests;
