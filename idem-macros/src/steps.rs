//! `steps! { pub const CHARGE_CARD = "charge-card.v1"; }`: declared, checked,
//! registered step constants.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, LitStr, Token, Visibility};

use crate::errors::Errors;
use crate::rules::check_step_name;

struct Declaration {
    attrs: Vec<Attribute>,
    retired: bool,
    vis: Visibility,
    name: Ident,
    value: LitStr,
}

struct Declarations(Vec<Declaration>);

impl Parse for Declarations {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let mut attrs = input.call(Attribute::parse_outer)?;
            let mut retired = false;
            let mut problem = None;
            attrs.retain(|attr| {
                if attr.path().is_ident("retired") {
                    if !matches!(attr.meta, syn::Meta::Path(_)) {
                        problem = Some(syn::Error::new_spanned(
                            attr,
                            "write `#[retired]` without arguments",
                        ));
                    }
                    retired = true;
                    false
                } else {
                    true
                }
            });
            if let Some(problem) = problem {
                return Err(problem);
            }
            let vis: Visibility = input.parse()?;
            input.parse::<Token![const]>().map_err(|e| {
                syn::Error::new(e.span(), "expected `const NAME = \"name.vN\";`, e.g. `pub const CHARGE_CARD = \"charge-card.v1\";`")
            })?;
            let name: Ident = input.parse()?;
            if input.peek(Token![:]) {
                return Err(input.error("leave out the type: `steps!` constants are always `idem::Step`; write `const NAME = \"name.vN\";`"));
            }
            input.parse::<Token![=]>()?;
            let value: LitStr = input.parse()?;
            input.parse::<Token![;]>()?;
            out.push(Declaration {
                attrs,
                retired,
                vis,
                name,
                value,
            });
        }
        Ok(Declarations(out))
    }
}

pub(crate) fn steps(input: TokenStream) -> TokenStream {
    let Declarations(declarations) = match syn::parse2(input) {
        Ok(declarations) => declarations,
        Err(error) => return error.to_compile_error(),
    };
    let mut errors = Errors::new();
    let mut seen: Vec<String> = Vec::new();
    for declaration in &declarations {
        let value = declaration.value.value();
        if let Err(why) = check_step_name(&value) {
            errors.push_spanned(&declaration.value, format!("step name `{value}` {why}"));
        }
        if seen.contains(&value) {
            errors.push_spanned(
                &declaration.value,
                format!("step `{value}` is declared twice in this block; declare each step once"),
            );
        }
        seen.push(value);
    }
    if let Err(reported) = errors.check() {
        return reported;
    }
    declarations
        .iter()
        .map(|Declaration { attrs, retired, vis, name, value }| {
            let item = name.to_string();
            let line = quote::quote_spanned!(name.span()=> ::idem::__private::core::line!());
            quote! {
                #(#attrs)*
                #vis const #name: ::idem::Step = ::idem::Step::new(#value);
                ::idem::__private::inventory::submit! {
                    ::idem::__private::StepDeclaration::new(
                        #value,
                        #retired,
                        ::idem::__private::Location {
                            item: ::idem::__private::core::concat!(::idem::__private::core::module_path!(), "::", #item),
                            file: ::idem::__private::core::file!(),
                            line: #line,
                        },
                    )
                }
            }
        })
        .collect()
}
