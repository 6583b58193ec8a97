//! Reading a method that `#[async_trait]` has already rewritten.
//!
//! tonic's generated service traits are `#[async_trait]` traits, and an impl
//! of one carries `#[tonic::async_trait]`. An attribute on the impl expands
//! before the attributes on its methods, so `#[idempotent(grpc)]` receives
//! the method as `async_trait` left it (as `tracing`'s `#[instrument]` does):
//!
//! ```text
//! fn charge<'life0, 'life1, 'async_trait>(&'life0 self, request: Request<M>, tx: &'life1 mut PgConnection)
//!     -> Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>
//! where 'life0: 'async_trait, 'life1: 'async_trait, Self: 'async_trait
//! { Box::pin(async move { let __self = self; let request = request; /* the body, `self` as `__self` */ }) }
//! ```
//!
//! [`unbox`] turns that back into `async fn charge(&self, ..) -> R { .. }`,
//! the body being the async block (which re-binds `__self` and the
//! parameters itself), so one path reads both spellings.

use syn::{
    Expr, GenericArgument, GenericParam, PathArguments, ReturnType, Stmt, Type, TypeParamBound,
};

/// Undoes `async_trait`'s rewriting of `function`, if it has one.
pub(crate) fn unbox(function: &mut syn::ItemFn) {
    if function.sig.asyncness.is_some() {
        return;
    }
    let (Some(output), Some(block)) = (
        boxed_output(&function.sig.output),
        boxed_body(&function.block),
    ) else {
        return;
    };
    let sig = &mut function.sig;
    sig.asyncness = Some(syn::Token![async](sig.fn_token.span));
    sig.output = ReturnType::Type(Default::default(), Box::new(output));
    *function.block = block;
    // The lifetimes `async_trait` added, and the bounds it put on them.
    let added = |lifetime: &syn::Lifetime| {
        let name = lifetime.ident.to_string();
        name == "async_trait"
            || name
                .strip_prefix("life")
                .is_some_and(|n| n.parse::<u32>().is_ok())
    };
    let params = std::mem::take(&mut sig.generics.params);
    sig.generics.params = params
        .into_iter()
        .filter(|param| !matches!(param, GenericParam::Lifetime(def) if added(&def.lifetime)))
        .collect();
    if let Some(where_clause) = &mut sig.generics.where_clause {
        let predicates = std::mem::take(&mut where_clause.predicates);
        where_clause.predicates = predicates
            .into_iter()
            .filter(|predicate| match predicate {
                syn::WherePredicate::Lifetime(bound) => !added(&bound.lifetime),
                syn::WherePredicate::Type(bound) => !bound
                    .bounds
                    .iter()
                    .any(|b| matches!(b, TypeParamBound::Lifetime(l) if added(l))),
                _ => true,
            })
            .collect();
        if where_clause.predicates.is_empty() {
            sig.generics.where_clause = None;
        }
    }
    if sig.generics.params.is_empty() {
        sig.generics.lt_token = None;
        sig.generics.gt_token = None;
    }
}

/// `R` in `Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>`.
fn boxed_output(output: &ReturnType) -> Option<Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pin = single_argument(ty, "Pin")?;
    let Type::TraitObject(object) = single_argument(pin, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(future) = bound else {
            return None;
        };
        let segment = future.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &segment.arguments else {
            return None;
        };
        (segment.ident == "Future").then_some(())?;
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(output) if output.ident == "Output" => {
                Some(output.ty.clone())
            }
            _ => None,
        })
    })
}

/// The `T` of `Name<T>`.
fn single_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else { return None };
    let segment = path.path.segments.last()?;
    if segment.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(inner) if args.args.len() == 1 => Some(inner),
        _ => None,
    }
}

/// The block of `Box::pin(async move { .. })`, the body's only statement.
fn boxed_body(block: &syn::Block) -> Option<syn::Block> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let mut segments = func.path.segments.iter().rev();
    if segments.next()?.ident != "pin" || segments.next()?.ident != "Box" {
        return None;
    }
    match call.args.first()? {
        Expr::Async(inner) if call.args.len() == 1 && inner.capture.is_some() => {
            Some(inner.block.clone())
        }
        _ => None,
    }
}
