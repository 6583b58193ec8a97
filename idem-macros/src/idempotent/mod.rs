//! `#[idempotent]`: parse the arguments (`attr`), read the function's
//! parameters (`params`), generate the wrapper (`expand`).

mod attr;
mod expand;
mod params;

use proc_macro2::TokenStream;
use quote::ToTokens;

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
    let parsed = syn::parse::Parser::parse2(
        |input: syn::parse::ParseStream<'_>| input.parse::<attr::Args>(),
        args,
    );
    let (args, mut errors) = match parsed {
        Ok(mut args) => {
            let errors = std::mem::take(&mut args.errors);
            (Some(args), errors)
        }
        Err(error) => (None, vec![error]),
    };
    let analysis = args
        .as_ref()
        .map(|args| params::analyse(args, &mut function, &mut errors));
    match (args, analysis) {
        (Some(args), Some(Some(analysis))) if errors.is_empty() => {
            expand::wrapper(&args, &function, analysis)
        }
        _ => {
            // Report everything, and keep the function as written (minus the
            // `#[fingerprint]` markers) so its own code is still checked and
            // no cascade of unrelated errors follows.
            params::strip_markers(&mut function);
            // The function is not wrapped, so its key and scope parameters look unused.
            function
                .attrs
                .push(syn::parse_quote!(#[allow(unused_variables)]));
            let mut out: TokenStream = errors.into_iter().map(|e| e.to_compile_error()).collect();
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
