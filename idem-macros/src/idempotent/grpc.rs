//! `#[idempotent(grpc)]`: a method of a tonic service impl.
//!
//! The method is written with the parameters it needs, and the wrapper has
//! the trait's signature, `&self` and the `tonic::Request<M>`:
//!
//! ```text
//! async fn charge(&self, tenant: HeaderScope<XTenantId>, request: Request<ChargeRequest>, tx: &mut PgConnection)
//!     -> Result<Response<ChargeReply>, Status>
//! ```
//!
//! becomes `fn charge<'life0, 'async_trait>(&'life0 self, request: Request<ChargeRequest>)
//! -> Pin<Box<dyn Future<Output = Result<..>> + Send + 'async_trait>>`, the
//! form `#[async_trait]` gives the trait's method, so the impl matches with
//! or without `#[tonic::async_trait]` on it. Every parameter besides the
//! request and the transaction is read from the request's metadata and
//! extensions (`FromRequestMetadata`); the engine comes from the service
//! (`HasEngine`); the request message is fingerprinted; the body runs in the
//! claim's transaction and its answer is stored as the encoded reply.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, PathArguments, ReturnType, Type};

use super::attr::Args;
use super::expand::{database_of, pin_return, policy, registration, result_success, step_expr};
use super::params::{check_common, is_connection, is_key, peel, scope_bindings, type_span, Param};
use crate::errors::Errors;

/// What the wrapper needs to know about the method.
pub(crate) struct Analysis {
    /// `self`, as written.
    receiver: syn::Receiver,
    /// The `tonic::Request<M>` parameter.
    request: Param,
    /// `M`.
    message: Type,
    /// The transaction parameter.
    tx: Param,
    /// Every other parameter, read from the metadata, in order.
    extracted: Vec<Param>,
    /// Where the key comes from.
    key: Key,
    /// The bindings forming the scope, outermost first.
    scope: Vec<Ident>,
    /// `Result<Response<R>, Status>` as written.
    output: Type,
}

enum Key {
    /// The `idempotency-key` metadata entry, read for the wrapper only.
    Metadata,
    /// An `IdempotencyKey` parameter (read from the metadata, as the others).
    Param(Ident),
    /// `key = field`: the request message's field.
    Field(Ident),
}

/// Checks the method against the rules; `None` (with `errors` filled) when
/// it breaks any.
pub(crate) fn analyse(
    args: &Args,
    function: &syn::ItemFn,
    errors: &mut Errors,
) -> Option<Analysis> {
    let sig = &function.sig;
    check_common(args, sig, errors);
    let fn_name = sig.ident.to_string();
    let receiver = match sig.receiver() {
        Some(receiver)
            if receiver.reference.is_some()
                && receiver.mutability.is_none()
                && receiver.colon_token.is_none() =>
        {
            Some(receiver.clone())
        }
        Some(receiver) => {
            errors.push(syn::Error::new_spanned(
                receiver,
                "a tonic service method takes `&self`; write `&self`",
            ));
            None
        }
        None => {
            errors.push(syn::Error::new(
                sig.ident.span(),
                format!(
                    "`grpc` wraps a method of a tonic service impl, and `{fn_name}` has no `&self`; \
                     put it in the `impl` of the service trait (the service gives the engine through `idem::grpc::HasEngine`)"
                ),
            ));
            None
        }
    };
    if let Some(param) = sig
        .generics
        .params
        .iter()
        .find(|p| !matches!(p, syn::GenericParam::Lifetime(_)))
    {
        errors.push(syn::Error::new_spanned(
            param,
            "a tonic service method has no type parameters of its own; put them on the `impl` (e.g. `impl<DB: Backend> Payments for Service<DB>`)",
        ));
    }
    let output = match &sig.output {
        ReturnType::Type(_, ty) if is_grpc_result(ty) => Some((**ty).clone()),
        ReturnType::Type(_, ty) => {
            errors.push(syn::Error::new_spanned(
                ty,
                "a gRPC method returns `Result<tonic::Response<Reply>, tonic::Status>`, as the service trait declares it",
            ));
            None
        }
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.ident.span(),
                format!("`{fn_name}` returns nothing; a gRPC method returns `Result<tonic::Response<Reply>, tonic::Status>`"),
            ));
            None
        }
    };

    let mut params: Vec<Option<Param>> = Vec::new();
    let (mut request, mut tx, mut key_param) = (None, None, None);
    for (index, input) in sig.inputs.iter().enumerate() {
        let FnArg::Typed(typed) = input else {
            params.push(None);
            continue;
        };
        if let Some(marker) = typed
            .attrs
            .iter()
            .find(|attr| attr.path().is_ident("fingerprint"))
        {
            errors.push(syn::Error::new_spanned(
                marker,
                "a `grpc` method fingerprints its request message; remove `#[fingerprint]`",
            ));
        }
        let slot = if request_message(&typed.ty).is_some() {
            Some((
                &mut request,
                "a second `tonic::Request` parameter; a gRPC method receives one request",
            ))
        } else if is_connection(&typed.ty) {
            Some((&mut tx, "a second transaction parameter; the body gets exactly one connection, inside the claim's transaction"))
        } else if is_key(&typed.ty) {
            Some((
                &mut key_param,
                "a second `IdempotencyKey` parameter; the operation is keyed by exactly one",
            ))
        } else {
            None
        };
        if let Some((slot, twice)) = slot {
            match slot {
                None => *slot = Some(index),
                Some(_) => errors.push(syn::Error::new_spanned(&typed.ty, twice)),
            }
        }
        let (name, destructure) = match &*typed.pat {
            syn::Pat::Ident(ident) if ident.subpat.is_none() => (ident.ident.clone(), false),
            _ => (
                Ident::new(&format!("__idem_arg{index}"), Span::mixed_site()),
                true,
            ),
        };
        params.push(Some(Param {
            pat: (*typed.pat).clone(),
            ty: (*typed.ty).clone(),
            name,
            destructure,
        }));
    }
    if request.is_none() {
        errors.push(syn::Error::new(
            sig.ident.span(),
            format!("`{fn_name}` has no request parameter; add `request: tonic::Request<Message>`, as the service trait declares it"),
        ));
    }
    if tx.is_none() {
        errors.push(syn::Error::new(
            sig.ident.span(),
            format!(
                "`{fn_name}` has no transaction parameter; add `tx: &mut SqliteConnection` (or `&mut PgConnection`): \
                 the body does its business writes through it, in the claim's transaction"
            ),
        ));
    }
    let key = match (&args.key_field, key_param) {
        (Some(field), Some(index)) => {
            let param = params[index].as_ref().expect("typed");
            errors.push(syn::Error::new_spanned(
                &param.ty,
                format!("the key is the request's `{field}` field (`key = {field}`); remove this parameter, or `key = {field}` to read the `idempotency-key` metadata entry"),
            ));
            None
        }
        (Some(field), None) => Some(Key::Field(field.clone())),
        (None, Some(index)) => Some(Key::Param(
            params[index].as_ref().expect("typed").name.clone(),
        )),
        (None, None) => Some(Key::Metadata),
    };
    let scope = scope_bindings(args, &params, &fn_name, errors);
    if !errors.is_empty() {
        return None;
    }
    let (request, tx) = (request?, tx?);
    let mut extracted = Vec::new();
    let (mut request_param, mut tx_param) = (None, None);
    for (index, param) in params.into_iter().enumerate() {
        match param {
            Some(param) if index == request => request_param = Some(param),
            Some(param) if index == tx => tx_param = Some(param),
            Some(param) => extracted.push(param),
            None => {}
        }
    }
    let request = request_param?;
    Some(Analysis {
        receiver: receiver?,
        message: request_message(&request.ty)?.clone(),
        request,
        tx: tx_param?,
        extracted,
        key: key?,
        scope,
        output: output?,
    })
}

/// The wrapper: the trait's boxed signature, and a body that reads the
/// metadata, claims and runs the user's block in the claim's transaction.
pub(crate) fn wrapper(args: &Args, function: &syn::ItemFn, analysis: Analysis) -> TokenStream {
    let local = |name: &str| Ident::new(name, Span::mixed_site());
    let (engine, op, step, fingerprint, key, value) = (
        local("engine"),
        local("__idem_op"),
        local("__idem_step"),
        local("__idem_fingerprint"),
        local("__idem_key"),
        local("__idem_value"),
    );
    let Analysis {
        receiver,
        request,
        message,
        tx,
        extracted,
        key: key_source,
        scope,
        output,
    } = analysis;
    let grpc = quote!(::idem::__private::grpc);
    let tonic = quote!(#grpc::tonic);
    let request_name = &request.name;
    let signature = boxed_signature(function, &receiver, &request, &output);
    let step_expr = step_expr(args);
    let registration = registration(&step_expr, &function.sig.ident);
    let database = database_of(&tx.ty);
    let reads = extracted.iter().map(|param| {
        let (name, ty) = (&param.name, &param.ty);
        let read = quote_spanned! {type_span(ty)=>
            <#ty as #grpc::FromRequestMetadata>::from_request_metadata(
                #tonic::Request::metadata(&#request_name),
                #tonic::Request::extensions(&#request_name),
            )
        };
        quote! {
            let #name: #ty = match #read {
                ::core::result::Result::Ok(#value) => #value,
                ::core::result::Result::Err(#value) => return ::core::result::Result::Err(#value),
            };
        }
    });
    let key_expr = match &key_source {
        Key::Metadata => quote! {
            match <::idem::IdempotencyKey as #grpc::FromRequestMetadata>::from_request_metadata(
                #tonic::Request::metadata(&#request_name),
                #tonic::Request::extensions(&#request_name),
            ) {
                ::core::result::Result::Ok(#value) => #value,
                ::core::result::Result::Err(#value) => return ::core::result::Result::Err(#value),
            }
        },
        Key::Param(name) => quote!(::idem::__private::key(&#name)),
        Key::Field(field) => {
            let field_name = field.to_string();
            quote! {
                match #grpc::key_from_field(&#tonic::Request::get_ref(&#request_name).#field, #field_name) {
                    ::core::result::Result::Ok(#value) => #value,
                    ::core::result::Result::Err(#value) => return ::core::result::Result::Err(#value),
                }
            }
        }
    };
    let write = match args.fingerprint_encoding {
        Some(_) => quote_spanned!(type_span(&message)=> #grpc::fingerprint_encoding::<#message>),
        None => {
            quote_spanned!(type_span(&message)=> <#message as ::idem::__private::Fingerprint>::fingerprint)
        }
    };
    let fingerprint_call = quote! {
        ::idem::__private::fingerprint_with(#step, #tonic::Request::get_ref(&#request_name), #write)
    };
    let destructure = extracted.iter().filter(|p| p.destructure).map(|p| {
        let (pat, name) = (&p.pat, &p.name);
        quote!(let #pat = #name;)
    });
    let policy = policy(args, &quote!(#engine))
        .map(|policy| quote!(let #op = ::idem::__private::Operation::with_policy(#op, #policy);));
    let kept = args.headers.iter().flat_map(|(_, names)| names);
    let (also, never) = (&args.store.1, &args.never_store.1);
    let block = &function.block;
    let user_body = pin_return(block, &output);
    let tx_pat = &tx.pat;
    let tx_ty = connection_type(&tx.ty);
    let work = quote_spanned! {block.span()=>
        async move |#tx_pat: #tx_ty| {
            let #value: #output = async move #user_body.await;
            #grpc::into_outcome(
                #value,
                #grpc::KeptHeaders::also(&[#(#kept),*]),
                #grpc::StoredCodes::new(&[#(#also),*], &[#(#never),*]),
            )
        }
    };
    let self_token = receiver.self_token;
    quote! {
        #signature {
            #registration
            ::std::boxed::Box::pin(async move {
                let #step: &'static str = #step_expr;
                let #engine = <Self as #grpc::HasEngine<#database>>::engine(#self_token);
                #(#reads)*
                let #key = #key_expr;
                let #fingerprint = #fingerprint_call;
                #(#destructure)*
                let #op = ::idem::__private::Operation::with_fingerprint(
                    ::idem::__private::scope(&[#(&#scope),*]),
                    #key,
                    #step,
                    #fingerprint,
                );
                #policy
                ::idem::__private::Instrument::instrument(
                    async {
                        #grpc::respond(
                            ::idem::__private::run(#engine, &#op, ::idem::__private::Codec::outcome(), #work).await,
                        )
                    },
                    ::idem::__private::http::operation_span(&#op),
                )
                .await
            })
        }
    }
}

/// The signature of a tonic service trait's method as `#[async_trait]`
/// declares it: `&self` and the request, returning a boxed future.
fn boxed_signature(
    function: &syn::ItemFn,
    receiver: &syn::Receiver,
    request: &Param,
    output: &Type,
) -> TokenStream {
    let syn::ItemFn {
        attrs, vis, sig, ..
    } = function;
    let ident = &sig.ident;
    let self_token = &receiver.self_token;
    let (pat, ty) = (&request.pat, &request.ty);
    let pat = if request.destructure {
        request.name.to_token_stream()
    } else {
        pat.to_token_stream()
    };
    quote! {
        #(#attrs)*
        #vis fn #ident<'life0, 'async_trait>(&'life0 #self_token, #pat: #ty)
            -> ::core::pin::Pin<::std::boxed::Box<
                dyn ::core::future::Future<Output = #output> + ::core::marker::Send + 'async_trait
            >>
        where
            'life0: 'async_trait,
            Self: 'async_trait
    }
}

/// The error report and a stand-in with the trait's signature, so the impl
/// still matches its trait and the user sees the macro's errors alone; the
/// method as written when its request parameter cannot be told (the
/// compiler then names the parameter the trait expects).
pub(crate) fn stand_in(
    function: syn::ItemFn,
    as_written: syn::ItemFn,
    errors: TokenStream,
) -> TokenStream {
    let mut out = errors;
    let receiver = function.sig.receiver().cloned();
    let request = function.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) if request_message(&typed.ty).is_some() => Some(typed.clone()),
        _ => None,
    });
    // `Result<Reply, Status>` written for `Result<Response<Reply>, Status>`:
    // the stand-in has the trait's return type, so the mistake is reported once.
    let output = match &function.sig.output {
        ReturnType::Type(_, ty) if is_grpc_result(ty) => Some((**ty).clone()),
        ReturnType::Type(_, ty) => result_success(ty).map(|reply| {
            syn::parse_quote!(::core::result::Result<
                ::idem::__private::grpc::tonic::Response<#reply>,
                ::idem::__private::grpc::tonic::Status,
            >)
        }),
        ReturnType::Default => None,
    };
    match (receiver, request, output) {
        (Some(receiver), Some(request), Some(output)) => {
            let param = Param {
                pat: syn::parse_quote!(_),
                ty: (*request.ty).clone(),
                name: Ident::new("_request", Span::mixed_site()),
                destructure: true,
            };
            let signature = boxed_signature(&function, &receiver, &param, &output);
            // The parameters' types stay named, so their imports stay used.
            let types = function.sig.inputs.iter().filter_map(|input| match input {
                FnArg::Typed(typed) => Some(elided((*typed.ty).clone())),
                FnArg::Receiver(_) => None,
            });
            quote! {
                #[allow(unused_variables, clippy::all)]
                #signature {
                    let _ = ::core::marker::PhantomData::<(#(#types,)*)>;
                    ::std::boxed::Box::pin(async move {
                        ::core::unreachable!("`#[idempotent]` reported an error at compile time")
                    })
                }
            }
            .to_tokens(&mut out);
        }
        _ => as_written.to_tokens(&mut out),
    }
    out
}

/// `ty` with every lifetime elided (`'_`), to be named inside a body.
fn elided(mut ty: Type) -> Type {
    struct Elide;
    impl syn::visit_mut::VisitMut for Elide {
        fn visit_lifetime_mut(&mut self, lifetime: &mut syn::Lifetime) {
            *lifetime = syn::Lifetime::new("'_", lifetime.span());
        }
    }
    syn::visit_mut::VisitMut::visit_type_mut(&mut Elide, &mut ty);
    ty
}

/// `M` in `Request<M>` (`tonic::Request`, however it is imported).
fn request_message(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let segment = path.path.segments.last()?;
    if segment.ident != "Request" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(message) if args.args.len() == 1 => Some(message),
        _ => None,
    }
}

/// Whether a return type reads `Result<Response<_>, _>`.
fn is_grpc_result(ty: &Type) -> bool {
    let Some(Type::Path(success)) = result_success(ty).map(peel) else {
        return false;
    };
    success
        .path
        .segments
        .last()
        .is_some_and(|s| s.ident == "Response")
}

/// The transaction's type without the lifetime `#[async_trait]` gave it.
fn connection_type(ty: &Type) -> TokenStream {
    match peel(ty) {
        Type::Reference(reference) => {
            let elem = &reference.elem;
            quote!(&mut #elem)
        }
        other => other.to_token_stream(),
    }
}
