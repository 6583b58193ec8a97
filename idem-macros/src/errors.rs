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

/// Checks a step name has the form `name.vN`; on failure, says how to fix it.
/// The same rule as `idem_runtime::check_step_name`, evaluated here so the
/// error can point at the literal.
pub(crate) fn check_step_name(name: &str) -> Result<(), &'static str> {
    let Some((base, version)) = name.rsplit_once(".v") else {
        return Err("has no version; step names have the form `name.vN`, e.g. `charge-card.v1`");
    };
    if version.is_empty()
        || version.starts_with('0')
        || !version.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(
            "needs a version after `.v` counting from 1, without leading zeros (`.v1`, `.v2`, ...), e.g. `charge-card.v2`",
        );
    }
    let starts_lower = base.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if !starts_lower
        || !base
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("must start with a lowercase letter and hold only lowercase letters, digits and dashes before `.vN`, e.g. `charge-card.v1`");
    }
    Ok(())
}

/// Parses `"24h"`, `"30s"`, `"500ms"`, `"15m"`, `"7d"` into milliseconds.
pub(crate) fn parse_millis(text: &str) -> Option<u64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let value: u64 = number.parse().ok()?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    value.checked_mul(unit_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_match_the_runtime_rule() {
        for ok in ["charge-card.v1", "a.v1", "x9.v12"] {
            assert!(check_step_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "charge",
            "charge.v",
            "charge.v0",
            "charge.v1a",
            "Charge.v1",
            "charge_card.v1",
            ".v1",
            "1a.v1",
        ] {
            assert!(check_step_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_millis("24h"), Some(86_400_000));
        assert_eq!(parse_millis("500ms"), Some(500));
        assert_eq!(parse_millis("soon"), None);
        assert_eq!(parse_millis("5"), None);
    }
}
