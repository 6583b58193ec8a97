//! `#[idempotent]`: parse the arguments (`attr`), read the function's
//! parameters (`params`), generate the wrapper (`expand`).

mod attr;
mod expand;
mod params;

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::errors::Errors;

/// The whole attribute: `args` are the tokens inside `#[idempotent(...)]`.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                item_keyword(&item),
                "`#[idempotent]` goes on an `async fn` (a free function, a method or an axum handler)",
            );
            let mut out = error.to_compile_error();
            out.extend(item);
            return out;
        }
    };
    let mut errors = Errors::new();
    let args = syn::parse::Parser::parse2(
        |input: syn::parse::ParseStream<'_>| attr::parse(input, &mut errors),
        args,
    )
    .map_err(|error| errors.push(error))
    .ok();
    let analysis = args
        .as_ref()
        .and_then(|args| params::analyse(args, &mut function, &mut errors));
    match (errors.check(), args, analysis) {
        (Ok(()), Some(args), Some(analysis)) => expand::wrapper(&args, &function, analysis),
        (reported, ..) => {
            // Report everything, and keep the function as written (minus the
            // `#[fingerprint]` markers) so its own code is still checked and
            // no cascade of unrelated errors follows.
            params::strip_markers(&mut function);
            // The function is not wrapped, so its key and scope parameters look unused.
            function
                .attrs
                .push(syn::parse_quote!(#[allow(unused_variables)]));
            let mut out = reported.err().unwrap_or_default();
            function.to_tokens(&mut out);
            out
        }
    }
}

/// The span of the keyword that says what the item is (`struct`, `impl`, ...),
/// past its attributes and visibility; the attribute itself if there is none.
fn item_keyword(item: &TokenStream) -> proc_macro2::Span {
    use proc_macro2::TokenTree;
    let mut tokens = item.clone().into_iter().peekable();
    while let Some(token) = tokens.next() {
        match token {
            // An outer attribute: `#` and its bracketed group.
            TokenTree::Punct(punct) if punct.as_char() == '#' => {
                tokens.next();
            }
            // `pub(crate)` and the like.
            TokenTree::Group(_) => {}
            TokenTree::Ident(ident) if ident == "pub" => {}
            other => return other.span(),
        }
    }
    proc_macro2::Span::call_site()
}
