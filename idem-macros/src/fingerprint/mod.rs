//! `#[derive(Fingerprint)]`: read the input and its attributes (`attr`),
//! validate, and emit the canonical encoding (`expand`).

mod attr;
mod expand;

use proc_macro2::TokenStream;

use crate::errors::Errors;

/// The whole derive.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: syn::DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    let mut errors = Errors::new();
    let shape = attr::read(&input, &mut errors);
    match errors.check() {
        Ok(()) => expand::implementation(&input, &shape),
        Err(mut reported) => {
            // One set of errors, plus a stub impl so uses of the type do not
            // add a cascade of "does not implement Fingerprint".
            reported.extend(expand::fallback(&input));
            reported
        }
    }
}
