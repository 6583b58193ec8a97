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

/// The attribute's implementation lives in the `idem-macros` crate; the code
/// it generates reaches the runtime only through `idem`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::idempotent(args.into(), item.into()).into()
}

/// The derive's implementation lives in the `idem-macros` crate; the code it
/// generates reaches the runtime only through `idem`.
#[proc_macro_derive(Fingerprint, attributes(fingerprint))]
pub fn derive_fingerprint(input: TokenStream) -> TokenStream {
    fingerprint::derive(input.into()).into()
}

/// The macro's implementation lives in the `idem-macros` crate; the code it
/// generates reaches the runtime only through `idem`.
#[proc_macro]
pub fn steps(input: TokenStream) -> TokenStream {
    steps::steps(input.into()).into()
}
