//! Error accumulation: collect every problem, report them all at once.

use proc_macro2::TokenStream;

/// Collects `syn::Error`s so one expansion reports every problem it finds.
#[derive(Default)]
pub(crate) struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    /// Records an error spanned on `tokens`.
    pub(crate) fn push_spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub(crate) fn push_at(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.errors.push(syn::Error::new(span, message));
    }

    /// Records an already built error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// All errors as `compile_error!`s, or `None` when there were none.
    pub(crate) fn finish(self) -> Option<TokenStream> {
        if self.errors.is_empty() {
            None
        } else {
            Some(
                self.errors
                    .into_iter()
                    .map(|error| error.to_compile_error())
                    .collect(),
            )
        }
    }
}
