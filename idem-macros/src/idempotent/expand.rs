//! Generating the wrapper around the annotated function.
//!
//! The signature keeps every parameter but one: the transaction parameter
//! (`tx: &mut SqliteConnection`) becomes the engine (`engine: &Engine<Sqlite>`,
//! or, as an axum extractor, `engines: Engines<Sqlite>`, the one engine or the
//! shards, from which the operation's scope picks the engine). The body is
//! re-emitted as written as an async closure over the transaction, spanned on
//! the user's block, so errors in it still point at the user's lines and
//! `?`/`return` keep their meaning; `__private::run` does the rest, as
//! `Engine::run` does.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, PathArguments, ReturnType, Type};

use super::attr::{Args, StepArg};
use super::params::{peel, type_span, Analysis};

/// The wrapper's own names, at mixed-site hygiene: the user's code can
/// neither see nor shadow them.
struct Locals {
    engine: Ident,
    engines: Ident,
    span: Ident,
    op: Ident,
    step: Ident,
    value: Ident,
    fingerprint: Ident,
    key: Ident,
}

impl Locals {
    fn new() -> Self {
        let local = |name: &str| Ident::new(name, Span::mixed_site());
        Self {
            engine: local("engine"),
            engines: local("engines"),
            span: local("__idem_span"),
            op: local("__idem_op"),
            step: local("__idem_step"),
            value: local("__idem_value"),
            fingerprint: local("__idem_fingerprint"),
            key: local("__idem_key"),
        }
    }
}

/// The whole wrapper: the signature, the step's registration, the
/// operation (with its policy) and the body that runs it.
pub(crate) fn wrapper(args: &Args, function: &syn::ItemFn, analysis: Analysis) -> TokenStream {
    let locals = Locals::new();
    let user_ret: Type = match &function.sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    };
    let signature = signature(args, function, &analysis, &locals, &user_ret);
    let step_expr = step_expr(args);
    let registration = registration(&step_expr, &function.sig.ident);
    let operation = operation(&analysis, &locals);
    let engine = &locals.engine;
    let op = &locals.op;
    let policy = policy(args, &quote!(#engine))
        .map(|policy| quote!(let #op = ::idem::__private::Operation::with_policy(#op, #policy);));
    let body = body(args, function, &analysis, &locals, &user_ret, policy);
    let step = &locals.step;
    let json_checks = if args.http {
        json_checks(&analysis)
    } else {
        TokenStream::new()
    };
    quote! {
        #signature {
            #json_checks
            #registration
            let #step: &'static str = #step_expr;
            #operation
            #body
        }
    }
}

/// The wrapper's signature: the function's own, the transaction parameter
/// swapped for the engine and the return type for the engine's answer.
fn signature(
    args: &Args,
    function: &syn::ItemFn,
    analysis: &Analysis,
    locals: &Locals,
    user_ret: &Type,
) -> TokenStream {
    let syn::ItemFn {
        attrs, vis, sig, ..
    } = function;
    let tx = analysis.params[analysis.tx]
        .as_ref()
        .expect("the transaction is a typed parameter");
    let database = database_of(&tx.ty);
    let engine = if args.http {
        let engines = &locals.engines;
        quote!(#engines: ::idem::Engines<#database>)
    } else {
        let engine = &locals.engine;
        quote!(#engine: &::idem::Engine<#database>)
    };
    let inputs = sig.inputs.iter().enumerate().map(|(index, input)| {
        match (input, &analysis.params[index]) {
            (FnArg::Typed(typed), Some(_)) if index == analysis.tx => {
                let attrs = &typed.attrs;
                quote!(#(#attrs)* #engine)
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
    let output = if args.http {
        quote!(::idem::__private::axum::response::Response)
    } else {
        quote!(::core::result::Result<::idem::Answer<#user_ret>, ::idem::IdemError>)
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
        #vis #constness async #unsafety #abi fn #ident #generics(#(#inputs),*) -> #output #where_clause
    }
}

/// In a handler, every parameter spelled `Json<..>` must be idem's `Json`,
/// whose rejections are problem details: `axum::Json` is refused with one
/// error on its type, naming the fix.
fn json_checks(analysis: &Analysis) -> TokenStream {
    analysis
        .params
        .iter()
        .flatten()
        .filter(|param| match peel(&param.ty) {
            Type::Path(path) => path.path.segments.last().is_some_and(|s| s.ident == "Json"),
            _ => false,
        })
        .map(|param| {
            let ty = &param.ty;
            quote_spanned!(type_span(ty)=> ::idem::__private::http::idem_json::<#ty>();)
        })
        .collect()
}

/// The step: a checked literal, or a declared `Step` constant.
pub(crate) fn step_expr(args: &Args) -> TokenStream {
    match args.step.as_ref().expect("checked") {
        StepArg::Literal(literal) => literal.to_token_stream(),
        StepArg::Path(path) => quote_spanned!(path.span()=> ::idem::__private::step_name(#path)),
    }
}

/// Registers the step's use by this function, for `idem::registry`.
pub(crate) fn registration(step: &TokenStream, function: &Ident) -> TokenStream {
    let function = function.to_string();
    quote! {
        ::idem::__private::inventory::submit! {
            ::idem::__private::StepUse::new(
                #step,
                ::idem::__private::Location {
                    item: ::idem::__private::core::concat!(::idem::__private::core::module_path!(), "::", #function),
                    file: ::idem::__private::core::file!(),
                    line: ::idem::__private::core::line!(),
                },
            )
        }
    }
}

/// The operation: the request's fingerprint, the key and the scope; and the
/// destructuring patterns, re-bound for the body.
fn operation(analysis: &Analysis, locals: &Locals) -> TokenStream {
    let Locals {
        op,
        step,
        fingerprint,
        key,
        ..
    } = locals;
    let request = analysis.params[analysis.request]
        .as_ref()
        .expect("the request is a typed parameter");
    let request_name = &request.name;
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
    quote! {
        let #fingerprint = #fingerprint_call;
        let #key = ::idem::__private::key(&#key_name);
        #(#destructure)*
        let #op = ::idem::__private::Operation::with_fingerprint(
            ::idem::__private::scope(&[#(&#scope),*]),
            #key,
            #step,
            #fingerprint,
        );
    }
}

/// The call that runs the operation (with `policy`, the attribute's
/// overrides, if it has any): `__private::run` with the user's block as an
/// async closure over the transaction, and how its outcome is kept. A
/// handler first picks the engine of the operation's scope.
fn body(
    args: &Args,
    function: &syn::ItemFn,
    analysis: &Analysis,
    locals: &Locals,
    user_ret: &Type,
    policy: Option<TokenStream>,
) -> TokenStream {
    let block = &function.block;
    let Locals {
        engine,
        engines,
        op,
        value,
        span,
        ..
    } = locals;
    let tx = analysis.params[analysis.tx]
        .as_ref()
        .expect("the transaction is a typed parameter");
    let (tx_pat, tx_ty) = (&tx.pat, &tx.ty);
    let user_body = pin_return(block, user_ret);
    // The work, spanned on the user's block.
    let work = if args.http {
        // The rendered response is what is stored; the user's block keeps its
        // own `return`s, inside an async block of its own.
        let kept = args.headers.iter().flat_map(|(_, names)| names);
        let kept = quote!(::idem::__private::http::KeptHeaders::also(&[#(#kept),*]));
        let (also, never) = (&args.store.1, &args.never_store.1);
        let statuses = quote!(::idem::StoredStatuses::new(&[#(#also),*], &[#(#never),*]));
        quote_spanned! {block.span()=>
            async move |#tx_pat: #tx_ty| {
                let #value = ::idem::__private::axum::response::IntoResponse::into_response(
                    async move #user_body.await,
                );
                ::idem::__private::http::into_outcome(#value, #kept, #statuses).await
            }
        }
    } else {
        quote_spanned!(block.span()=> async move |#tx_pat: #tx_ty| #user_body)
    };
    let codec = codec(args, user_ret);
    let run = quote!(::idem::__private::run(#engine, &#op, #codec, #work).await);
    if args.http {
        // One `idem.request` span per request (scope, step, key tag), whose
        // outcome `respond` records, the engine's pick included.
        quote! {
            let #span = ::idem::__private::http::operation_span(&#op);
            ::idem::__private::Instrument::instrument(
                async move {
                    let #engine = match ::idem::Engines::for_scope(
                        &#engines,
                        ::idem::__private::Operation::scope(&#op),
                    )
                    .await
                    {
                        ::core::result::Result::Ok(#value) => #value,
                        ::core::result::Result::Err(#value) => {
                            return ::idem::__private::http::respond(::core::result::Result::Err(#value));
                        }
                    };
                    #policy
                    ::idem::__private::http::respond(#run)
                },
                #span,
            )
            .await
        }
    } else {
        quote!(#policy #run)
    }
}

/// The user's block, its output pinned to `user_ret` by a fake return edge
/// (as in `tracing`'s `#[instrument]`): the first `return` has the declared
/// type, so the output is known before the body is checked; `?` and a
/// mistyped tail are then reported on the user's lines, not on the wrapper.
pub(crate) fn pin_return(block: &syn::Block, user_ret: &Type) -> TokenStream {
    if mentions_impl(user_ret) {
        return block.to_token_stream();
    }
    let fake = Ident::new("__idem_fake_return", Span::mixed_site());
    quote_spanned! {block.span()=>
        {
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
}

/// How the outcome is kept and replayed, named on the user's types so that
/// one that cannot be stored is reported there.
fn codec(args: &Args, user_ret: &Type) -> TokenStream {
    if args.http || mentions_impl(user_ret) {
        return quote!(::idem::__private::Codec::outcome());
    }
    if let Some(success) = result_success(user_ret) {
        // `Result<T, E>`: through `<T as Stores<_>>`. Every obligation on `T`
        // must land on one span, or rustc reports it once per span: the path
        // is spanned on `T`'s first token, and so is `T` itself, re-spanned,
        // so that `Vec<Receipt>` is one span too.
        let span = type_span(success);
        let success = respan(success, span);
        // `E` goes through `<E as CheckedError>::Checked`, spanned on `E`: an
        // `E` without `ErrorStatus` gets its one error there.
        let error = result_error(user_ret).map_or_else(
            || quote!(_),
            |error| quote_spanned!(type_span(error)=> <#error as ::idem::__private::CheckedError>::Checked),
        );
        quote_spanned!(span=> <#success as ::idem::__private::Stores<#error>>::CODEC)
    } else {
        // Any other `Outcome` (an alias, a hand-written impl): through
        // `<O as Completes>`, on one span, as for `Stores` above.
        let span = type_span(user_ret);
        let outcome = respan(user_ret, span);
        quote_spanned!(span=> <#outcome as ::idem::__private::Completes>::CODEC)
    }
}

/// The engine's policy with the attribute's overrides, if it has any.
pub(crate) fn policy(args: &Args, engine: &TokenStream) -> Option<TokenStream> {
    if !args.overrides_policy() {
        return None;
    }
    let duration =
        |millis: u64| quote!(::idem::__private::core::time::Duration::from_millis(#millis));
    let mut policy = quote!(::idem::__private::policy(#engine));
    if let Some(retain) = &args.retain {
        let d = duration(retain.millis);
        policy = quote!(#policy.with_retention(#d));
    }
    if let Some(lock_ttl) = &args.lock_ttl {
        let d = duration(lock_ttl.millis);
        policy = quote!(#policy.with_lock_ttl(#d));
    }
    if let Some(wait) = &args.wait {
        let d = duration(wait.millis);
        policy = quote!(#policy.with_wait_timeout(#d));
    }
    if let Some(timeout) = &args.timeout {
        let d = duration(timeout.millis);
        policy = quote!(#policy.with_work_timeout(#d));
    }
    if args.fail_open {
        policy = quote!(#policy.with_failure_mode(::idem::__private::FailureMode::Open));
    }
    if args.durable {
        policy = quote!(#policy.with_claim_mode(::idem::__private::ClaimMode::Durable));
    }
    if args.solo {
        policy = quote!(#policy.with_group_commit(::core::option::Option::None));
    }
    Some(policy)
}

/// The database of the engine that replaces a `&mut <Connection>` parameter.
pub(crate) fn database_of(ty: &Type) -> TokenStream {
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
                return quote_spanned!(connection.span()=> ::idem::sqlx::Sqlite)
            }
            Some("PgConnection") => {
                return quote_spanned!(connection.span()=> ::idem::sqlx::Postgres)
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
pub(crate) fn result_success(ty: &Type) -> Option<&Type> {
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
