//! Generating the wrapper around the annotated function.
//!
//! The signature keeps every parameter but one: the transaction parameter
//! (`tx: &mut SqliteConnection`) becomes the engine (`engine: &Engine<Sqlite>`,
//! or `engine: Engine<Sqlite>` as an axum extractor). The body is re-emitted as
//! written inside `async move`, spanned on the user's block, so errors in it
//! still point at the user's lines and `?`/`return` keep their meaning.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, PathArguments, ReturnType, Type};

use super::attr::{Args, StepArg};
use super::params::{peel, type_span, Analysis};

pub(crate) fn wrapper(args: &Args, function: &syn::ItemFn, analysis: Analysis) -> TokenStream {
    let syn::ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let fn_name = sig.ident.to_string();
    let engine = Ident::new("engine", Span::mixed_site());
    let guard = Ident::new("__idem_guard", Span::mixed_site());
    let op = Ident::new("__idem_op", Span::mixed_site());
    let step = Ident::new("__idem_step", Span::mixed_site());
    let value = Ident::new("__idem_value", Span::mixed_site());
    let result = Ident::new("__idem_result", Span::mixed_site());
    let fingerprint = Ident::new("__idem_fingerprint", Span::mixed_site());
    let key = Ident::new("__idem_key", Span::mixed_site());

    let tx = analysis.params[analysis.tx]
        .as_ref()
        .expect("the transaction is a typed parameter");
    let database = database_of(&tx.ty);
    let engine_ty = if args.http {
        quote!(::idem::Engine<#database>)
    } else {
        quote!(&::idem::Engine<#database>)
    };

    // The wrapper's parameters: the originals, the transaction swapped for the engine.
    let inputs = sig.inputs.iter().enumerate().map(|(index, input)| {
        match (input, &analysis.params[index]) {
            (FnArg::Typed(typed), Some(param)) if index == analysis.tx => {
                let attrs = &typed.attrs;
                let _ = param;
                quote!(#(#attrs)* #engine: #engine_ty)
            }
            (FnArg::Typed(typed), Some(param)) => {
                let attrs = &typed.attrs;
                let ty = &param.ty;
                if param.destructure {
                    let name = &param.name;
                    quote!(#(#attrs)* #name: #ty)
                } else {
                    let pat = &param.pat;
                    quote!(#(#attrs)* #pat: #ty)
                }
            }
            (receiver, _) => receiver.to_token_stream(),
        }
    });

    let user_ret: Type = match &sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    };
    let ret_span = type_span(&user_ret);
    let output = if args.http {
        quote!(::idem::__private::axum::response::Response)
    } else {
        quote!(::idem::__private::core::result::Result<::idem::Completed<#user_ret>, ::idem::IdemError>)
    };

    // The step: a checked literal, or a declared `Step` constant.
    let step_expr = match args.step.as_ref().expect("checked") {
        StepArg::Literal(literal) => literal.to_token_stream(),
        StepArg::Path(path) => quote_spanned!(path.span()=> ::idem::__private::step_name(#path)),
    };
    let registration = quote! {
        ::idem::__private::inventory::submit! {
            ::idem::__private::StepUse::new(
                #step_expr,
                ::idem::__private::Location {
                    item: ::idem::__private::core::concat!(::idem::__private::core::module_path!(), "::", #fn_name),
                    file: ::idem::__private::core::file!(),
                    line: ::idem::__private::core::line!(),
                },
            )
        }
    };

    // Compile-time checks, each spanned on the type it is about.
    let request = analysis.params[analysis.request]
        .as_ref()
        .expect("the request is a typed parameter");
    let request_name = &request.name;
    // Storability: when the return type is spelled `Result<T, E>`, completing
    // and replaying go through `<T as Stores<_>>`, both paths spanned on `T`,
    // so a `T` that cannot be stored gets one error, on `T`, naming the derive.
    let success = result_success(&user_ret).filter(|_| !args.http && !mentions_impl(&user_ret));
    // The request is fingerprinted through `<Request as Fingerprint>::fingerprint`,
    // spanned on the request type: a type without `Fingerprint` gets one
    // error, there, naming it and the derive.
    let fingerprint_call = if mentions_impl(&request.ty) {
        quote!(::idem::__private::fingerprint(#step, &#request_name))
    } else {
        let ty = &request.ty;
        quote_spanned! {type_span(ty)=>
            ::idem::__private::fingerprint_with(
                #step,
                &#request_name,
                <#ty as ::idem::__private::Fingerprint>::fingerprint,
            )
        }
    };
    let key_name = &analysis.params[analysis.key]
        .as_ref()
        .expect("the key is a typed parameter")
        .name;
    let destructure = analysis
        .params
        .iter()
        .flatten()
        .filter(|p| p.destructure)
        .map(|p| {
            let (pat, name) = (&p.pat, &p.name);
            quote!(let #pat = #name;)
        });
    let scope = &analysis.scope;

    let policy = args.overrides_policy().then(|| {
        let duration =
            |millis: u64| quote!(::idem::__private::core::time::Duration::from_millis(#millis));
        let mut sets = TokenStream::new();
        if let Some(retain) = &args.retain {
            let d = duration(retain.millis);
            sets.extend(quote!(policy.retention = #d;));
        }
        if let Some(lock_ttl) = &args.lock_ttl {
            let d = duration(lock_ttl.millis);
            sets.extend(quote!(policy.lock_ttl = #d;));
        }
        if let Some(wait) = &args.wait {
            let d = duration(wait.millis);
            sets.extend(quote!(policy.wait_timeout = #d;));
        }
        if let Some(timeout) = &args.timeout {
            let d = duration(timeout.millis);
            sets.extend(
                quote!(policy.work_timeout = ::idem::__private::core::option::Option::Some(#d);),
            );
        }
        if args.fail_open {
            sets.extend(quote!(policy.failure_mode = ::idem::__private::FailureMode::Open;));
        }
        if args.durable {
            sets.extend(quote!(policy.claim_mode = ::idem::__private::ClaimMode::Durable;));
        }
        let engine_ref = if args.http {
            quote!(&#engine)
        } else {
            quote!(#engine)
        };
        quote! {
            let #op = #op.policy({
                let mut policy = *::idem::Engine::policy(#engine_ref);
                #sets
                policy
            });
        }
    });

    let tx_pat = &tx.pat;
    let tx_ty = &tx.ty;
    let body = if mentions_impl(&user_ret) {
        quote_spanned!(block.span()=> async move #block)
    } else {
        // A fake return edge (as in `tracing`'s `#[instrument]`): the first
        // `return` of the async block has the declared type, so the block's
        // output is pinned before the body is checked; `?` and a mistyped
        // tail are then reported on the user's lines, not on the wrapper.
        let fake = Ident::new("__idem_fake_return", Span::mixed_site());
        quote_spanned! {block.span()=>
            async move {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::needless_return
                )]
                if false {
                    let #fake: #user_ret = loop {};
                    return #fake;
                }
                #block
            }
        }
    };
    let engine_ref = if args.http {
        quote!(&#engine)
    } else {
        quote!(#engine)
    };

    let (complete, replay) = if args.http {
        (
            quote! {
                let #value = ::idem::__private::axum::response::IntoResponse::into_response(#value);
                #guard.complete(::idem::__private::http::into_stored(#value).await).await
            },
            quote!(::idem::__private::replayed::<::idem::StoredResponse>(
                stored
            )),
        )
    } else if let Some(success) = success {
        // Every obligation on `T` must land on one span, or rustc reports it
        // once per span: the path, the call and the `.await` (which names the
        // trait again) are all spanned on `T`'s first token, and so is `T`
        // itself, re-spanned, so that `Vec<Receipt>` is one span too.
        let span = type_span(success);
        let success = respan(success, span);
        // `E` goes through `<E as CheckedError>::Checked`, spanned on `E`: an
        // `E` without `ErrorOutcome` gets an error there (and, as `Stores`
        // needs it too, a second one on `T`).
        let error = result_error(&user_ret).map_or_else(
            || quote!(_),
            |error| quote_spanned!(type_span(error)=> <#error as ::idem::__private::CheckedError>::Checked),
        );
        let stores = quote_spanned!(span=> <#success as ::idem::__private::Stores<#error>>);
        (
            quote_spanned!(span=> #stores::complete(#guard, #value).await),
            quote_spanned!(span=> #stores::replayed(stored)),
        )
    } else if !mentions_impl(&user_ret) {
        // Any other `Outcome` (an alias, a hand-written impl): through
        // `<O as Completes>`, on one span, as for `Stores` above.
        let outcome = respan(&user_ret, ret_span);
        let completes = quote_spanned!(ret_span=> <#outcome as ::idem::__private::Completes>);
        (
            quote_spanned!(ret_span=> #completes::complete(#guard, #value).await),
            quote_spanned!(ret_span=> #completes::replayed(stored)),
        )
    } else {
        (
            quote!(#guard.complete(#value).await),
            quote!(::idem::__private::replayed(stored)),
        )
    };
    let run = quote! {
        match ::idem::Engine::claim(#engine_ref, &#op).await {
            ::idem::__private::core::result::Result::Err(error) => ::idem::__private::core::result::Result::Err(error),
            ::idem::__private::core::result::Result::Ok(::idem::__private::Claim::Replay(stored)) => #replay,
            ::idem::__private::core::result::Result::Ok(::idem::__private::Claim::Execute(mut #guard)) => {
                let #value = {
                    let limit = #guard.work_timeout();
                    let #tx_pat: #tx_ty = #guard.connection();
                    ::idem::__private::within(limit, #body).await
                };
                match #value {
                    ::idem::__private::core::option::Option::Some(#value) => { #complete }
                    ::idem::__private::core::option::Option::None => ::idem::__private::timed_out(#guard).await,
                }
            }
        }
    };
    let finish = if args.http {
        // One `idem.request` span per request (scope, step, key tag), whose
        // outcome `respond` records.
        quote! {
            ::idem::__private::Instrument::instrument(
                async {
                    let #result = #run;
                    ::idem::__private::http::respond(#result)
                },
                ::idem::__private::http::operation_span(&#op),
            )
            .await
        }
    } else {
        run
    };

    let syn::Signature {
        constness,
        unsafety,
        abi,
        ident,
        generics,
        ..
    } = sig;
    let where_clause = &generics.where_clause;
    quote! {
        #(#attrs)*
        #vis #constness async #unsafety #abi fn #ident #generics(#(#inputs),*) -> #output #where_clause {
            #registration
            let #step: &'static str = #step_expr;
            let #fingerprint = #fingerprint_call;
            let #key = ::idem::__private::key(&#key_name);
            #(#destructure)*
            let #op = ::idem::__private::Operation::with_fingerprint(
                ::idem::__private::scope(&[#(&#scope),*]),
                #key,
                #step,
                #fingerprint,
            );
            #policy
            #finish
        }
    }
}

/// The database of the engine that replaces a `&mut <Connection>` parameter.
fn database_of(ty: &Type) -> TokenStream {
    let Type::Reference(reference) = peel(ty) else {
        unreachable!("checked: a `&mut` connection")
    };
    if let Type::Path(path) = peel(&reference.elem) {
        // `DB::Connection` or `<DB as Database>::Connection`: the engine is `Engine<DB>`.
        if path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Connection")
        {
            if let Some(qself) = &path.qself {
                return qself.ty.to_token_stream();
            }
            if path.path.segments.len() == 2 && path.path.leading_colon.is_none() {
                return path.path.segments[0].to_token_stream();
            }
        }
    }
    let connection = &reference.elem;
    // The two backends by name, so the documented signature reads `Engine<Sqlite>`.
    if let Type::Path(path) = peel(connection) {
        match path
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .as_deref()
        {
            Some("SqliteConnection") => {
                return quote_spanned!(connection.span()=> ::idem::__private::sqlx::Sqlite)
            }
            Some("PgConnection") => {
                return quote_spanned!(connection.span()=> ::idem::__private::sqlx::Postgres)
            }
            _ => {}
        }
    }
    quote_spanned!(connection.span()=> <#connection as ::idem::__private::ClaimConnection>::Database)
}

/// A type's tokens, all spanned on `span` (except `$crate`, which resolves by
/// its span), so that the type as a whole covers exactly `span`.
fn respan(ty: &Type, span: Span) -> TokenStream {
    fn walk(tokens: TokenStream, span: Span) -> TokenStream {
        tokens
            .into_iter()
            .map(|token| match token {
                proc_macro2::TokenTree::Group(group) => {
                    let mut new =
                        proc_macro2::Group::new(group.delimiter(), walk(group.stream(), span));
                    new.set_span(span);
                    proc_macro2::TokenTree::Group(new)
                }
                proc_macro2::TokenTree::Ident(ident) if ident == "$crate" => {
                    proc_macro2::TokenTree::Ident(ident)
                }
                mut other => {
                    other.set_span(span);
                    other
                }
            })
            .collect()
    }
    walk(ty.to_token_stream(), span)
}

/// `T` in `Result<T, E>`, when the return type is spelled that way.
fn result_success(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(success) => Some(success),
        _ => None,
    }
}

/// `E` in `Result<T, E>`, when the return type is spelled that way (not an
/// alias such as `Result<T>`).
fn result_error(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let PathArguments::AngleBracketed(args) = &path.path.segments.last()?.arguments else {
        return None;
    };
    match args.args.iter().nth(1)? {
        GenericArgument::Type(error) if args.args.len() == 2 => Some(error),
        _ => None,
    }
}

/// Whether a type contains `impl Trait`, which cannot be named in a turbofish.
fn mentions_impl(ty: &Type) -> bool {
    ty.to_token_stream()
        .into_iter()
        .any(|token| matches!(token, proc_macro2::TokenTree::Ident(ident) if ident == "impl"))
}
