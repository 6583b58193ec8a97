//! The procedural macros of [idem](https://docs.rs/idem): `#[idempotent]`,
//! `#[derive(Fingerprint)]` and `steps!`.
//!
//! Use them through the `idem` crate, which re-exports them with their full
//! documentation and examples. This crate only parses, validates and emits
//! code; everything that runs lives in `idem-runtime`, reached by generated
//! code through `::idem::__private`.
//!
//! Layout: `idempotent/` (arguments in `attr.rs`, the function's parameters in
//! `params.rs`, the wrapper in `expand.rs`), `fingerprint/` (the derive:
//! attributes and validation in `attr.rs`, the encoding in `expand.rs`),
//! `steps.rs`, and `errors.rs` (error accumulation and the shared rules).

mod errors;
mod fingerprint;
mod idempotent;
mod rules;
mod steps;

#[cfg(test)]
mod snapshots;

use proc_macro::TokenStream;

/// Runs an `async fn` under an idempotency key: claim, business write, stored
/// outcome, commit; or replay.
///
/// See `idem::idempotent` for the signature transformation and examples.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::idempotent(args.into(), item.into()).into()
}

/// Derives `Fingerprint` with the canonical encoding: fields by name, `None`
/// left out, `#[fingerprint(skip)]` fields never counted.
///
/// See `idem::Fingerprint` for the attributes and examples.
#[proc_macro_derive(Fingerprint, attributes(fingerprint))]
pub fn derive_fingerprint(input: TokenStream) -> TokenStream {
    fingerprint::derive(input.into()).into()
}

/// Declares step constants (`pub const CHARGE_CARD = "charge-card.v1";`),
/// checks each name at compile time and registers it for `idem::registry`.
///
/// See `idem::steps` for examples.
#[proc_macro]
pub fn steps(input: TokenStream) -> TokenStream {
    steps::steps(input.into()).into()
}
