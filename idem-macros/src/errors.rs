//! Error accumulation: collect every problem, report them all at once.

use proc_macro2::TokenStream;

/// Collects `syn::Error`s so one expansion reports every problem it finds.
///
/// As serde's `Ctxt`: it must be ended with [`Errors::check`], and dropping
/// it unchecked panics, so no expansion can lose an error it recorded.
pub(crate) struct Errors {
    /// `None` once checked.
    errors: Option<Vec<syn::Error>>,
}

impl Errors {
    /// An accumulator with nothing recorded.
    pub(crate) fn new() -> Self {
        Self {
            errors: Some(Vec::new()),
        }
    }

    /// Records an error spanned on `tokens`.
    pub(crate) fn push_spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error at `span`.
    pub(crate) fn push_at(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Records an already built error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors
            .as_mut()
            .expect("errors recorded after the check")
            .push(error);
    }

    /// Whether nothing has been recorded so far.
    pub(crate) fn is_empty(&self) -> bool {
        self.errors.as_ref().is_none_or(Vec::is_empty)
    }

    /// Ends the accumulation: `Ok` when nothing was recorded, otherwise every
    /// error as a `compile_error!`.
    pub(crate) fn check(mut self) -> Result<(), TokenStream> {
        let errors = self.errors.take().unwrap_or_default();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.iter().map(syn::Error::to_compile_error).collect())
        }
    }
}

impl Drop for Errors {
    fn drop(&mut self) {
        if self.errors.is_some() && !std::thread::panicking() {
            panic!("idem-macros: errors were recorded but never checked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Errors;

    #[test]
    fn reports_every_error_recorded() {
        let mut errors = Errors::new();
        assert!(errors.is_empty());
        errors.push_at(proc_macro2::Span::call_site(), "first");
        errors.push_at(proc_macro2::Span::call_site(), "second");
        let reported = errors.check().unwrap_err().to_string();
        assert!(
            reported.contains("first") && reported.contains("second"),
            "{reported}"
        );
        assert!(Errors::new().check().is_ok());
    }

    #[test]
    #[should_panic(expected = "never checked")]
    fn dropping_unchecked_panics() {
        drop(Errors::new());
    }
}
