//! `#[idempotent]`: parse the arguments (`attr`), read the function's
//! parameters (`params`), generate the wrapper (`expand`); a tonic service
//! method (`grpc`) is read and wrapped by `grpc`, after `async_trait` undoes
//! the rewriting `#[tonic::async_trait]` did first.

mod async_trait;
mod attr;
mod expand;
mod fallback;
mod grpc;
mod params;

use proc_macro2::TokenStream;

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
    let raw_args = args.clone();
    let args = syn::parse::Parser::parse2(
        |input: syn::parse::ParseStream<'_>| attr::parse(input, &mut errors),
        args,
    )
    .map_err(|error| errors.push(error))
    .ok();
    if args.as_ref().is_some_and(|args| args.grpc.is_some())
        || names_mode(&raw_args, "grpc") && args.is_none()
    {
        let as_written = function.clone();
        async_trait::unbox(&mut function);
        let analysis = args
            .as_ref()
            .and_then(|args| grpc::analyse(args, &function, &mut errors));
        return match (errors.check(), args, analysis) {
            (Ok(()), Some(args), Some(analysis)) => grpc::wrapper(&args, &function, analysis),
            (reported, _, _) => {
                grpc::stand_in(function, as_written, reported.err().unwrap_or_default())
            }
        };
    }
    let analysis = args
        .as_ref()
        .and_then(|args| params::analyse(args, &mut function, &mut errors));
    match (errors.check(), args, analysis) {
        (Ok(()), Some(args), Some(analysis)) => expand::wrapper(&args, &function, analysis),
        (reported, args, _) => {
            // Report everything, plus a stand-in with the wrapper's signature.
            let http = args.map_or_else(|| names_mode(&raw_args, "http"), |args| args.http);
            fallback::stand_in(http, function, reported.err().unwrap_or_default())
        }
    }
}

/// Whether unparsable arguments still name the `mode` (`http`, `grpc`).
fn names_mode(args: &TokenStream, mode: &str) -> bool {
    args.clone()
        .into_iter()
        .any(|token| matches!(token, proc_macro2::TokenTree::Ident(ident) if ident == mode))
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
