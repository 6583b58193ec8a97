//! Reading the annotated function: which parameter is the transaction, the
//! key, the fingerprinted request, and which bindings form the scope.

use proc_macro2::{Ident, Span};
use syn::spanned::Spanned;
use syn::{FnArg, Pat, Type};

use super::attr::{missing, Args};
use crate::errors::Errors;

/// One typed parameter of the original function.
pub(crate) struct Param {
    /// The pattern as written (`amount`, `mut n`, `Json(req)`).
    pub(crate) pat: Pat,
    /// The declared type.
    pub(crate) ty: Type,
    /// The name the wrapper gives the parameter: the user's identifier, or a
    /// generated one when the pattern destructures (it is destructured inside).
    pub(crate) name: Ident,
    /// Whether the wrapper re-binds `pat` from `name` (non-identifier patterns).
    pub(crate) destructure: bool,
}

/// What the wrapper needs to know about the function.
pub(crate) struct Analysis {
    /// The typed parameters, in order; `None` where the receiver sits.
    pub(crate) params: Vec<Option<Param>>,
    /// Index of the transaction parameter (`tx: &mut SqliteConnection`).
    pub(crate) tx: usize,
    /// Index of the key parameter (`key: IdempotencyKey`).
    pub(crate) key: usize,
    /// Index of the `#[fingerprint]` request parameter.
    pub(crate) request: usize,
    /// The bindings forming the scope, outermost first.
    pub(crate) scope: Vec<Ident>,
}

/// Removes the `#[fingerprint]` markers from the parameters.
pub(crate) fn strip_markers(function: &mut syn::ItemFn) {
    for input in &mut function.sig.inputs {
        if let FnArg::Typed(typed) = input {
            typed
                .attrs
                .retain(|attr| !attr.path().is_ident("fingerprint"));
        }
    }
}

/// Checks the function against the rules; `None` (with `errors` filled) when
/// it breaks any.
pub(crate) fn analyse(
    args: &Args,
    function: &mut syn::ItemFn,
    errors: &mut Errors,
) -> Option<Analysis> {
    check_common(args, &function.sig, errors);
    let fn_name = function.sig.ident.to_string();

    let mut params = Vec::new();
    let (mut tx, mut key, mut request) = (None, None, None);
    for (index, input) in function.sig.inputs.iter_mut().enumerate() {
        let FnArg::Typed(typed) = input else {
            params.push(None);
            continue;
        };
        let mut marked = None;
        typed.attrs.retain(|attr| {
            if attr.path().is_ident("fingerprint") {
                marked = Some(attr.clone());
                false
            } else {
                true
            }
        });
        if let Some(marker) = marked {
            if !matches!(marker.meta, syn::Meta::Path(_)) {
                errors.push(syn::Error::new_spanned(
                    &marker,
                    "write the marker as a bare `#[fingerprint]`",
                ));
            }
            match request {
                None => request = Some(index),
                Some(_) => errors.push(syn::Error::new_spanned(
                    &marker,
                    "only one parameter can be marked `#[fingerprint]`: the request whose content the key stands for; \
                     put the fields that identify the request in one type",
                )),
            }
        }
        if is_connection(&typed.ty) {
            match tx {
                None => tx = Some(index),
                Some(_) => errors.push(syn::Error::new_spanned(
                    &typed.ty,
                    "a second transaction parameter; the body gets exactly one connection, inside the claim's transaction",
                )),
            }
        } else if is_key(&typed.ty) {
            match key {
                None => key = Some(index),
                Some(_) => errors.push(syn::Error::new_spanned(
                    &typed.ty,
                    "a second `IdempotencyKey` parameter; the operation is keyed by exactly one",
                )),
            }
        }
        let (name, destructure) = match &*typed.pat {
            Pat::Ident(ident) if ident.subpat.is_none() => (ident.ident.clone(), false),
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

    let sig_span = function.sig.ident.span();
    if tx.is_none() {
        errors.push(syn::Error::new(
            sig_span,
            format!(
                "`{fn_name}` has no transaction parameter; add `tx: &mut SqliteConnection` (or `&mut PgConnection`): \
                 the body does its business writes through it, in the claim's transaction, and the wrapper takes the engine in its place"
            ),
        ));
    }
    if key.is_none() {
        errors.push(syn::Error::new(
            sig_span,
            format!("`{fn_name}` has no key parameter; add `key: IdempotencyKey` (in an axum handler it is extracted from the `Idempotency-Key` header)"),
        ));
    }
    if request.is_none() {
        errors.push(syn::Error::new(
            sig_span,
            format!(
                "`{fn_name}` has no request parameter marked `#[fingerprint]`; mark the one parameter whose content \
                 the key stands for, e.g. `#[fingerprint] req: ChargeRequest`"
            ),
        ));
    }

    // axum runs a handler's extractors in order, and only the last may take
    // the body: a body-consuming request anywhere else is refused here, on
    // the parameter, rather than as a wall of `Handler` errors at `.route(..)`.
    // (A receiver can only come first, so the last input is the last typed one.)
    let last = function.sig.inputs.len().saturating_sub(1);
    if let Some(index) = request.filter(|&index| args.http && index != last) {
        if let (Some(FnArg::Typed(typed)), Some(extractor)) = (
            function.sig.inputs.iter().nth(index),
            params[index].as_ref().and_then(|p| body_extractor(&p.ty)),
        ) {
            errors.push(syn::Error::new_spanned(
                typed,
                format!(
                    "this `#[fingerprint]` parameter reads the request body (`{extractor}`), so it must be the \
                     handler's last parameter: axum runs extractors in order and only the last one may consume \
                     the body (`FromRequest`); every other parameter reads only the request's parts \
                     (`FromRequestParts`). Move it to the end"
                ),
            ));
        }
    }

    let scope = scope_bindings(args, &params, &fn_name, errors);

    if !errors.is_empty() {
        return None;
    }
    Some(Analysis {
        params,
        tx: tx?,
        key: key?,
        request: request?,
        scope,
    })
}

/// The checks every mode makes: an `async fn`, a scope and a step.
pub(crate) fn check_common(args: &Args, sig: &syn::Signature, errors: &mut Errors) {
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "`#[idempotent]` wraps an `async fn`: the claim and the commit are awaited around the body; write `async fn`",
        ));
    }
    if args.scope.is_none() {
        errors.push(missing(
            "scope",
            "scope = \"tenant_id\", step = \"charge-card.v1\"",
        ));
    }
    if args.step.is_none() {
        errors.push(missing(
            "step",
            "scope = \"tenant_id\", step = \"charge-card.v1\"",
        ));
    }
}

/// The bindings `scope` names, outermost first; each name that is no
/// parameter's binding is reported on its literal.
pub(crate) fn scope_bindings(
    args: &Args,
    params: &[Option<Param>],
    fn_name: &str,
    errors: &mut Errors,
) -> Vec<Ident> {
    let mut scope = Vec::new();
    for name in args.scope.iter().flatten() {
        let wanted = name.value();
        let found = params
            .iter()
            .flatten()
            .flat_map(|param| bindings(&param.pat))
            .find(|binding| *binding == wanted);
        match found {
            Some(binding) => scope.push(binding),
            None => {
                let available: Vec<String> = params
                    .iter()
                    .flatten()
                    .flat_map(|p| bindings(&p.pat))
                    .map(|b| format!("`{b}`"))
                    .collect();
                errors.push(syn::Error::new(
                    name.span(),
                    format!(
                        "`scope` names `{wanted}`, but `{fn_name}` has no parameter `{wanted}`; name one of its parameters: {}",
                        if available.is_empty() { "(none)".to_owned() } else { available.join(", ") }
                    ),
                ));
            }
        }
    }
    scope
}

/// `&mut SqliteConnection`, `&mut PgConnection`, `&mut DB::Connection`, ...
pub(crate) fn is_connection(ty: &Type) -> bool {
    match peel(ty) {
        Type::Reference(reference) if reference.mutability.is_some() => match peel(&reference.elem)
        {
            Type::Path(path) => path
                .path
                .segments
                .last()
                .is_some_and(|s| s.ident.to_string().ends_with("Connection")),
            _ => false,
        },
        _ => false,
    }
}

/// The name of the body-consuming axum extractor a type is (`Json`, `Form`,
/// `Bytes`, ...), if it is one.
pub(crate) fn body_extractor(ty: &Type) -> Option<String> {
    const BODY_EXTRACTORS: &[&str] = &[
        "Json",
        "Form",
        "Bytes",
        "String",
        "Body",
        "Request",
        "Multipart",
        "RawForm",
    ];
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let name = path.path.segments.last()?.ident.to_string();
    BODY_EXTRACTORS.contains(&name.as_str()).then_some(name)
}

/// `IdempotencyKey` or a reference to it.
pub(crate) fn is_key(ty: &Type) -> bool {
    match peel(ty) {
        Type::Reference(reference) => is_key(&reference.elem),
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "IdempotencyKey"),
        _ => false,
    }
}

/// The identifiers a pattern binds.
pub(crate) fn bindings(pat: &Pat) -> Vec<Ident> {
    let mut out = Vec::new();
    collect(pat, &mut out);
    out
}

fn collect(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(ident) => {
            out.push(ident.ident.clone());
            if let Some((_, sub)) = &ident.subpat {
                collect(sub, out);
            }
        }
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| collect(p, out)),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| collect(p, out)),
        Pat::Struct(strukt) => strukt.fields.iter().for_each(|f| collect(&f.pat, out)),
        Pat::Reference(reference) => collect(&reference.pat, out),
        Pat::Paren(paren) => collect(&paren.pat, out),
        Pat::Type(typed) => collect(&typed.pat, out),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| collect(p, out)),
        _ => {}
    }
}

/// The span of a parameter's type, for assertions about it.
pub(crate) fn type_span(ty: &Type) -> Span {
    ty.span()
}

/// Looks through the invisible groups `macro_rules!` wraps around `$t:ty`.
pub(crate) fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        _ => ty,
    }
}
