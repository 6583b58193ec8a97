//! Emitting the canonical encoding: fields in ascending name order (sorted
//! here, at compile time), `write_field` (which leaves out a `None`),
//! `begin_variant` for enums, skipped fields never mentioned. Names become
//! labels in `const` blocks (`attr` has refused labels that collide).

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::{DeriveInput, Member, Type};

use super::attr::{FieldSet, Shape, Style};

pub(crate) fn implementation(input: &DeriveInput, shape: &Shape) -> TokenStream {
    let hasher = Ident::new("hasher", Span::mixed_site());
    let body = match shape {
        Shape::Struct(set) => {
            let writes = writes(set, &hasher, |member| quote!(&self.#member));
            quote! {
                #hasher.begin_struct();
                #writes
                #hasher.end_struct();
            }
        }
        Shape::Enum(variants) if variants.is_empty() => quote!(match *self {}),
        Shape::Enum(variants) => {
            let arms = variants.iter().map(|(variant, set)| {
                let bind = |member: &Member| match member {
                    Member::Named(ident) => {
                        format_ident!("__idem_{}", ident.to_string().trim_start_matches("r#"))
                    }
                    Member::Unnamed(index) => format_ident!("__idem_{}", index.index),
                };
                let pattern = match set.style {
                    Style::Named => {
                        let pairs = set.members.iter().map(|m| {
                            let b = bind(m);
                            quote!(#m: #b)
                        });
                        quote!(Self::#variant { #(#pairs),* })
                    }
                    Style::Tuple => {
                        let binds = set.members.iter().map(bind);
                        quote!(Self::#variant(#(#binds),*))
                    }
                    Style::Unit => quote!(Self::#variant),
                };
                // Skipped fields are bound but never read; say so to the lint.
                let writes = writes(set, &hasher, |member| {
                    let b = bind(member);
                    quote!(#b)
                });
                let label = label(&variant.unraw().to_string());
                quote! {
                    #[allow(unused_variables)]
                    #pattern => {
                        #hasher.begin_variant(#label);
                        #hasher.begin_struct();
                        #writes
                        #hasher.end_struct();
                    }
                }
            });
            quote!(match self { #(#arms)* })
        }
    };
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let bounds = bounds(input, shape);
    let where_clause = match (where_clause, bounds.is_empty()) {
        (None, true) => quote!(),
        (None, false) => quote!(where #(#bounds,)*),
        (Some(existing), _) => {
            let predicates = &existing.predicates;
            quote!(where #predicates, #(#bounds,)*)
        }
    };
    quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::idem::__private::Fingerprint for #name #ty_generics #where_clause {
                fn fingerprint(&self, #hasher: &mut ::idem::__private::FingerprintHasher) {
                    #body
                }
            }
        };
    }
}

/// The `write_field` calls for one struct or variant, already sorted by name.
fn writes(set: &FieldSet, hasher: &Ident, access: impl Fn(&Member) -> TokenStream) -> TokenStream {
    set.fields
        .iter()
        .map(|field| {
            let label = label(&field.name);
            let value = access(&field.member);
            match &field.with {
                None => quote!(#hasher.write_field(#label, #value);),
                Some(with) => quote!(#hasher.write_field_with(#label, #value, #with);),
            }
        })
        .collect()
}

/// A name's label, computed at compile time.
fn label(name: &str) -> TokenStream {
    quote!(const { ::idem::__private::Label::new(#name) })
}

/// `FieldType: Fingerprint` for every counted field whose type mentions a
/// type parameter (as serde does), so `Wrapper<T>` needs `T: Fingerprint`
/// only where it is hashed.
fn bounds(input: &DeriveInput, shape: &Shape) -> Vec<TokenStream> {
    let params: Vec<&Ident> = input.generics.type_params().map(|p| &p.ident).collect();
    if params.is_empty() {
        return Vec::new();
    }
    let sets: Vec<&FieldSet> = match shape {
        Shape::Struct(set) => vec![set],
        Shape::Enum(variants) => variants.iter().map(|(_, set)| set).collect(),
    };
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for field in sets.iter().flat_map(|set| &set.fields) {
        if field.with.is_some() || !mentions(&field.ty, &params) {
            continue;
        }
        let ty = &field.ty;
        let key = quote!(#ty).to_string();
        if !seen.contains(&key) {
            seen.push(key);
            out.push(quote!(#ty: ::idem::__private::Fingerprint));
        }
    }
    out
}

fn mentions(ty: &Type, params: &[&Ident]) -> bool {
    fn walk(tokens: TokenStream, params: &[&Ident]) -> bool {
        tokens.into_iter().any(|token| match token {
            proc_macro2::TokenTree::Ident(ident) => params.iter().any(|p| **p == ident),
            proc_macro2::TokenTree::Group(group) => walk(group.stream(), params),
            _ => false,
        })
    }
    walk(quote!(#ty), params)
}

/// What is emitted after an error: an impl with no body of note, so that the
/// derive's errors are the only ones the user sees.
pub(crate) fn fallback(input: &DeriveInput) -> TokenStream {
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        const _: () = {
            impl #impl_generics ::idem::__private::Fingerprint for #name #ty_generics #where_clause {
                fn fingerprint(&self, _: &mut ::idem::__private::FingerprintHasher) {
                    ::idem::__private::core::unreachable!()
                }
            }
        };
    }
}
