//! What `#[idempotent]` emits when it reports an error: the error, and a
//! stand-in with the wrapper's signature, so the rest of the crate (a
//! `.route(..)` taking the handler, a call passing the engine) still
//! type-checks and the user sees the macro's error alone, not a cascade of
//! axum `Handler` errors. As thiserror's `fallback.rs` does for its derive.
//!
//! The user's function is kept as written inside the stand-in, so errors in
//! its own code are still reported; when it is a method, or names `Self`
//! (which an item nested in a function cannot), it is emitted as written
//! instead of a stand-in.

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::{FnArg, ReturnType};

use super::expand::database_of;
use super::params::{body_extractor, is_connection, strip_markers};

/// The stand-in for `function` (`http`: an axum handler returning
/// `Response`), after `errors`.
pub(crate) fn stand_in(http: bool, mut function: syn::ItemFn, errors: TokenStream) -> TokenStream {
    strip_markers(&mut function);
    // Not wrapped, so the key and scope parameters look unused.
    function
        .attrs
        .push(syn::parse_quote!(#[allow(unused_variables)]));
    let mut out = errors;
    let has_receiver = function
        .sig
        .inputs
        .iter()
        .any(|input| matches!(input, FnArg::Receiver(_)));
    if has_receiver || names_self(function.to_token_stream()) {
        function.to_tokens(&mut out);
        return out;
    }

    let syn::ItemFn {
        attrs, vis, sig, ..
    } = &function;
    // A handler's body extractor goes last in the stand-in, as axum requires,
    // whatever order the reported function has.
    let mut ordered: Vec<&FnArg> = sig.inputs.iter().collect();
    if http {
        ordered.sort_by_key(
            |input| matches!(input, FnArg::Typed(typed) if body_extractor(&typed.ty).is_some()),
        );
    }
    let inputs = ordered.into_iter().map(|input| match input {
        FnArg::Typed(typed) if is_connection(&typed.ty) => {
            let database = database_of(&typed.ty);
            if http {
                quote!(_: ::idem::Engines<#database>)
            } else {
                quote!(_: &::idem::Engine<#database>)
            }
        }
        FnArg::Typed(typed) => {
            let ty = &typed.ty;
            quote!(_: #ty)
        }
        FnArg::Receiver(receiver) => receiver.to_token_stream(),
    });
    let output = if http {
        quote!(::idem::__private::axum::response::Response)
    } else {
        let user_ret = match &sig.output {
            ReturnType::Default => quote!(()),
            ReturnType::Type(_, ty) => ty.to_token_stream(),
        };
        quote!(::core::result::Result<::idem::Answer<#user_ret>, ::idem::IdemError>)
    };
    let (ident, generics) = (&sig.ident, &sig.generics);
    let where_clause = &generics.where_clause;
    // Only the outer attributes that describe the item (docs, cfg, allow).
    let attrs = attrs.iter().filter(|attr| {
        ["doc", "cfg", "allow", "expect", "deprecated"]
            .iter()
            .any(|name| attr.path().is_ident(name))
    });
    let mut nested = function.clone();
    nested.vis = syn::Visibility::Inherited;
    nested.attrs.push(syn::parse_quote!(#[allow(dead_code)]));
    quote! {
        #(#attrs)*
        #[allow(unused_variables, clippy::all)]
        #vis async fn #ident #generics(#(#inputs),*) -> #output #where_clause {
            #nested
            ::core::unreachable!("`#[idempotent]` reported an error at compile time")
        }
    }
    .to_tokens(&mut out);
    out
}

/// Whether the tokens mention `Self`.
fn names_self(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "Self",
        TokenTree::Group(group) => names_self(group.stream()),
        _ => false,
    })
}
